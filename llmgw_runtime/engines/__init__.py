"""Engines: drivers that turn an assignment into an engine process command line."""

from .base import EngineDriver, LaunchSpec, cuda_visible_devices, engine_env, resolve_source
from .drivers import LAUNCHER_MODULE, LlamaCppDriver, VllmDriver, drivers_from_config

__all__ = ["LAUNCHER_MODULE", "EngineDriver", "LaunchSpec", "LlamaCppDriver", "VllmDriver",
           "cuda_visible_devices", "drivers_from_config", "engine_env", "resolve_source"]
