"""Which filesystem a catalog lies on (from the mount table), and the warning for a
writable SQLite catalog on a network filesystem.

SQLite's file locks are unreliable on network filesystems and WAL mode needs
memory shared by every process (the ``-shm`` file mapped by each), which
processes on different hosts do not share: a catalog written there from
several hosts can be corrupted, and even one host may see stale pages. The
mount point of a path is the longest mount point in ``/proc/self/mountinfo``
(``MOUNTINFO``, replaceable for tests) that contains the path's real
directory; its filesystem type says whether it is a network one.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from shardcat.errors import NetworkFilesystemWarning

__all__ = [
    "MOUNTINFO",
    "NETWORK_TYPES",
    "Mount",
    "is_network",
    "mount_of",
    "parse_mountinfo",
    "warn_if_network",
]

MOUNTINFO = "/proc/self/mountinfo"

# Filesystem types (the mount table's spelling) on which several hosts share files.
NETWORK_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ncpfs",
        "afs",
        "coda",
        "lustre",
        "gpfs",
        "ceph",
        "9p",
        "glusterfs",
        "beegfs",
        "orangefs",
        "pvfs2",
        "panfs",
        "gfs2",
        "ocfs2",
        "fuse",  # FUSE filesystems: sshfs, s3fs, HDFS-FUSE, gcsfuse, ... (fuse.<name>)
    }
)

_ESCAPE = re.compile(r"\\([0-7]{3})")

# Catalogs warned about in this process (each once).
_warned: set[str] = set()


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    """A mount table field with its octal escapes (``\\040`` for a space) decoded."""
    return _ESCAPE.sub(lambda m: chr(int(m[1], 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a ``mountinfo`` text, in table order (later ones mounted over
    earlier ones). Lines it cannot read are skipped."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if not sep or len(fields) < 5 or not after:
            continue
        source = _unescape(after[1]) if len(after) > 1 else ""
        mounts.append(Mount(_unescape(fields[4]), after[0], source))
    return mounts


def _contains(point: str, path: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def mount_of(path: str | os.PathLike[str], mountinfo: str | None = None) -> Mount | None:
    """The mount holding ``path`` (its nearest existing directory, symlinks
    resolved); None when the mount table cannot be read."""
    directory = Path(path).absolute()
    while not directory.is_dir() and directory != directory.parent:
        directory = directory.parent
    real = os.path.realpath(directory)
    try:
        with open(mountinfo or MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
            mounts = parse_mountinfo(f.read())
    except OSError:
        return None
    best: Mount | None = None
    for mount in mounts:  # the longest mount point wins; the last one mounted at it
        if _contains(mount.point, real) and (best is None or len(mount.point) >= len(best.point)):
            best = mount
    return best


def is_network(fstype: str) -> bool:
    """Whether a filesystem type is a network (or FUSE) one."""
    return fstype in NETWORK_TYPES or fstype.partition(".")[0] in NETWORK_TYPES


def warn_if_network(path: Path) -> None:
    """Warn (:class:`NetworkFilesystemWarning`, once per catalog and process) when the
    SQLite catalog ``path``, opened for writing, lies on a network filesystem."""
    key = str(path)
    if key in _warned:
        return
    mount = mount_of(path)
    if mount is None or not is_network(mount.fstype):
        return
    _warned.add(key)
    warnings.warn(
        NetworkFilesystemWarning(
            f"catalog {path} is on a network filesystem ({mount.fstype} mounted at "
            f"{mount.point}), where SQLite's locks and WAL are not safe for writers on "
            "several hosts. Use a catalog server instead (Catalog('postgresql://HOST/DB'), "
            "--catalog postgresql://HOST/DB), or ingest into a catalog on local disk and "
            "publish it here with `catalog snapshot DATASET -o FILE` (Catalog.snapshot), "
            "for readers that open it with immutable=True (--immutable)"
        ),
        stacklevel=4,  # (Store.__init__, Catalog.__init__) the code that opened the catalog
    )
