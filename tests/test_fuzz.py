"""Damaged shards of every format and compression: a reader returns the record's
bytes or a ``ShardcatError``, never other bytes and never another exception.

A seeded random loop per format x compression writes a small valid shard with
the project's own writers, damages it (one byte flipped, truncated at a random
point, a TFRecord length / RecordIO length word / tar size field overwritten
with a huge or wrong value, octal and base-256), ingests it into a fresh
catalog and reads every key back (``get_many(keys, raw=True)``, ``get_raw``,
``reader[key]``). Compressed shards are damaged either in their decompressed
content (then compressed again: the damage is where a length field is) or in
the compressed bytes themselves. A quarter of the cases damage the shard
*after* it was indexed, in place (same size, mtime put back), so the reader
meets bytes the scan never saw.

The rules checked for every outcome:

- an ingest refused is a ``ShardcatError`` whose message names the shard;
- a read error is a ``ShardcatError``; a ``CorruptRecordError`` names the
  shard's path and a byte offset;
- bytes read are the original record's, except for a record whose own bytes
  were damaged in a format with no payload checksum (tar, RecordIO; TFRecord
  only when read without ``verify_crc``, after the damage slipped past ingest).

Any exception that is not a ``ShardcatError`` fails the test, whichever module
raised it. Each format x compression runs twice: the fixed regression seed
(``REGRESSION_SEED``, 30 cases, the same every run) and a seed drawn for this run
(``SHARDCAT_FUZZ_ITERATIONS`` cases, default 15, or as many as fit in
``SHARDCAT_FUZZ_SECONDS`` when that is set: the longer run). A failure prints the
seed and the line that replays it (``SHARDCAT_FUZZ_SEED=<seed>``).
``pytest -s`` prints the counts.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import random
import re
import shutil
import struct
import tarfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from shardcat import (
    Catalog,
    CorruptRecordError,
    IngestError,
    Reader,
    ShardcatError,
    TFRecordWriter,
    make_example,
)
from shardcat.formats.recordio import MAGIC, IRHeader, RecordIOWriter, idx_path_for, pack
from shardcat.formats.tfrecord import masked_crc
from shardcat.pb2 import Example
from shardcat.testing.required import need

FORMATS = ("tfrecord", "tar", "recordio")
COMPRESSIONS = ("none", "gzip", "bz2", "xz")
REGRESSION_SEED, REGRESSION_ITERATIONS = 20240611, 30
# this run's seed: SHARDCAT_FUZZ_SEED replays one
RANDOM_SEED = int(os.environ.get("SHARDCAT_FUZZ_SEED") or random.SystemRandom().randrange(10**8))
ITERATIONS = int(os.environ.get("SHARDCAT_FUZZ_ITERATIONS", "15"))
SECONDS = float(os.environ.get("SHARDCAT_FUZZ_SECONDS", "0"))
# Formats whose records carry no checksum of their own: damaged payload bytes are
# returned as they are on disk.
UNCHECKED = frozenset({"tar", "recordio"})
_COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "none": lambda data: data,
    "gzip": lambda data: gzip.compress(data, mtime=0),
    "bz2": bz2.compress,
    "xz": lzma.compress,
}
_SUFFIX = {"tfrecord": ".tfrecord", "tar": ".tar", "recordio": ".rec"}
_ZSUFFIX = {"none": "", "gzip": ".gz", "bz2": ".bz2", "xz": ".xz"}


@dataclass
class Shard:
    """A valid shard's (decompressed) bytes and what a reader should return."""

    fmt: str
    data: bytes
    records: dict[str, Any]  # key -> raw record (bytes; {feature: bytes} for tar)
    spans: dict[str, list[tuple[int, int]]]  # key -> byte ranges of its frames/members
    fields: list[tuple[int, str]]  # (offset, kind) of each length or size field
    idx: str | None = None  # RecordIO: the .idx beside the .rec


_FINGERPRINT = 64 << 10
FILLER = 70_000  # more than the 64 KiB a reader fingerprints at each end of a shard


def _payload(rng: random.Random) -> bytes:
    n = rng.choice([0, 1, 5, 40, 300, 700, 2000])
    return bytes(rng.choice(b"abcdefgh\0\xff") for _ in range(n))


