"""The store: one schema on SQLite or PostgreSQL, through SQLAlchemy Core."""

from .db import Store, connect

__all__ = ["Store", "connect"]
