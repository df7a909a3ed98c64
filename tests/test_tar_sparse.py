"""GNU sparse members (old GNU ``S`` headers with extension blocks, pax sparse
0.0, 0.1 and 1.0): real names, real sizes, extents and bytes, as Python's
tarfile reads them; damaged sparse maps; declared sizes past the end of the
archive."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

from shardcat import Catalog, CorruptRecordError
from shardcat.formats import tar, tar_headers
from shardcat.formats.base import Entry, Location
from shardcat.formats.tar import TarFormat
from shardcat.sources.compressed import IndexingStream
from shardcat.sources.rawio import Source

TAR = TarFormat()

GNU_TAR = shutil.which("tar")
FORMATS = {
    "gnu": ["--format=gnu"],
    "pax-0.0": ["--format=pax", "--sparse-version=0.0"],
    "pax-0.1": ["--format=pax", "--sparse-version=0.1"],
    "pax-1.0": ["--format=pax", "--sparse-version=1.0"],
}
#: name -> (real size, [(offset, length) of the data written]); the rest is holes
SHAPES = {
    "data_at_both_ends": (200_000, [(0, 5000), (70_000, 3000), (150_000, 100), (199_990, 10)]),
    "hole_first_and_last": (100_000, [(40_960, 4096)]),
    "all_hole": (65_536, []),
    "thirty_pieces": (30 * 16_384, [(i * 16_384 + 1000, 100) for i in range(30)]),
}
OTHERS = {"s1.json": json.dumps({"width": 7}).encode(), "s1.txt": b"a caption\n", "s2.txt": b"two"}
ORDER = ["s1.json", "s1.txt", "s1.bin", "s2.txt"]  # the sparse member ends sample s1


def gnu_tar() -> str:
    if (
        GNU_TAR is None
        or b"GNU tar"
        not in subprocess.run([GNU_TAR, "--version"], capture_output=True, check=False).stdout
    ):
        pytest.skip("needs GNU tar")
    return GNU_TAR


def pattern(seed: int, n: int) -> bytes:
    """``n`` bytes, none of them zero (so GNU tar keeps them as data)."""
    return bytes((i * 7 + seed) % 251 + 1 for i in range(n))


def sparse_file(path: Path, shape: str) -> None:
    size, pieces = SHAPES[shape]
    with open(path, "wb") as f:
        os.truncate(f.fileno(), size)
        for i, (at, length) in enumerate(pieces):
            f.seek(at)
            f.write(pattern(i, length))
    if os.stat(path).st_blocks * 512 >= size > 0 and pieces != [(0, size)]:
        pytest.skip(
            "the file system of tmp_path makes no holes, GNU tar would store no sparse file"
        )


def gnu_archive(tmp_path: Path, fmt: str, shape: str) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    sparse_file(src / "s1.bin", shape)
    for name, data in OTHERS.items():
        (src / name).write_bytes(data)
    archive = tmp_path / f"{fmt}-{shape}.tar"
    subprocess.run(
        [gnu_tar(), *FORMATS[fmt], "--sparse", "-cf", str(archive), "-C", str(src), *ORDER],
        check=True,
    )
    return archive


def oracle(archive: Path) -> dict[str, tuple[tarfile.TarInfo, bytes]]:
    """Each regular member as Python's tarfile reads it: ``{name: (info, bytes)}``."""
    with tarfile.open(archive) as tf:
        out = {}
        for info in tf.getmembers():
            handle = tf.extractfile(info)
            assert handle is not None
            out[info.name] = (info, handle.read())
        return out


