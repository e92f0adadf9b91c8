from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_runtime.weights.mounts import (
    Mount,
    fs_type_of,
    is_shared,
    parse_mountinfo,
    read_mounts,
)

# Shaped like a GPU node's /proc/self/mountinfo: root on ext4, a filer on NFSv4, Lustre,
# a local disk mounted under the filer's tree at a path with a space, a container overlay.
MOUNTINFO = r"""22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
25 22 0:23 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
26 22 0:24 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
60 22 0:50 / /mnt/models rw,relatime shared:30 - nfs4 filer01:/export/models rw,vers=4.2
61 22 0:51 / /lustre/scratch rw,relatime shared:31 - lustre 10.1.0.1@o2ib:/scratch rw,flock
62 60 259:3 / /mnt/models/local\040scratch rw,relatime shared:32 - ext4 /dev/nvme1n1 rw
63 22 0:52 / /var/lib/containers/storage/overlay/3f2a/merged rw - overlay overlay rw,lowerdir=/l
64 22 0:53 / /mnt/ceph rw,relatime shared:33 - fuse.ceph-fuse ceph-fuse rw,user_id=0
65 22 0:54 / /mnt/sshfs rw,nosuid,nodev,relatime shared:34 - fuse.sshfs me@host:/data rw
66 22 0:55 / /tank/models rw,noatime shared:35 - zfs tank/models rw,xattr
67 22 0:56 / /mnt/smb rw,relatime shared:36 - cifs //nas/share rw,vers=3.1.1
this line is not mountinfo
"""


@pytest.fixture
def mounts() -> list[Mount]:
    return parse_mountinfo(MOUNTINFO)


def test_parses_every_mount_line_and_skips_garbage(mounts: list[Mount]) -> None:
    assert len(mounts) == 11
    assert mounts[0] == Mount("/", "ext4", "/dev/nvme0n1p2")
    assert mounts[3] == Mount("/mnt/models", "nfs4", "filer01:/export/models")


def test_octal_escapes_in_mount_points_are_decoded(mounts: list[Mount]) -> None:
    assert mounts[5].mount_point == "/mnt/models/local scratch"
    tab = parse_mountinfo("1 0 0:1 / /a\\011b\\134c rw - tmpfs t rw\n")
    assert tab[0].mount_point == "/a\tb\\c"


@pytest.mark.parametrize("path, fstype", [
    ("/mnt/models/qwen/q4.gguf", "nfs4"),
    ("/mnt/models", "nfs4"),
    ("/mnt/models/local scratch/q4.gguf", "ext4"),      # deeper mount wins
    ("/mnt/models/local scratchy/q4.gguf", "nfs4"),     # a prefix, but not of a path component
    ("/mnt/modelsX/q4.gguf", "ext4"),
    ("/lustre/scratch/user/m", "lustre"),
    ("/var/lib/containers/storage/overlay/3f2a/merged/srv/m.gguf", "overlay"),
    ("/home/me/m.gguf", "ext4"),
])
def test_the_longest_mount_point_holding_the_path_gives_the_type(
        mounts: list[Mount], path: str, fstype: str) -> None:
    assert fs_type_of(path, mounts) == fstype


def test_the_mount_on_top_wins_when_two_share_a_point() -> None:
    stacked = parse_mountinfo("1 0 0:1 / / rw - ext4 a rw\n2 1 0:2 / /m rw - ext4 b rw\n"
                              "3 1 0:3 / /m rw - nfs4 c:/x rw\n")
    assert fs_type_of("/m/f", stacked) == "nfs4"


def test_symlinks_are_resolved_before_looking_up_the_mount(tmp_path: Path) -> None:
    real = tmp_path / "filer"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    mounts = [Mount("/", "ext4"), Mount(str(real.resolve()), "nfs")]
    assert fs_type_of(tmp_path / "link" / "m.gguf", mounts) == "nfs"


@pytest.mark.parametrize("fstype", ["nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs",
                                    "cifs", "smb3", "fuse.ceph-fuse", "NFS4"])
def test_cluster_filesystems_are_shared(fstype: str) -> None:
    assert is_shared(fstype)


@pytest.mark.parametrize("fstype", ["ext4", "xfs", "zfs", "btrfs", "overlay", "tmpfs",
                                    "fuse.sshfs", "fuse.s3fs", "fuse.beegfs", "squashfs",
                                    "something-new", "", None])
def test_anything_unknown_is_local(fstype: str | None) -> None:
    assert not is_shared(fstype)


def test_no_mount_table_means_no_type_and_local() -> None:
    assert fs_type_of("/mnt/models/m.gguf", []) is None
    assert not is_shared(fs_type_of("/mnt/models/m.gguf", []))


def test_read_mounts_reads_this_process_and_survives_a_missing_file(tmp_path: Path) -> None:
    mine = read_mounts()
    assert any(m.mount_point == "/" for m in mine)
    assert read_mounts(tmp_path / "missing") == []
    sample = tmp_path / "mountinfo"
    sample.write_text(MOUNTINFO)
    assert read_mounts(sample) == parse_mountinfo(MOUNTINFO)