def _payloads(rng: random.Random, filler: bool) -> list[bytes]:
    """A few small payloads; with ``filler`` between two incompressible ones of
    ``FILLER`` bytes, so that the small ones lie where damage made after ingest is
    not noticed by the reader's fingerprint (which covers a shard's ends)."""
    small = [_payload(rng) for _ in range(rng.randint(1, 5))]
    return [rng.randbytes(FILLER), *small, rng.randbytes(FILLER)] if filler else small


def make_tfrecord(tmp: Path, rng: random.Random, filler: bool) -> Shard:
    path = tmp / "src.tfrecord"
    records: dict[str, Any] = {}
    spans = {}
    fields = []
    with TFRecordWriter(path) as w:
        for i, payload in enumerate(_payloads(rng, filler)):
            key = f"k{i}"
            raw = make_example({"key": key, "data": payload, "label": i}).SerializeToString()
            offset = w.write(raw)
            records[key] = raw
            spans[key] = [(offset, offset + 16 + len(raw))]
            fields.append((offset, "tfrecord-length"))
    return Shard("tfrecord", path.read_bytes(), records, spans, fields)


def make_recordio(tmp: Path, rng: random.Random, filler: bool) -> Shard:
    path = tmp / "src.rec"
    records: dict[str, Any] = {}
    offsets = []
    with RecordIOWriter(path) as w:
        for i, data in enumerate(_payloads(rng, filler)):
            if rng.random() < 0.3:  # an aligned magic word: a multi-part record
                data = b"abcd" + struct.pack("<I", MAGIC) + data
            raw = pack(IRHeader(0, float(i), i, 0), data)
            key = f"r{i}"
            offsets.append((key, w.write(raw, key)))
            records[key] = raw
    data = path.read_bytes()
    spans = {}
    fields = []
    ends = [o for _, o in offsets[1:]] + [len(data)]
    for (key, start), end in zip(offsets, ends, strict=True):
        spans[key] = [(start, end)]
        pos = start
        while pos < end:  # every frame's length word
            fields.append((pos + 4, "recordio-lrecord"))
            (lrecord,) = struct.unpack_from("<I", data, pos + 4)
            pos += 8 + ((lrecord & ((1 << 29) - 1)) + 3) // 4 * 4
    idx = (tmp / "src.idx").read_text()
    return Shard("recordio", data, records, spans, fields, idx)