class PreadSource(Source):
    """A source over a file: what the reader hands to ``read``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.fd = os.open(path, os.O_RDONLY)

    def pread(self, length: int, offset: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def __enter__(self) -> PreadSource:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


class BytesSource(Source):
    """A source over bytes (a compressed archive's decompressed stream)."""

    def __init__(self, data: bytes, path: str = "<bytes>") -> None:
        self.path = path
        self.data = data

    def pread(self, length: int, offset: int) -> bytes:
        return self.data[offset : offset + length]


Edit = Callable[[bytearray, int], None]


def sparse(extents: tuple) -> Location:
    """The location of a sparse member given by its extents alone (``read`` reads
    the extents; offset and length are the member row's, unused here)."""
    return Location(0, sum(n for _, n in extents), extents)


def rows(entry: Entry) -> dict[str, tuple]:
    return {row[0]: row for row in entry.members}


def check_entries(entries: list[Entry], archive: Path, shape: str, source: object) -> None:
    """The entries of an archive of ``ORDER`` (``s1.bin`` of ``shape``) match
    tarfile's view of it."""
    expected = oracle(archive)
    assert [e.key for e in entries] == ["s1", "s2"]
    s1 = rows(entries[0])
    assert sorted(s1) == ["bin", "json", "txt"]
    for feature in ("json", "txt"):
        info, data = expected[f"s1.{feature}"]
        assert s1[feature] == (feature, info.offset_data, info.size, None, crc32c.crc32c(data))
        assert TAR.read(source, Location(info.offset_data, info.size), verify=True) == data
    info, data = expected["s1.bin"]
    assert info.issparse()
    feature, data_offset, real_size, extents, check = s1["bin"]
    assert (feature, data_offset, real_size) == ("bin", info.offset_data, info.size)
    assert check == crc32c.crc32c(data)  # the check of the member's content, holes included
    assert real_size == len(data) == SHAPES[shape][0]
    assert isinstance(extents, tuple)
    assert sum(length for _, length in extents) == real_size
    stored = [(at, length) for at, length in extents if at >= 0]
    at = data_offset
    for piece_at, length in stored:  # the data pieces follow each other from data_offset
        assert (piece_at, length > 0) == (at, True)
        at += length
    assert TAR.read(source, sparse(extents)) == data
    assert TAR.read(source, sparse(extents), verify=True) == data
    assert entries[0].fields == {"json_width": 7, "txt": "a caption"}
    assert entries[0].offset + entries[0].length == at  # to the end of the stored data
    info2, two = expected["s2.txt"]
    assert rows(entries[1])["txt"] == (
        "txt",
        info2.offset_data,
        info2.size,
        None,
        crc32c.crc32c(two),
    )
    assert TAR.read(source, Location(info2.offset_data, info2.size)) == two == b"two"


# -- GNU tar's sparse formats --------------------------------------------------


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_scan_and_assemble_match_tarfile(tmp_path: Path, fmt: str, shape: str):
    archive = gnu_archive(tmp_path, fmt, shape)
    assert oracle(archive)["s1.bin"][1] == (tmp_path / "src" / "s1.bin").read_bytes()
    entries = list(TAR.scan(str(archive), {}))
    with PreadSource(archive) as source:
        check_entries(entries, archive, shape, source)
    extents = rows(entries[0])["bin"][3]
    size = SHAPES[shape][0]
    if shape == "all_hole":
        assert extents == ((-1, size),)
    if shape == "hole_first_and_last":
        assert extents[0][0] == -1 and extents[-1][0] == -1
    if shape == "thirty_pieces":
        assert len([e for e in extents if e[0] >= 0]) == 30
        if fmt == "gnu":  # 4 pairs in the header, the rest in extension blocks
            header = oracle(archive)["s1.bin"][0].offset
            assert archive.read_bytes()[header + 482] == 1


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_members_samples_and_iter_members(tmp_path: Path, fmt: str):
    archive = gnu_archive(tmp_path, fmt, "thirty_pieces")
    expected = oracle(archive)
    assert list(tar.regular_members(str(archive))) == [
        (name, info.offset_data, info.size) for name, (info, _) in expected.items()
    ]
    samples = dict(tar.iter_samples(str(archive), "webdataset"))
    assert samples["s1"]["bin"] == expected["s1.bin"][1]
    assert samples["s1"]["txt"] == OTHERS["s1.txt"]
    assert samples["s2"] == {"txt": b"two"}
    data = archive.read_bytes()
    members = list(tar_headers.iter_members(tar_headers.MapCursor(data, len(data)), str(archive)))
    assert [(m.name, m.extents is None) for m in members] == [
        ("s1.json", True),
        ("s1.txt", True),
        ("s1.bin", False),
        ("s2.txt", True),
    ]
    assert members[2].is_file and members[2].size == expected["s1.bin"][0].size


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_gzip_archives(tmp_path: Path, fmt: str):
    plain = gnu_archive(tmp_path, fmt, "data_at_both_ends")
    raw = plain.read_bytes()
    archive = tmp_path / f"{fmt}-data_at_both_ends.tar.gz"
    archive.write_bytes(gzip.compress(raw))
    with IndexingStream(str(archive), "gzip") as stream:
        entries = list(TAR.scan_stream(stream, str(archive), {}))
        stream.seek_index()
    assert entries == list(TAR.scan(str(plain), {}))  # decompressed offsets = plain offsets
    assert entries == list(TAR.scan(str(archive), {}))
    check_entries(entries, plain, "data_at_both_ends", BytesSource(raw))
    samples = dict(tar.iter_samples(str(archive), "webdataset"))
    assert samples["s1"]["bin"] == oracle(plain)["s1.bin"][1]


def test_catalog_reads_a_sparse_member(tmp_path: Path):
    archive = gnu_archive(tmp_path, "pax-1.0", "data_at_both_ends")
    expected = oracle(archive)["s1.bin"][1]
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(str(archive), "d", format="tar") as r:
        assert r.get_feature("s1", "bin") == expected
        assert r.get_feature("s1", "txt") == OTHERS["s1.txt"]
        assert r.get_record("s2") == {"txt": b"two"}
        assert r.verify() == []


# -- damaged old GNU maps ------------------------------------------------------


def rechecksum(data: bytearray, header: int) -> None:
    data[header + 148 : header + 156] = b" " * 8
    data[header + 148 : header + 156] = b"%06o\0 " % sum(data[header : header + 512])


def damaged(archive: Path, edit: Edit) -> tuple[Path, int]:
    """A copy of a GNU-format archive with ``edit(data, header)`` applied to the
    sparse member's header (checksum redone); returns it and that header's offset."""
    header = oracle(archive)["s1.bin"][0].offset
    data = bytearray(archive.read_bytes())
    edit(data, header)
    rechecksum(data, header)
    out = archive.with_name("damaged.tar")
    out.write_bytes(bytes(data))
    return out, header


def octal(n: int) -> bytes:
    return b"%011o\0" % n


def scan_error(path: Path) -> CorruptRecordError:
    with pytest.raises(CorruptRecordError) as err:
        list(TAR.scan(str(path), {}))
    assert err.value.path == str(path)
    return err.value


def set_pair(i: int, at: int, length: int) -> Edit:
    def edit(data: bytearray, header: int) -> None:
        pos = header + 386 + 24 * i
        data[pos : pos + 24] = octal(at) + octal(length)

    return edit


def test_damaged_old_gnu_maps(tmp_path: Path):
    archive = gnu_archive(tmp_path, "gnu", "thirty_pieces")
    pairs = oracle(archive)["s1.bin"][0].sparse
    assert isinstance(pairs, list)
    (at0, n0), (at1, _) = pairs[0], pairs[1]

    def bad_digit(data: bytearray, header: int) -> None:
        data[header + 386 + 24 : header + 386 + 26] = b"9x"

    cases: dict[str, Edit] = {
        "bad sparse offset field": bad_digit,
        "starts before the one before ends": set_pair(1, at0, n0),
        "runs past the real size": set_pair(3, 40 * 16_384, 4096),
    }
    for problem, edit in cases.items():
        path, header = damaged(archive, edit)
        err = scan_error(path)
        assert problem in err.problem and err.offset == header

    def real_size(n: int) -> Edit:
        def edit(data: bytearray, header: int) -> None:
            data[header + 483 : header + 495] = octal(n)

        return edit

    path, header = damaged(archive, real_size(at1))  # the second piece ends past it
    err = scan_error(path)
    assert "runs past the real size" in err.problem and err.offset == header

    def negative_real_size(data: bytearray, header: int) -> None:
        data[header + 483 : header + 495] = b"\xff" * 12  # base-256 -1

    path, header = damaged(archive, negative_real_size)
    assert scan_error(path).offset == header

    def not_extended(data: bytearray, header: int) -> None:  # 4 pairs: too little data
        data[header + 482] = 0

    path, header = damaged(archive, not_extended)
    err = scan_error(path)
    assert "bytes of data, the member" in err.problem and err.offset == header

    def after_end(data: bytearray, header: int) -> None:  # an unused pair, then a used one
        data[header + 386 + 24 * 2 : header + 386 + 24 * 3] = bytes(24)

    path, header = damaged(archive, after_end)
    err = scan_error(path)
    assert "after its end" in err.problem and err.offset == header

    raw = archive.read_bytes()
    header = oracle(archive)["s1.bin"][0].offset
    for cut, problem in [(header + 700, "extension blocks"), (header + 2048 + 10, "declares")]:
        path = tmp_path / "cut.tar"
        path.write_bytes(raw[:cut])
        err = scan_error(path)
        assert problem in err.problem and err.offset == header


def test_the_refused_sparse_header_of_before_is_a_damaged_map(tmp_path: Path):
    """A type ``S`` header with no map and one byte of data."""
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        info = tarfile.TarInfo("a.jpg")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    data = bytearray(path.read_bytes())
    data[156:157] = b"S"
    rechecksum(data, 0)
    path.write_bytes(bytes(data))
    err = scan_error(path)
    assert err.offset == 0 and "sparse map of 'a.jpg' holds 0 bytes of data" in err.problem


# -- pax sparse maps written by hand -------------------------------------------


def pax_sparse(path: Path, headers: dict[str, str], stored: bytes, name: str = "s1.bin") -> int:
    """An archive of ``s1.txt`` and a member ``name`` with pax ``headers`` and
    ``stored`` as its data; returns the offset of that member's first header."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("s1.txt")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"txt"))
        offset = tf.offset
        info = tarfile.TarInfo(name)
        info.size = len(stored)
        info.pax_headers = headers
        tf.addfile(info, io.BytesIO(stored))
    return offset


def map_10(numbers: list[int | str]) -> bytes:
    text = "".join(f"{n}\n" for n in numbers).encode()
    return text + bytes(tar_headers.padded(len(text)) - len(text))


def test_hand_written_pax_maps_read_as_tarfile_reads_them(tmp_path: Path):
    expected = b"abc" + bytes(7) + b"de" + bytes(8)
    v10 = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "s1.bin"}
    cases = {
        "0.0": (
            {"GNU.sparse.size": "20", "GNU.sparse.offset": "0", "GNU.sparse.numbytes": "5"},
            b"abcde",
            b"abcde" + bytes(15),
        ),
        "0.1": ({"GNU.sparse.size": "20", "GNU.sparse.map": "0,3,10,2"}, b"abcde", expected),
        "1.0": (
            {**v10, "GNU.sparse.realsize": "20"},
            map_10([2, 0, 3, 10, 2]) + b"abcde",
            expected,
        ),
        "1.0-empty": ({**v10, "GNU.sparse.realsize": "0"}, map_10([0]), b""),
    }
    for version, (headers, stored, content) in cases.items():
        path = tmp_path / f"{version}.tar"
        name = "GNUSparseFile.0/s1.bin" if version.startswith("1.0") else "s1.bin"
        pax_sparse(path, headers, stored, name)
        info, data = oracle(path)["s1.bin"]
        assert data == content
        (entry,) = TAR.scan(str(path), {})
        _, data_offset, real_size, extents, check = rows(entry)["bin"]
        assert (data_offset, real_size, check) == (info.offset_data, info.size, crc32c.crc32c(data))
        with PreadSource(path) as source:
            assert TAR.read(source, sparse(extents), verify=True) == content


def test_damaged_pax_maps(tmp_path: Path):
    v01 = {"GNU.sparse.size": "20", "GNU.sparse.name": "s1.bin"}
    v10 = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": "20"}
    cases: list[tuple[dict[str, str], bytes, str]] = [
        ({**v01, "GNU.sparse.map": "0,3,x,2"}, b"abcde", "bad GNU sparse map number 'x'"),
        ({**v01, "GNU.sparse.map": "0,3,-1,2"}, b"abcde", "bad GNU sparse map number '-1'"),
        ({**v01, "GNU.sparse.map": "0,3,1_0,2"}, b"abcde", "bad GNU sparse map number '1_0'"),
        ({**v01, "GNU.sparse.map": "0,3, 10,2"}, b"abcde", "bad GNU sparse map number ' 10'"),
        ({**v01, "GNU.sparse.map": "0,3,\u0661\u0660,2"}, b"abcde", "bad GNU sparse map number"),
        ({**v01, "GNU.sparse.map": "0,3,10"}, b"abcde", "odd count"),
        ({**v01, "GNU.sparse.map": "0,3,99999999999999999999,2"}, b"abcde", "bad GNU sparse"),
        ({**v01, "GNU.sparse.map": "0,5,3,2"}, b"abcdefg", "starts before the one before ends"),
        ({**v01, "GNU.sparse.map": "10,2,0,3"}, b"abcde", "starts before the one before ends"),
        ({**v01, "GNU.sparse.map": "0,3,18,5"}, b"abcdefgh", "runs past the real size 20"),
        ({**v01, "GNU.sparse.map": "0,3,10,2"}, b"abcdef", "holds 5 bytes of data, the member 6"),
        ({**v01, "GNU.sparse.map": "0,3,10,2"}, b"abcd", "holds 5 bytes of data, the member 4"),
        ({**v01, "GNU.sparse.map": "0,3", "GNU.sparse.numblocks": "2"}, b"abc", "numblocks"),
        ({"GNU.sparse.map": "0,3"}, b"abc", "has no real size"),
        ({**v01, "GNU.sparse.size": "1e3", "GNU.sparse.map": "0,3"}, b"abc", "GNU.sparse.size"),
        ({"GNU.sparse.name": "s1.bin"}, b"abc", "has no sparse map"),
        ({"GNU.sparse.size": "9", "GNU.sparse.numbytes": "3"}, b"abc", "offset/numbytes pairs"),
        ({**v10, "GNU.sparse.major": "2"}, map_10([0]), "unsupported GNU sparse format version"),
        ({**v10}, map_10([1, "zz", 3]) + b"abc", "bad GNU sparse map number b'zz'"),
        ({**v10}, map_10([10**15, 0, 3]) + b"abc", "pairs do not fit"),
        ({**v10}, b"200\n" + b"0\n" * 254 + b"x" * 400, "runs past the member's data"),
        ({**v10}, map_10([2, 0, 3]) + b"abc", "bad GNU sparse map number b'\\x00"),
        ({**v10}, b"1\n0\n" + b"7" * 508 + b"abc", "bad GNU sparse map number"),
        ({**v10}, map_10([1, 0, 30]) + b"x" * 30, "runs past the real size 20"),
    ]
    for headers, stored, problem in cases:
        path = tmp_path / "bad.tar"
        header = pax_sparse(path, headers, stored)
        err = scan_error(path)
        assert problem in err.problem, (headers, err.problem)
        assert err.offset == header


def test_damaged_gnu_tar_pax_maps(tmp_path: Path):
    """Real GNU tar pax output with a number of the map rewritten (same length)."""
    for fmt, old, new in [
        ("pax-0.0", b"GNU.sparse.offset=69632", b"GNU.sparse.offset=00100"),
        ("pax-0.1", b",69632,", b",00100,"),
        ("pax-0.1", b",69632,", b",6963a,"),
        ("pax-1.0", b"\n69632\n", b"\n00100\n"),
    ]:
        archive = gnu_archive(tmp_path, fmt, "data_at_both_ends")
        raw = archive.read_bytes()
        assert raw.count(old) == 1
        path = tmp_path / "bad.tar"
        path.write_bytes(raw.replace(old, new))
        err = scan_error(path)
        assert err.offset == oracle(archive)["s1.bin"][0].offset
        assert "sparse map" in err.problem


def test_truncated_sparse_data_and_assemble_errors(tmp_path: Path):
    archive = gnu_archive(tmp_path, "pax-0.1", "data_at_both_ends")
    (entry, _) = TAR.scan(str(archive), {})
    extents = rows(entry)["bin"][3]
    last_at, last_n = [e for e in extents if e[0] >= 0][-1]
    raw = archive.read_bytes()
    path = tmp_path / "cut.tar"
    path.write_bytes(raw[: last_at + last_n - 1])  # one byte short
    err = scan_error(path)
    assert "declares" in err.problem
    assert err.offset == oracle(archive)["s1.bin"][0].offset
    with PreadSource(path) as source, pytest.raises(CorruptRecordError) as raised:
        TAR.read(source, sparse(extents))
    assert (
        raised.value.offset == last_at and "truncated: the file ends after" in raised.value.problem
    )
    with PreadSource(archive) as source:
        shifted = tuple((at + 512 if at >= 0 else at, n) for at, n in extents)
        with pytest.raises(CorruptRecordError, match="stale shard"):
            TAR.read(source, sparse(shifted), verify=True)
        apart = ((extents[0][0], 10), (-1, 5), (extents[0][0] + 11, 10))
        with pytest.raises(CorruptRecordError, match="does not follow"):
            TAR.read(source, sparse(apart), verify=True)
        assert len(TAR.read(source, sparse(apart))) == 25
        with pytest.raises(CorruptRecordError, match="bad extent"):
            TAR.read(source, sparse(((0, -1),)))
        with pytest.raises(CorruptRecordError, match="truncated: the file ends after"):
            TAR.read(source, sparse(((extents[0][0], 2**62),)))  # no 2**62 allocation


# -- sizes declared past the end of the archive --------------------------------


def base256(n: int) -> bytes:
    return b"\x80" + n.to_bytes(11, "big")


def huge_size(tmp_path: Path, which: str) -> tuple[Path, int]:
    """An archive whose member ``which`` declares 2**63 bytes (base-256)."""
    path = tmp_path / "huge.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for name in ("s1.txt", "s1.bin", "s2.txt"):
            info = tarfile.TarInfo(name if name != "s1.bin" else "d" * 120 + "/s1.bin")
            info.size = 4
            tf.addfile(info, io.BytesIO(b"data"))
    data = bytearray(path.read_bytes())
    # s1.bin's long name makes a ././@LongLink (L) header at 1024, its own header at 2048
    at = {"member": 2048, "longlink": 1024}[which]
    data[at + 124 : at + 136] = base256(2**63)
    rechecksum(data, at)
    path.write_bytes(bytes(data))
    return path, 1024


@pytest.mark.parametrize("which", ["member", "longlink"])
def test_a_huge_declared_size_is_an_error_not_an_allocation(tmp_path: Path, which: str):
    path, header = huge_size(tmp_path, which)
    err = scan_error(path)
    assert err.offset == header
    size = path.stat().st_size
    start = header + (512 if which == "longlink" else 1024 + 512)
    assert err.problem.endswith(
        f" declares {2**63} bytes, the archive ends after {size - start} of them"
    )
    gz = tmp_path / "huge.tar.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    for scan in (
        lambda: list(TAR.scan(str(gz), {})),
        lambda: list(tar.iter_samples(str(gz), "webdataset")),
        lambda: list(tar.regular_members(str(gz))),
    ):
        with pytest.raises(CorruptRecordError) as raised:
            scan()
        assert raised.value.offset == header and "truncated member" in raised.value.problem
    with IndexingStream(str(gz), "gzip") as stream, pytest.raises(CorruptRecordError) as raised:
        list(TAR.scan_stream(stream, str(gz), {}))  # read_full(2**63) was a MemoryError
    assert raised.value.offset == header


def test_a_size_past_the_end_names_the_member(tmp_path: Path):
    path = tmp_path / "past.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name in ("s1.txt", "s1.json"):
            info = tarfile.TarInfo(name)
            info.size = 4
            tf.addfile(info, io.BytesIO(b"{}  "))
    data = bytearray(path.read_bytes())
    data[512 + 512 + 124 : 512 + 512 + 136] = octal(10_000_000)  # s1.json, a field member
    rechecksum(data, 1024)
    path.write_bytes(bytes(data))
    err = scan_error(path)
    assert err.offset == 1024
    assert err.problem == (
        f"truncated member 's1.json' declares 10000000 bytes, "
        f"the archive ends after {len(data) - 1536} of them"
    )
