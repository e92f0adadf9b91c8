"""The node agent: discovers devices, supervises engines, reports to the control service."""

from .client import ControlClient, ControlError
from .config import AgentConfig, load_config
from .loop import Agent, run
from .supervisor import Replica, Supervisor

__all__ = ["Agent", "AgentConfig", "ControlClient", "ControlError", "Replica", "Supervisor",
           "load_config", "run"]
