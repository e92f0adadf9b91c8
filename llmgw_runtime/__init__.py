"""llmgw: many LLMs on a fleet of GPU nodes behind one OpenAI-compatible endpoint."""

__version__ = "0.1.0"
