"""Shards with one record damaged past the fingerprint's 64 KiB head and tail, and
the assertion that every read path refuses it (issue 26: every read checked)."""

from __future__ import annotations

import random
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from damage import flip_keeping_mtime

from shardcat import CorruptRecordError
from shardcat.formats.recordio import RecordIOWriter
from shardcat.formats.tfrecord import HEADER, TFRecordWriter, make_example
from shardcat.readers.torch import RecordDataset

N, SIZE, BAD = 40, 8000, 20  # 40 records of 8 KB: record 20 sits mid-file, past 64 KiB


@dataclass
class Damaged:
    """A shard whose record ``key`` (at byte ``offset``, the offset errors name) had
    its payload byte at ``flip`` changed; ``good``/``bad``: its raw bytes before/after
    (``{feature: bytes}`` for tar)."""

    kind: str
    path: Path | str  # a URL for remote shards
    key: str
    offset: int
    flip: int
    good: Any
    bad: Any = None
    feature: str = "image"

    def damage(self) -> None:
        flip_keeping_mtime(self.path, self.flip)


def _payload(i: int) -> bytes:
    return random.Random(i).randbytes(SIZE)


def write(kind: str, directory: Path) -> Damaged:
    """One shard of ``kind`` (tfrecord, tar, recordio) in ``directory``, not damaged yet."""
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "tfrecord":
        path = directory / "d.tfrecord"
        with TFRecordWriter(path) as w:
            offsets = [
                w.write(make_example({"key": f"r{i}", "image": _payload(i)})) for i in range(N)
            ]
        raw = make_example({"key": f"r{BAD}", "image": _payload(BAD)}).SerializeToString()
        flip = offsets[BAD] + HEADER + raw.index(_payload(BAD)) + 100
        return Damaged(kind, path, f"r{BAD}", offsets[BAD], flip, raw)
    if kind == "tar":
        path = directory / "d.tar"
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
            for i in range(N):
                for ext, data in (("image", _payload(i)), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"s{i:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, __import__("io").BytesIO(data))
        with tarfile.open(path) as tar:
            at = tar.getmember(f"s{BAD:04d}.image").offset_data
        good = {"image": _payload(BAD), "cls": str(BAD).encode()}
        return Damaged(kind, path, f"s{BAD:04d}", at, at + 100, good)
    path = directory / "d.rec"
    with RecordIOWriter(path) as w:
        offsets = [w.write(_payload(i), key=f"k{i}") for i in range(N)]
    return Damaged(kind, path, f"k{BAD}", offsets[BAD], offsets[BAD] + 8 + 100, _payload(BAD))


def _refused(read: Callable[[], Any], d: Damaged, what: str, by_check: bool) -> None:
    with pytest.raises(CorruptRecordError) as err:
        read()
    assert (err.value.path, err.value.offset) == (str(d.path), d.offset), what
    if by_check:  # else the record's framing refused it first (RecordIO's magic)
        message = f"record {d.key!r}: the bytes read are not the record the catalog indexed"
        assert message in str(err.value), what


def every_read_refuses(
    reader: Any, d: Damaged, position: int = BAD, *, by_check: bool = True
) -> None:
    """Every read path of ``reader`` raises the CorruptRecordError naming the damaged
    record's shard, offset and key (``by_check``: the stored check refused it, else
    its framing), and reads the records around it as indexed."""
    paths: dict[str, Callable[[], Any]] = {
        "get_record": lambda: reader.get_record(d.key),
        "get_raw": lambda: reader.get_raw(d.key),
        "getitem": lambda: reader[d.key],
        "get_feature": lambda: reader.get_feature(d.key, d.feature),
        "get_many": lambda: (
            reader.get_many([f"{d.key[0]}{0 if d.kind != 'tar' else ''}", d.key])
            if d.kind != "tar"
            else reader.get_many(["s0000", d.key])
        ),
        "get_many_at": lambda: reader.get_many_at([0, position]),
        "get_many_at slice": lambda: reader.get_many_at(slice(position - 1, position + 2)),
        "get_record_at": lambda: reader.get_record_at(position),
        "dataset item": lambda: RecordDataset(reader)[position],
        "dataset items": lambda: RecordDataset(reader).__getitems__([1, position]),
        "dataset by key": lambda: RecordDataset(reader, keys=[d.key])[0],
        "get_dicts": lambda: reader.get_dicts([reader.key_at(0), d.key]),
        "get_dicts_at": lambda: reader.get_dicts_at([0, position]),
        # neighbours: the records around it read in one pread (a coalesced run)
        "get_dicts_at run": lambda: reader.get_dicts_at(slice(position - 1, position + 2)),
        "dataset features": lambda: RecordDataset(reader, features=[d.feature]).__getitems__(
            [position + 1, position, position - 1]
        ),
    }
    if d.kind == "tar":  # a member streamed in pieces (catalog get): checked at its end
        paths["member_chunks"] = lambda: b"".join(reader.member_chunks(d.key, d.feature))
    for what, read in paths.items():
        _refused(read, d, what, by_check)
    assert reader.get_raw(reader.key_at(position + 1)) is not None
    assert len(reader.get_many_at(slice(0, position))) == position
