"""The native RecordIO frame walk and tar header walk against the pure-Python
reference: the same Columns (every list) or the same error (type, message,
offset) on files from shardcat's writers, GNU tar and Python's tarfile (ustar,
GNU, pax, sparse), for every option and grouping rule, on damaged files, and on
random mutations of valid files; ``SHARDCAT_NATIVE=0`` turns both off."""

from __future__ import annotations

import io
import os
import random
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardcat.errors import CatalogError, CorruptRecordError
from shardcat.formats import native
from shardcat.formats.base import Columns, Format
from shardcat.formats.recordio import IRHeader, RecordIOFormat, RecordIOWriter, pack
from shardcat.formats.tar import TarFormat
from shardcat.sample import make_sample
from shardcat.testing.required import needs

# in CI a missing _scan fails the collection: the comparison never quietly disappears
pytestmark = needs(native.available(), "the _scan extension is built", extra=False)
REC, TAR = RecordIOFormat(), TarFormat()
MAGIC = struct.pack("<I", 0xCED7230A)
REC_OPTIONS: list[dict[str, Any]] = [
    {},
    {"header": False},
    {"fields": False},
    {"key": None},
    {"idx": False},
    {"idx": "column"},
    {"idx": "column", "fields": False},
]
TAR_OPTIONS: list[dict[str, Any]] = [
    {"grouping": g, **extra}
    for g in ("webdataset", "tfd")
    for extra in ({}, {"fields": False}, {"key": None})
]
has_gnu_tar = pytest.mark.skipif(shutil.which("tar") is None, reason="no tar")


def outcome(fmt: Format, path: Path, options: dict[str, Any], fast: bool) -> Any:
    os.environ["SHARDCAT_NATIVE"] = "1" if fast else "0"
    try:
        if fast:
            return fmt.scan_shard(str(path), options).columns
        return Columns.of(fmt.scan(str(path), options))
    except CorruptRecordError as exc:
        return (type(exc), exc.path, exc.offset, exc.problem)
    finally:
        os.environ.pop("SHARDCAT_NATIVE", None)


def same(fmt: Format, path: Path, options: dict[str, Any]) -> Any:
    ref, got = outcome(fmt, path, options, False), outcome(fmt, path, options, True)
    assert got == ref, (path, options)
    return ref


# -- RecordIO ------------------------------------------------------------------------


def write_rec(path: Path, payloads: list[bytes], keys: list[Any] | None = None) -> Path:
    with RecordIOWriter(path) as w:
        for i, payload in enumerate(payloads):
            w.write(payload, None if keys is None else keys[i])
    return path


def rec_payloads(rng: random.Random, n: int = 40) -> list[bytes]:
    out = []
    for i in range(n):
        flag = rng.choice([0, 0, 0, 1, 3])
        label: Any = rng.choice([0.1 * i, float("nan"), 7.0, 1e-40])
        labels = [rng.uniform(-5, 5) for _ in range(flag)]
        id2 = rng.choice([i, 2**64 - 1, 2**63])
        data = rng.randbytes(rng.randrange(0, 40))
        if rng.random() < 0.3:  # an aligned magic word: a split record
            data = data[: len(data) // 4 * 4] + MAGIC + data
        head = pack(IRHeader(flag, labels if flag else label, i, id2), data)
        out.append(head if rng.random() < 0.9 else rng.randbytes(rng.randrange(0, 24)))
    return out


def test_recordio_sample_and_writer(tmp_path: Path) -> None:
    shards = make_sample(tmp_path / "s", shards=2, records=300, format="recordio")
    for shard in shards:
        for options in REC_OPTIONS:
            got = same(REC, Path(shard), options)
            assert isinstance(got, Columns) and len(got) == 150
    ref = outcome(REC, Path(shards[0]), {}, False)
    assert ref.fields["flag"][0] == 0 and ref.keys[:2] == ["0", "1"]
    path = write_rec(tmp_path / "w.rec", rec_payloads(random.Random(1)))
    for options in REC_OPTIONS:
        got = same(REC, path, options)
        assert isinstance(got, Columns) and len(got) == 40
    raw = path.read_bytes()
    assert any(raw[i + 7] >> 5 == 1 for i in range(0, len(raw) - 8, 4) if raw[i : i + 4] == MAGIC)


def test_recordio_compressed_is_refused(tmp_path: Path) -> None:
    import gzip

    plain = write_rec(tmp_path / "c.rec", [pack(IRHeader(0, 1.0, 0, 0), b"x")])
    packed = tmp_path / "c2.rec"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for fast in (False, True):
        os.environ["SHARDCAT_NATIVE"] = "1" if fast else "0"
        try:
            with pytest.raises(CatalogError, match="cannot be gzip-compressed"):
                REC.scan_shard(str(packed), {})
        finally:
            os.environ.pop("SHARDCAT_NATIVE", None)


def test_recordio_empty_and_collisions(tmp_path: Path) -> None:
    empty = tmp_path / "e.rec"
    empty.write_bytes(b"")
    assert same(REC, empty, {}) == Columns([], [], [], checks=[])
    path = write_rec(tmp_path / "k.rec", [pack(IRHeader(0, 1.0, 0, 0), b"x")] * 3, ["a", "b", "a"])
    for options in REC_OPTIONS:
        same(REC, path, options)


@pytest.mark.parametrize(
    "damage",
    ["magic", "cflag2", "truncate", "short", "length", "idx_missing", "idx_extra", "idx_moved"],
)
def test_recordio_damaged(tmp_path: Path, damage: str) -> None:
    path = write_rec(tmp_path / "d.rec", rec_payloads(random.Random(2), 12))
    raw = bytearray(path.read_bytes())
    idx = path.with_suffix(".idx")
    lines = idx.read_text().splitlines()
    third = int(lines[3].split("\t")[1])
    if damage == "magic":
        raw[third] ^= 1
    elif damage == "cflag2":
        raw[third + 7] = (raw[third + 7] & 0x1F) | 0x40
    elif damage == "truncate":
        del raw[third + 10 :]
    elif damage == "short":
        del raw[third + 4 :]
    elif damage == "length":
        raw[third + 6] = 0x10
    elif damage == "idx_missing":
        idx.write_text("\n".join(lines[:3] + lines[4:]) + "\n")
    elif damage == "idx_extra":
        idx.write_text("\n".join([*lines, "zz\t3"]) + "\n")
    elif damage == "idx_moved":
        idx.write_text("\n".join([*lines[:3], f"3\t{third + 4}", *lines[4:]]) + "\n")
    path.write_bytes(bytes(raw))
    results = [same(REC, path, options) for options in REC_OPTIONS]
    assert any(isinstance(r, tuple) for r in results)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), options=st.sampled_from(REC_OPTIONS))
