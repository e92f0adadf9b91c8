"""Model weights on a node: where they are (locate), what the agent reports (scan), which
filesystem holds them (mounts), and getting them when the node has none (fetch)."""

from .fetch import Fetch, FetchError, FetchManager, pick_dest
from .locate import candidates, complete, find, resolve
from .mounts import SHARED_FS_TYPES, Mount, fs_type_of, is_shared, parse_mountinfo, read_mounts
from .scan import Scanner, scan
from .sources import Source, parse_source, redact_url

__all__ = ["SHARED_FS_TYPES", "Fetch", "FetchError", "FetchManager", "Mount", "Scanner",
           "Source", "candidates", "complete", "find", "fs_type_of", "is_shared",
           "parse_mountinfo", "parse_source", "pick_dest", "read_mounts", "redact_url",
           "resolve", "scan"]
