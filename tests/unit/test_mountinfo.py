"""Which mount holds the cache dir, read from /proc/self/mountinfo's text (proc(5))."""

from __future__ import annotations

from pathlib import Path

from sidecar.isolation.disk import DeviceInfo, device_of, mount_of

MOUNTINFO = "\n".join([
    "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw",
    "40 22 259:2 / /data rw,relatime shared:20 - xfs /dev/nvme1n1 rw",
    "41 22 259:3 / /data2 rw,relatime shared:21 - xfs /dev/nvme2n1 rw",
    r"42 22 259:4 / /mnt/cold\040cache rw,relatime shared:22 - xfs /dev/nvme3n1 rw",
    r"43 22 259:5 / /mnt/tab\011new\012back\134slash rw - ext4 /dev/sdb1 rw",
    r"44 22 259:6 / /srv/vol rw - fuse.sshfs user@host:/a\040b rw",
    "45 22 259:1 /var /var rw,relatime - ext4 /dev/nvme0n1p1 rw",
])


def test_a_mount_point_with_a_space_is_unescaped_and_matched() -> None:
    assert mount_of(MOUNTINFO, "259:4", "/mnt/cold cache/sidecar") == DeviceInfo(
        "259:4", "/dev/nvme3n1", "/mnt/cold cache")


def test_tab_newline_and_backslash_are_unescaped() -> None:
    assert mount_of(MOUNTINFO, "259:5", "/mnt/tab\tnew\nback\\slash/c") == DeviceInfo(
        "259:5", "/dev/sdb1", "/mnt/tab\tnew\nback\\slash")


def test_the_source_is_unescaped_too() -> None:
    assert mount_of(MOUNTINFO, "259:6", "/srv/vol/cache").source == "user@host:/a b"


def test_a_mount_point_matches_whole_path_components_only() -> None:
    # /data is not an ancestor of /data2/cache, even with the device numbers wrong.
    assert mount_of(MOUNTINFO.replace("259:3", "259:2"), "259:2", "/data2/cache") == DeviceInfo(
        "259:2", "/dev/nvme2n1", "/data2")
    assert mount_of(MOUNTINFO, "259:2", "/data2/cache") == DeviceInfo("259:2", "?", "?")
    assert mount_of(MOUNTINFO, "259:2", "/data").mount_point == "/data"
    assert mount_of(MOUNTINFO, "259:2", "/data/cache").mount_point == "/data"


def test_the_longest_mount_point_holding_the_path_wins() -> None:
    assert mount_of(MOUNTINFO, "259:1", "/var/cache").mount_point == "/var"
    assert mount_of(MOUNTINFO, "259:1", "/opt/cache").mount_point == "/"


def test_lines_without_the_separator_or_the_source_are_skipped() -> None:
    broken = "50 22 259:9 / /x rw shared:1\n51 22 259:9 / /x rw - ext4\n"
    assert mount_of(broken, "259:9", "/x/cache") == DeviceInfo("259:9", "?", "?")


def test_the_real_mount_of_a_directory_is_one_of_its_ancestors(tmp_path: Path) -> None:
    directory = tmp_path / "cold cache"
    directory.mkdir()
    mount = device_of(directory)
    resolved = directory.resolve()
    assert mount.mount_point != "?"
    assert Path(mount.mount_point) in (resolved, *resolved.parents)
