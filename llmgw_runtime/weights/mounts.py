"""Which filesystem a path lives on, read from ``/proc/self/mountinfo``, and whether it is shared.

Shared means a network or cluster filesystem whose contents every node that mounts it sees.
Only the types named here are shared; anything unknown is local. Reading a filer as local
costs one copy; reading local storage as shared would make the cluster believe a model is on
every node, so the error always goes the cheap way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SHARED_FS_TYPES = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "cifs"})

# Other names the same shared filesystems show under in mountinfo: the kernel reports a CIFS
# mount made with ``-t smb3`` as ``smb3``; Ceph's FUSE client as ``fuse.ceph-fuse`` (some
# builds ``fuse.cephfs``). BeeGFS and GPFS have no FUSE client, so no ``fuse.beegfs`` or
# ``fuse.gpfs`` is listed; every other FUSE filesystem (sshfs, s3fs, ...) stays local.
SHARED_FS_ALIASES = frozenset({"smb3", "fuse.ceph-fuse", "fuse.cephfs"})

_OCTAL = re.compile(rb"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo: where it is mounted, its filesystem type and its source."""

    mount_point: str
    fstype: str
    device: str = ""


def _unescape(field: str) -> str:
    """Decode mountinfo's octal escapes (``\\040`` space, ``\\011`` tab, ``\\012``, ``\\134``)."""
    raw = os.fsencode(field)
    return os.fsdecode(_OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), raw))


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts in ``text`` (the format of ``/proc/<pid>/mountinfo``), in file order.

    Lines that do not have the shape ``id parent major:minor root mount-point options
    [optional...] - fstype source super-options`` are skipped.
    """
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 6 or len(fields) < sep + 2:
            continue
        device = _unescape(fields[sep + 2]) if len(fields) > sep + 2 else ""
        mounts.append(Mount(mount_point=_unescape(fields[4]), fstype=fields[sep + 1],
                            device=device))
    return mounts


def _under(path: str, mount_point: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def fs_type_of(path: str | Path, mounts: Sequence[Mount]) -> str | None:
    """The filesystem type of the mount holding ``path`` (symlinks resolved), or None.

    The longest mount point that is a prefix of the resolved path wins; of mounts stacked on
    the same point, the later one (on top) wins.
    """
    resolved = os.path.realpath(os.path.expanduser(str(path)))
    best: Mount | None = None
    for mount in mounts:
        if not _under(resolved, mount.mount_point):
            continue
        if best is None or len(mount.mount_point) >= len(best.mount_point):
            best = mount
    return best.fstype if best is not None else None


def is_shared(fstype: str | None) -> bool:
    """True only for the known shared filesystem types; unknown or None is local."""
    if not fstype:
        return False
    name = fstype.lower()
    return name in SHARED_FS_TYPES or name in SHARED_FS_ALIASES


def read_mounts(path: str | Path = "/proc/self/mountinfo") -> list[Mount]:
    """The mounts of this process; empty (so everything reads as local) when unreadable."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return []
    return parse_mountinfo(text)