def make_tar(tmp: Path, rng: random.Random, filler: bool) -> Shard:
    del tmp  # written by tarfile in memory
    buf = io.BytesIO()
    records: dict[str, Any] = {}
    fmt = rng.choice([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for i, payload in enumerate(_payloads(rng, filler)):
            key = f"s{i:03d}"
            sample = {"bin": payload, "cls": str(i).encode()}
            if rng.random() < 0.3:
                sample["json"] = b'{"w": %d}' % i
            for feature, data in sample.items():
                info = tarfile.TarInfo(f"{key}.{feature}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            records[key] = sample
    data = buf.getvalue()
    spans: dict[str, list[tuple[int, int]]] = {k: [] for k in records}
    fields = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf.getmembers():
            key = m.name.split(".", 1)[0]
            spans[key].append((m.offset, m.offset_data + -(-m.size // 512) * 512))
            fields.append((m.offset_data - 512, "tar-size"))
    return Shard("tar", data, records, spans, fields)


MAKERS: dict[str, Callable[[Path, random.Random, bool], Shard]] = {
    "tfrecord": make_tfrecord,
    "recordio": make_recordio,
    "tar": make_tar,
}


# -- damage ----------------------------------------------------------------------


@dataclass
class Damage:
    what: str
    region: tuple[int, int] | None  # damaged decompressed bytes; None: not known


def _tar_size(value: int, base256: bool) -> bytes:
    if base256 or not 0 <= value < 8**11:
        if value < 0:
            return b"\xff" + (256**11 + value).to_bytes(11, "big")
        return b"\x80" + value.to_bytes(11, "big")
    return b"%011o\0" % value


def _tar_checksum(data: bytearray, header: int) -> None:
    block = data[header : header + 512]
    block[148:156] = b" " * 8
    data[header + 148 : header + 156] = b"%06o\0 " % sum(block)


def overwrite_field(data: bytearray, fields: list[tuple[int, str]], rng: random.Random) -> Damage:
    offset, kind = rng.choice(fields)
    n = len(data)
    if kind == "tfrecord-length":
        (old,) = struct.unpack_from("<Q", data, offset)
        huge = [2**63, 2**64 - 1, 2**40, 2**31, rng.randrange(2**64)]
        value = rng.choice([*huge, n, n * 3, old + 1, max(old - 1, 0), 0])
        struct.pack_into("<Q", data, offset, value)
        fixed = rng.random() < 0.8
        if fixed:  # a length whose CRC is right: only the bytes that follow can refute it
            struct.pack_into("<I", data, offset + 8, masked_crc(bytes(data[offset : offset + 8])))
        return Damage(f"{kind}@{offset}={value}{' crc-ok' if fixed else ''}", (offset, offset + 12))
    if kind == "recordio-lrecord":
        (old,) = struct.unpack_from("<I", data, offset)
        cflag = old >> 29 if rng.random() < 0.8 else rng.randrange(8)
        was = old & 0x1FFFFFFF
        length = rng.choice(
            [(1 << 29) - 1, rng.randrange(1 << 29), n, n * 3, was + 1, was + 4, max(was - 1, 0), 0]
        )
        value = cflag << 29 | length
        struct.pack_into("<I", data, offset, value)
        # a new framing: every record from here on may be cut differently
        return Damage(f"{kind}@{offset}=0x{value:08x}", (offset, 1 << 62))
    header = offset
    old = int(data[header + 124 : header + 136].split(b"\0", 1)[0].strip() or b"0", 8)
    huge = [2**63, 2**80, 8**11 - 1, 8**11, rng.randrange(2**88)]
    value = rng.choice([*huge, n * 4, old + 1, old + 512, max(old - 1, 0), 0, -1])
    base256 = rng.random() < 0.5
    data[header + 124 : header + 136] = _tar_size(value, base256)
    fixed = rng.random() < 0.9
    if fixed:
        _tar_checksum(data, header)
    spelled = "base-256" if base256 or not 0 <= value < 8**11 else "octal"
    return Damage(
        f"tar-size@{header + 124}={value} ({spelled}{', checksum ok' if fixed else ''})",
        (header, 1 << 62),  # a new framing: later samples may lose or gain members
    )


def damage_bytes(
    data: bytearray, rng: random.Random, shard: Shard | None, after: bool = False
) -> Damage:
    """Damage ``data`` in place: flip a byte, truncate it, or (given the ``shard``
    it holds) overwrite a length field. ``after``: keep the size, and keep off the
    64 KiB at each end that a reader fingerprints."""
    low, high = (_FINGERPRINT, len(data) - _FINGERPRINT) if after else (0, len(data))
    if high <= low:
        return Damage("none (too small)", (0, 0))
    fields = [] if shard is None else [f for f in shard.fields if low <= f[0] < high - 12]
    how = rng.choice(
        ["flip", "flip"] + ([] if after else ["truncate"]) + ["field"] * 2 * bool(fields)
    )
    if how == "flip":
        pos = rng.randrange(low, high)
        mask = rng.randrange(1, 256)
        data[pos] ^= mask
        return Damage(f"flip@{pos}^0x{mask:02x}", (pos, pos + 1))
    if how == "truncate":
        cut = rng.randrange(len(data))
        del data[cut:]
        return Damage(f"truncate@{cut}", (cut, 1 << 62))
    return overwrite_field(data, fields, rng)


# -- outcomes --------------------------------------------------------------------


@dataclass
class Case:
    fmt: str
    compression: str
    seed: int
    phase: str = "before"
    damage: str = ""


@dataclass
class Violation:
    case: Case
    what: str

    def __str__(self) -> str:
        c = self.case
        return f"[{c.fmt}/{c.compression} case seed={c.seed} {c.phase} {c.damage}] {self.what}"


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    problems: Counter[str] = field(default_factory=Counter)  # why, for ingest and reads
    violations: list[Violation] = field(default_factory=list)


def _problem(message: str) -> str:
    """A message without its path, offsets and numbers: what kind of problem it is."""
    text = message.rsplit(": at byte ", 1)[-1].split(": ", 1)[-1]
    return re.sub(r"\d+", "N", text.split(" (", 1)[0].split(":", 1)[0])[:60]


def _exception(case: Case, tally: Tally, where: str, exc: BaseException) -> None:
    """Any exception but a ShardcatError, from whichever module: a violation."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-4:])
    what = f"{where}: {type(exc).__module__}.{type(exc).__name__}: {exc}\n{tb}"
    tally.violations.append(Violation(case, what))


def _overlaps(spans: list[tuple[int, int]], region: tuple[int, int] | None) -> bool:
    if region is None:
        return True
    return any(start < region[1] and region[0] < end for start, end in spans)


def _same(fmt: str, got: Any, want: Any, decoded: bool) -> bool:
    if decoded and fmt == "tfrecord":
        return isinstance(got, Example) and got == Example.FromString(want)
    if fmt == "tar":
        return isinstance(got, dict) and got == want
    return isinstance(got, bytes) and bytes(got) == want


def check_value(
    case: Case,
    tally: Tally,
    shard: Shard,
    damage: Damage,
    key: str,
    got: Any,
    decoded: bool,
    verified: bool,
) -> None:
    want = shard.records.get(key)
    if want is not None and _same(shard.fmt, got, want, decoded):
        tally.counts["read equal"] += 1
        return
    if want is None or _overlaps(shard.spans[key], damage.region):
        if shard.fmt in UNCHECKED:
            tally.counts["read differing inside damaged record"] += 1
            return
        if case.phase == "after" and not verified:  # TFRecord read without verify_crc
            tally.counts["read differing, CRC not checked"] += 1
            return
    tally.violations.append(
        Violation(case, f"key {key!r}: wrong bytes {str(got)[:120]} (want {str(want)[:120]})")
    )


def check_error(case: Case, tally: Tally, path: Path, exc: ShardcatError, what: str) -> None:
    tally.counts[what] += 1
    tally.problems[f"read: {type(exc).__name__}: {_problem(str(exc))}"] += 1
    if isinstance(exc, CorruptRecordError):
        if exc.path not in (str(path), idx_path_for(path)) or exc.offset < 0:
            tally.violations.append(Violation(case, f"error without path/offset: {exc!r}", ""))
    elif getattr(exc, "path", None) not in (None, str(path)):
        tally.violations.append(Violation(case, f"error naming another file: {exc!r}", ""))


def read_back(
    case: Case, tally: Tally, shard: Shard, damage: Damage, path: Path, reader: Reader
) -> None:
    keys = reader.get_keys()
    try:
        batch = reader.get_many(keys, raw=True)
    except ShardcatError as exc:
        check_error(case, tally, path, exc, "read error (get_many)")
    except Exception as exc:
        _exception(case, tally, "get_many", exc)
    else:
        for key, got in zip(keys, batch, strict=True):
            check_value(case, tally, shard, damage, key, got, False, reader.verify_crc)
    for key in keys:
        for name, call, decoded in (
            ("get_raw", reader.get_raw, False),
            ("reader[key]", reader.__getitem__, True),
        ):
            try:
                got = call(key)
            except ShardcatError as exc:
                check_error(case, tally, path, exc, "read error")
            except Exception as exc:
                _exception(case, tally, f"{name}({key!r})", exc)
            else:
                check_value(case, tally, shard, damage, key, got, decoded, reader.verify_crc)


def ingest(case: Case, tally: Tally, path: Path, cat: Catalog) -> Reader | None:
    try:
        return cat.ingest(path, "d", format=case.fmt)
    except IngestError as exc:
        tally.counts["ingest refused"] += 1
        messages = [str(f.error) for f in exc.failures]
        tally.problems.update(f"ingest: {_problem(m)}" for m in messages)
        if not messages or not all(str(path) in m for m in messages):
            tally.violations.append(Violation(case, f"refusal without the path: {messages}", ""))
    except ShardcatError as exc:  # a CatalogError before any scan (format detection...)
        tally.counts["ingest refused"] += 1
        tally.problems[f"ingest: {type(exc).__name__}: {_problem(str(exc))}"] += 1
        if str(path) not in str(exc):
            tally.violations.append(Violation(case, f"refusal without the path: {exc}", ""))
    except Exception as exc:
        _exception(case, tally, "ingest", exc)
    return None


def run_case(case: Case, tally: Tally, tmp: Path) -> None:
    rng = random.Random(case.seed)
    case.phase = "after" if rng.random() < 0.25 else "before"
    shard = MAKERS[case.fmt](tmp, rng, case.phase == "after")
    path = tmp / f"shard{_SUFFIX[case.fmt]}{_ZSUFFIX[case.compression]}"
    if shard.idx is not None:
        (tmp / "shard.idx").write_text(shard.idx)
    compress = _COMPRESS[case.compression]
    content = bytearray(shard.data)
    damage = Damage("none", (0, 0))
    if case.phase == "after":
        path.write_bytes(compress(bytes(content)))
    elif case.compression == "none" or rng.random() < 0.6:
        damage = damage_bytes(content, rng, shard)
        path.write_bytes(compress(bytes(content)))
    else:  # the compressed bytes themselves
        packed = bytearray(compress(bytes(content)))
        damage = damage_bytes(packed, rng, None)
        damage = Damage("compressed " + damage.what, None)
        path.write_bytes(packed)
    case.damage = damage.what
    with Catalog(tmp / "c.sqlite") as cat:
        reader = ingest(case, tally, path, cat)
        if reader is None:
            return
        with reader:
            if case.phase == "after":
                st = path.stat()
                on_disk = bytearray(path.read_bytes())
                plain = case.compression == "none"
                damage = damage_bytes(on_disk, rng, shard if plain else None, after=True)
                if not plain:
                    damage = Damage("compressed " + damage.what, None)
                case.damage = damage.what
                path.write_bytes(on_disk)
                os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
                tally.counts["damaged after ingest"] += 1
            else:
                tally.counts["ingested"] += 1
            read_back(case, tally, shard, damage, path, reader)
            if case.phase == "after" and case.fmt == "tfrecord":
                with cat.dataset("d", verify_crc=True) as checked:
                    read_back(case, tally, shard, damage, path, checked)


def case_seed(base: int, fmt: str, compression: str, n: int) -> int:
    """The seed of case ``n`` of a format x compression in the run of seed ``base``
    (rerun one case with :func:`replay`)."""
    return (base * 100 + FORMATS.index(fmt) * 10 + COMPRESSIONS.index(compression)) * 10**6 + n


def replay(fmt: str, compression: str, seed: int, tmp: Path) -> Tally:
    """Run one case again (for a failure report: ``replay("tar", "gzip", seed, dir)``)."""
    tally = Tally()
    run_case(Case(fmt, compression, seed), tally, tmp)
    return tally


@pytest.mark.parametrize("run", ["regression", "random"])
@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_shards(tmp_path: Path, fmt: str, compression: str, run: str) -> None:
    if compression != "none":
        need("indexed_gzip", "indexed_bzip2", "xz", why="shardcat[compressed]")
    base = REGRESSION_SEED if run == "regression" else RANDOM_SEED
    iterations = REGRESSION_ITERATIONS if run == "regression" else ITERATIONS
    longer = run == "random" and SECONDS > 0
    tally = Tally()
    deadline = time.monotonic() + SECONDS
    n = 0
    while (time.monotonic() < deadline) if longer else (n < iterations):
        tmp = tmp_path / str(n)
        tmp.mkdir()
        run_case(Case(fmt, compression, case_seed(base, fmt, compression, n)), tally, tmp)
        shutil.rmtree(tmp)
        n += 1
    tally.counts["iterations"] = n
    summary = ", ".join(f"{k} {v}" for k, v in sorted(tally.counts.items()))
    print(f"\nfuzz {fmt}/{compression} seed {base}: {summary}; violations {len(tally.violations)}")
    for problem, count in tally.problems.most_common(10):
        print(f"  {count:5d} {problem}")
    again = f"SHARDCAT_FUZZ_SEED={base} " * (run == "random")
    assert not tally.violations, (
        f"{len(tally.violations)} violations with seed {base} (replay: {again}"
        f"pytest tests/test_fuzz.py -k '{fmt}-{compression}-{run}'):\n"
        + "\n".join(map(str, tally.violations[:10]))
    )
    assert tally.counts["read equal"] + tally.counts["ingest refused"] > 0