def test_recordio_fuzz_mutations(tmp_path: Path, seed: int, options: dict[str, Any]) -> None:
    rng = random.Random(seed)
    path = write_rec(tmp_path / "f.rec", rec_payloads(rng, 8))
    raw = bytearray(path.read_bytes())
    for _ in range(rng.randrange(0, 4)):
        kind = rng.random()
        if kind < 0.6 and raw:
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        elif kind < 0.8:
            del raw[rng.randrange(len(raw) + 1) :]
        else:
            at = rng.randrange(len(raw) + 1)
            raw[at:at] = rng.randbytes(rng.randrange(1, 9))
    path.write_bytes(bytes(raw))
    same(REC, path, options)


# -- tar -----------------------------------------------------------------------------


def members(rng: random.Random, n: int = 12) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        stem = rng.choice([f"s{i:03d}", f"dir/s{i // 2:03d}", f"{'d' * 120}/x{i}", f"ü/{i}"])
        for ext in rng.sample(["jpg", "cls", "json", "seg.png", "txt"], rng.randrange(1, 4)):
            data = {
                "cls": str(rng.randrange(10)).encode(),
                "json": b'{"score": %.3f, "caption": "c%d"}' % (rng.random(), i),
                "txt": b"caption %d" % i,
            }.get(ext, rng.randbytes(rng.randrange(0, 1500)))
            out.append((f"{stem}.{ext}", data))
    out.append(("README", b"no extension"))
    return out


def write_tarfile(path: Path, rows: list[tuple[str, bytes]], fmt: int) -> Path:
    with tarfile.open(path, "w", format=fmt) as t:
        dirs = tarfile.TarInfo("dir")
        dirs.type = tarfile.DIRTYPE
        t.addfile(dirs)
        for name, data in rows:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            t.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("link.jpg")
        link.type = tarfile.SYMTYPE
        link.linkname = "s000.jpg"
        t.addfile(link)
    return path


def gnu_tar(tmp_path: Path, fmt: str, *, sparse: bool = False) -> Path:
    src = tmp_path / f"src-{fmt}"
    rng = random.Random(fmt)
    for name, data in members(rng):
        target = src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (src / "link.cls").symlink_to("README")
    if sparse:
        with open(src / "big.bin", "wb") as f:
            f.write(b"head")
            f.seek(3 << 20)
            f.write(b"tail")
    out = tmp_path / f"gnu-{fmt}{'-sparse' if sparse else ''}.tar"
    args = ["tar", f"--format={fmt}", "--sort=name", "-C", str(src), "-cf", str(out)]
    subprocess.run([*args, *(["-S"] if sparse else []), "."], check=True)
    return out


TARFILE_FORMATS = [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]


