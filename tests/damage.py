"""Damaging a shard file in place as bit rot does: same size, mtime put back."""

from __future__ import annotations

import os


def flip_keeping_mtime(path: str | os.PathLike[str], at: int, mask: int = 0xFF) -> None:
    """XOR the byte at ``at`` with ``mask`` in place and put the file's mtime back
    (``touch -r``)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        original = f.read(1)
        f.seek(at)
        f.write(bytes([original[0] ^ mask]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
