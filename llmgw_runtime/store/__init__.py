"""The store: one schema on SQLite or PostgreSQL, through SQLAlchemy Core."""

from .db import Store, connect
from .failover import NotAcknowledged, StoreUnavailable

__all__ = ["NotAcknowledged", "Store", "StoreUnavailable", "connect"]