def ustar_rows(rows: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [(n, d) for n, d in rows if len(n.encode()) <= 100 or "/" in n[-100:]]


@pytest.mark.parametrize("fmt", TARFILE_FORMATS)
def test_tarfile_archives(tmp_path: Path, fmt: int) -> None:
    rows = members(random.Random(fmt))
    if fmt == tarfile.USTAR_FORMAT:
        rows = [(n, d) for n, d in rows if n.isascii() and len(n) <= 100]
    path = write_tarfile(tmp_path / f"t{fmt}.tar", rows, fmt)
    for options in TAR_OPTIONS:
        got = same(TAR, path, options)
        assert isinstance(got, Columns) and len(got) > 3


@has_gnu_tar
@pytest.mark.parametrize("fmt", ["gnu", "ustar", "pax", "oldgnu"])
def test_gnu_tar_archives(tmp_path: Path, fmt: str) -> None:
    rng = random.Random(fmt)
    src = tmp_path / "src"
    for name, data in members(rng):
        if fmt in ("ustar",) and (len(name) > 100 or not name.isascii()):
            continue
        target = src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    out = tmp_path / f"{fmt}.tar"
    subprocess.run(
        ["tar", f"--format={fmt}", "--sort=name", "-C", str(src), "-cf", str(out), "."],
        check=True,
    )
    for options in TAR_OPTIONS:
        got = same(TAR, out, options)
        assert isinstance(got, Columns) and len(got) > 3


@has_gnu_tar
@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_gnu_tar_sparse(tmp_path: Path, fmt: str) -> None:
    path = gnu_tar(tmp_path, fmt, sparse=True)
    for options in TAR_OPTIONS:
        got = same(TAR, path, options)
        assert isinstance(got, Columns)


def test_webdataset_sample(tmp_path: Path) -> None:
    for shard in make_sample(tmp_path, shards=2, records=200, format="tar"):
        for options in TAR_OPTIONS:
            got = same(TAR, Path(shard), options)
            assert isinstance(got, Columns) and len(got) == 100
        ref = outcome(TAR, Path(shard), {"grouping": "webdataset"}, False)
        assert [m[1] for m in ref.members[:3]] == ["cls", "jpg", "json"] or ref.members


def test_mixed_plain_and_extended_headers(tmp_path: Path) -> None:
    """Plain headers, then a pax member, then plain ones again: the native walk resumes."""
    path = tmp_path / "mixed.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        for name in ["a.jpg", "a.cls", "ü.jpg", "b.jpg", "x" * 200 + ".cls", "c.cls"]:
            info = tarfile.TarInfo(name)
            info.size = 3
            t.addfile(info, io.BytesIO(b"123"))
        glob = tarfile.TarInfo("g")
        glob.type = tarfile.XGLTYPE
        glob.pax_headers = {"comment": "hi"}
        t.addfile(glob)
        for name in ["d.cls", "e.cls"]:
            info = tarfile.TarInfo(name)
            info.size = 1
            t.addfile(info, io.BytesIO(b"5"))
    for options in TAR_OPTIONS:
        got = same(TAR, path, options)
        assert isinstance(got, Columns) and len(got) >= 5


def set_checksum(raw: bytearray, at: int) -> None:
    block = raw[at : at + 512]
    block[148:156] = b" " * 8
    raw[at + 148 : at + 156] = b"%06o\0 " % sum(block)


@pytest.mark.parametrize(
    "damage",
    ["truncate_header", "truncate_data", "checksum", "garbage_size", "huge_size", "base256",
     "signed_sum", "spaces", "zero_mid", "bad_name"],
)  # fmt: skip
def test_tar_damaged(tmp_path: Path, damage: str) -> None:
    rows = members(random.Random(5))
    rows = [(n, d) for n, d in rows if n.isascii() and len(n) <= 100]
    path = write_tarfile(tmp_path / "d.tar", rows, tarfile.USTAR_FORMAT)
    raw = bytearray(path.read_bytes())
    with tarfile.open(path) as t:
        heads = [m.offset for m in t.getmembers()]
    at = heads[4]
    if damage == "truncate_header":
        del raw[at + 300 :]
    elif damage == "truncate_data":
        del raw[at + 513 :]
    elif damage == "checksum":
        raw[at + 150] ^= 1
    elif damage == "garbage_size":
        raw[at + 124 : at + 136] = b"zzzz\0\0\0\0\0\0\0\0"
        set_checksum(raw, at)
    elif damage == "huge_size":
        raw[at + 124 : at + 136] = b"77777777777\0"
        set_checksum(raw, at)
    elif damage == "base256":
        raw[at + 124 : at + 136] = b"\x80" + (3).to_bytes(11, "big")
        set_checksum(raw, at)
    elif damage == "signed_sum":
        raw[at + 200] = 0xFF  # the linkname field: a high byte, so the two sums differ
        block = raw[at : at + 512]
        block[148:156] = b" " * 8
        signed = sum(b - 256 if b > 127 else b for b in block)
        raw[at + 148 : at + 156] = b"%06o\0 " % signed
    elif damage == "spaces":
        raw[at + 124 : at + 136] = b" " + raw[at + 124 : at + 135]
        set_checksum(raw, at)
    elif damage == "zero_mid":
        raw[at : at + 512] = bytes(512)
    elif damage == "bad_name":
        raw[at] = 0xFF
        set_checksum(raw, at)
    path.write_bytes(bytes(raw))
    for options in TAR_OPTIONS:
        same(TAR, path, options)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**32 - 1),
    fmt=st.sampled_from(TARFILE_FORMATS),
    options=st.sampled_from(TAR_OPTIONS),
)
def test_tar_fuzz_mutations(tmp_path: Path, seed: int, fmt: int, options: dict[str, Any]) -> None:
    rng = random.Random(seed)
    rows = members(rng, 4)
    if fmt == tarfile.USTAR_FORMAT:
        rows = [(n, d) for n, d in rows if n.isascii() and len(n) <= 100]
    path = write_tarfile(tmp_path / "f.tar", rows, fmt)
    raw = bytearray(path.read_bytes())
    with tarfile.open(path) as t:
        heads = [m.offset for m in t.getmembers()]
    for _ in range(rng.randrange(0, 4)):
        kind = rng.random()
        at = rng.choice(heads)
        if at + 512 > len(raw):
            continue
        if kind < 0.4:  # a header byte, checksum then right or wrong
            raw[at + rng.randrange(512)] = rng.randrange(256)
            if rng.random() < 0.7:
                set_checksum(raw, at)
        elif kind < 0.6:
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        elif kind < 0.8:
            del raw[rng.randrange(len(raw) + 1) :]
        else:
            raw[at + 124 : at + 136] = b"%011o\0" % rng.randrange(0, 4096)
            set_checksum(raw, at)
    path.write_bytes(bytes(raw))
    same(TAR, path, options)


def test_switch_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SHARDCAT_NATIVE=0``: neither format calls the extension."""
    rec = make_sample(tmp_path / "r", shards=1, records=5, format="recordio")[0]
    tar = make_sample(tmp_path / "t", shards=1, records=5, format="tar")[0]
    calls: list[str] = []
    monkeypatch.setattr(native, "recordio_frames", lambda *a: calls.append("rec"))
    monkeypatch.setattr(native, "tar_members", lambda *a: calls.append("tar"))
    monkeypatch.setenv("SHARDCAT_NATIVE", "0")
    assert len(REC.scan_shard(rec, {}).columns) == 5
    assert len(TAR.scan_shard(tar, {"grouping": "webdataset"}).columns) == 5
    assert calls == []


def test_native_walk_takes_plain_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference walk only reads what the extension cannot: here the pax member,
    the long name, the global header and what follows it, and the end of the archive."""
    from shardcat.formats import tar_headers

    path = tmp_path / "m.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        for name in ["a.jpg", "a.cls", "ü.jpg", "b.jpg", "b.cls", "c.cls"]:
            info = tarfile.TarInfo(name)
            info.size = 3
            t.addfile(info, io.BytesIO(b"123"))
    reference: list[str] = []

    def spy(cur: Any, where: str) -> Any:
        for m in tar_headers.iter_members(cur, where):
            reference.append(m.name)
            yield m

    os.environ["SHARDCAT_NATIVE"] = "1"
    try:
        mm = path.read_bytes()
        cur = tar_headers.MapCursor(mm, len(mm))
        names = [m.name for m in native.tar_members(mm, cur, str(path), spy)]
    finally:
        os.environ.pop("SHARDCAT_NATIVE", None)
    assert names == ["a.jpg", "a.cls", "ü.jpg", "b.jpg", "b.cls", "c.cls"]
    assert reference == ["ü.jpg"]


def test_recordio_native_takes_whole_frames(tmp_path: Path) -> None:
    """Whole frames with flag-0 headers are the extension's; it stops at a split record."""
    payloads = [pack(IRHeader(0, 0.5, i, 0), b"abcd") for i in range(3)]
    payloads.append(pack(IRHeader(0, 0.5, 3, 0), MAGIC + b"tail"))  # split at byte 24
    path = write_rec(tmp_path / "n.rec", payloads)
    c = Columns([], [], [], {})
    stop, done = native.recordio_frames(path.read_bytes(), 0, True, c)
    assert (stop, done) == (3 * 36, False)
    assert c.offsets == [0, 36, 72] and c.lengths == [36, 36, 36]
    assert c.fields == {"flag": [0, 0, 0], "label": [0.5] * 3, "id": [0, 1, 2], "id2": [0] * 3}
