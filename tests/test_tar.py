"""tar archives: header parsing (ustar, GNU, pax, GNU tar's own output), grouping
rules, SQL fields, errors with offsets, TarReader, tfd-utils parity, DALI wds2idx."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import crc32c
import pytest
from damage import flip_keeping_mtime

from shardcat import (
    Catalog,
    CatalogError,
    CorruptRecordError,
    DuplicateKeyError,
    IngestError,
    TarRandomAccess,
    TarReader,
)
from shardcat.formats import tar, tar_rules
from shardcat.formats.base import Location
from shardcat.formats.registry import detect_format
from shardcat.formats.tar import TarFormat
from shardcat.sources.local import FileSource
from shardcat.testing.required import need

TAR = TarFormat()

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
LONG_DIR = "d" * 60 + "/" + "e" * 50  # a 111-character directory (ustar: in the prefix)
LONG_NAME = f"{LONG_DIR}/{'f' * 70}.jpg"  # 186 characters


def add(tf: tarfile.TarFile, name: str, data: bytes = b"", **kw: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    for k, v in kw.items():
        setattr(info, k, v)
    tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return info


def oracle(path: Path) -> list[tuple[str, int, int]]:
    """(name, data offset, size) of regular files, as Python's tarfile sees them."""
    with tarfile.open(path) as tf:
        return [(m.name, m.offset_data, m.size) for m in tf.getmembers() if m.isreg()]


def members_of(path: Path) -> list[tuple[str, int, int]]:
    return list(tar.regular_members(str(path)))


def write_samples(path: Path, fmt: int = tarfile.GNU_FORMAT, mode: str = "w") -> dict:
    """A WebDataset-style archive; returns {name: bytes}."""
    contents = {
        "s0.jpg": b"\xff\xd8jpeg-0" * 30,
        "s0.cls": b"3\n",
        "s0.json": json.dumps({"width": 640, "image": {"width": 1200, "id": 7}}).encode(),
        "s1.jpg": b"\xff\xd8jpeg-1" * 50,
        "s1.cls": b"1\n",
        "s1.json": json.dumps({"width": 320, "image": {"width": 800, "id": 8}}).encode(),
        "s1.txt": "a caption, ünïcode".encode(),
    }
    with tarfile.open(path, mode, format=fmt) as tf:
        for name, data in contents.items():
            add(tf, name, data)
    return contents


# -- headers -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_python_tarfile_formats_long_and_non_ascii_names(tmp_path: Path, fmt: str):
    path = tmp_path / f"{fmt}.tar"
    x100 = f"{'x' * 98}.j"  # exactly 100 characters: the name field has no NUL
    names = [LONG_NAME, "plain.txt", "ünï/çødé.json", "empty.bin", "noext", x100]
    with tarfile.open(path, "w", format=FORMATS[fmt], encoding="utf-8") as tf:
        add(tf, "somedir/", type=tarfile.DIRTYPE)
        for i, name in enumerate(names):
            add(tf, name, b"" if name == "empty.bin" else name.encode() * (i + 1))
        add(tf, "link.jpg", type=tarfile.SYMTYPE, linkname="plain.txt")
        add(tf, "hard.jpg", type=tarfile.LNKTYPE, linkname="plain.txt")
    assert members_of(path) == oracle(path)
    assert [n for n, _, _ in members_of(path)] == names  # no dir, no links
    data = path.read_bytes()
    for name, offset, size in members_of(path):
        expected = b"" if name == "empty.bin" else name.encode() * (names.index(name) + 1)
        assert data[offset : offset + size] == expected


@pytest.mark.parametrize("fmt", ["gnu", "posix", "ustar", "v7"])
def test_gnu_tar_command_archives(tmp_path: Path, fmt: str):
    if shutil.which("tar") is None:
        pytest.skip("no tar command")
    src = tmp_path / "src"
    deep = src / "d" / ("x" * 60) / ("y" * 30)
    deep.mkdir(parents=True)
    (deep / "sample.jpg").write_bytes(b"J" * 700)
    (deep / "sample.cls").write_bytes(b"5")
    (src / "ünï.txt").write_bytes(b"text")
    (src / "empty.json").write_bytes(b"")
    (src / "README").write_bytes(b"no extension")
    os.symlink("ünï.txt", src / "sym.txt")
    os.link(src / "README", src / "hard.txt")
    path = tmp_path / f"{fmt}.tar"
    names = ["d", "README", "empty.json", "hard.txt", "sym.txt", "ünï.txt"]
    if fmt == "v7":  # v7 has no room for long names or non-ASCII: plain files only
        names = ["README", "empty.json", "hard.txt", "sym.txt"]
    subprocess.run(
        ["tar", f"--format={fmt}", "-cf", str(path), "-C", str(src), *names],
        check=True,
        capture_output=True,
    )
    assert members_of(path) == oracle(path)
    got = {n for n, _, _ in members_of(path)}
    assert "README" in got and "sym.txt" not in got  # symlinks are not samples
    assert "hard.txt" not in got  # a hardlink to README (archived first): no bytes of its own
    if fmt != "v7":
        assert f"d/{'x' * 60}/{'y' * 30}/sample.jpg" in got
        entries = {e.key: e for e in TAR.scan(str(path), {"grouping": "webdataset"})}
        sample = entries[f"d/{'x' * 60}/{'y' * 30}/sample"]
        assert {m[0] for m in sample.members} == {"jpg", "cls"}
        assert sample.fields == {"cls": 5}


def test_pax_size_and_path_override(tmp_path: Path):
    """A pax header whose size and path override the ustar fields (size field 0)."""
    payload = b"0123456789" * 70  # 700 bytes
    records = f"path=über/{'p' * 120}.bin\n".encode()
    record = f"{len(records) + 4} ".encode() + records  # length counts itself: 3 digits + space
    size_record = b"12 size=700\n"
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    pax.size = len(record) + len(size_record)
    real = tarfile.TarInfo("short.bin")
    real.size = 0
    blob = (
        pax.tobuf(tarfile.USTAR_FORMAT)
        + (record + size_record).ljust(512, b"\0")
        + real.tobuf(tarfile.USTAR_FORMAT)
        + payload.ljust(1024, b"\0")
        + bytes(1024)
    )
    path = tmp_path / "pax.tar"
    path.write_bytes(blob)
    assert members_of(path) == oracle(path) == [(f"über/{'p' * 120}.bin", 1536, 700)]
    (entry,) = TAR.scan(str(path), {})
    assert (entry.key, entry.offset, entry.length) == (f"über/{'p' * 120}", 0, 1536 + 700)
    fd = os.open(path, os.O_RDONLY)
    try:  # verify accepts the 0 size field that the pax size overrides
        assert TAR.read(FileSource(fd, str(path)), Location(1536, 700), verify=True) == payload
    finally:
        os.close(fd)


def test_pax_global_header_and_gnu_long_link(tmp_path: Path):
    path = tmp_path / "g.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "x"}) as tf:
        add(tf, "a.jpg", b"A" * 10)
        add(tf, "l.jpg", type=tarfile.SYMTYPE, linkname="t" * 150)
        add(tf, "a.txt", b"hello")
    gnu = tmp_path / "gnu.tar"
    with tarfile.open(gnu, "w", format=tarfile.GNU_FORMAT) as tf:
        add(tf, "a.jpg", b"A" * 10)
        add(tf, "l.jpg", type=tarfile.SYMTYPE, linkname="t" * 150)  # 'K' long link header
        add(tf, "a.txt", b"hello")
    for p in (path, gnu):
        assert members_of(p) == oracle(p)
        entries = list(TAR.scan(str(p), {}))
        # links are no members of any sample: the run of "a" goes on across it
        assert [(e.key, [m[0] for m in e.members]) for e in entries] == [("a", ["jpg", "txt"])]


def test_empty_archives(tmp_path: Path):
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    assert list(TAR.scan(str(empty), {})) == []
    zeros = tmp_path / "zeros.tar"
    with tarfile.open(zeros, "w"):
        pass
    assert list(TAR.scan(str(zeros), {})) == []
    no_end = tmp_path / "no_end.tar"  # archive without its end-of-archive blocks
    write_samples(no_end)
    (last,) = [m for m in oracle(no_end) if m[0] == "s1.txt"]
    no_end.write_bytes(no_end.read_bytes()[: last[1] + 512])
    assert len(list(TAR.scan(str(no_end), {}))) == 2


def test_corrupt_header_names_its_offset(tmp_path: Path):
    path = tmp_path / "c.tar"
    write_samples(path)
    second_header = oracle(path)[1][1] - 512
    data = bytearray(path.read_bytes())
    data[second_header + 3] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as err:
        list(TAR.scan(str(path), {}))
    assert (err.value.path, err.value.offset) == (str(path), second_header)
    assert "checksum" in err.value.problem
    assert isinstance(err.value, ValueError)


def test_truncation_errors(tmp_path: Path):
    path = tmp_path / "t.tar"
    write_samples(path)
    members = oracle(path)
    original = path.read_bytes()
    header = members[3][1] - 512  # s1.jpg's header
    path.write_bytes(original[: header + 100])
    with pytest.raises(CorruptRecordError) as err:
        list(TAR.scan(str(path), {}))
    assert err.value.offset == header
    assert err.value.problem == "truncated tar header (100 of 512 bytes)"
    path.write_bytes(original[: members[3][1] + 5])  # inside s1.jpg's data
    with pytest.raises(CorruptRecordError) as err:
        list(TAR.scan(str(path), {}))
    assert err.value.offset == header
    assert "truncated member 's1.jpg'" in err.value.problem
    gnu = tmp_path / "long.tar"
    with tarfile.open(gnu, "w", format=tarfile.GNU_FORMAT) as tf:
        add(tf, LONG_NAME, b"x")
    gnu.write_bytes(gnu.read_bytes()[:1024])  # the LongLink header and its name, no member
    with pytest.raises(CorruptRecordError) as err:
        list(TAR.scan(str(gnu), {}))
    assert err.value.offset == 0
    assert "extended header" in err.value.problem


def test_sparse_members_are_refused(tmp_path: Path):
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        add(tf, "a.jpg", b"x")
    data = bytearray(path.read_bytes())
    data[156:157] = b"S"
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="sparse"):
        list(TAR.scan(str(path), {}))


# -- grouping, keys, fields ----------------------------------------------------


def test_grouping_rules_and_subdirectory_keys(tmp_path: Path):
    path = tmp_path / "g.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for name in ["a.seg.png", "a.json", "train/a/x.jpg", "train/a/x.cls", "./b.jpg", "noext"]:
            add(tf, name, name.encode())
    wds = [(e.key, [m[0] for m in e.members]) for e in TAR.scan(str(path), {})]
    assert wds == [
        ("a", ["seg.png", "json"]),
        ("train/a/x", ["jpg", "cls"]),
        ("./b", ["jpg"]),
    ]
    tfd = [(e.key, [m[0] for m in e.members]) for e in TAR.scan(str(path), {"grouping": "tfd"})]
    assert tfd == [
        ("a.seg", ["png"]),
        ("a", ["json"]),
        ("train/a/x", ["jpg", "cls"]),
        ("b", ["jpg"]),
    ]
    by_position = list(TAR.scan(str(path), {"key": None}))
    assert [e.key for e in by_position] == [None, None, None]
    with pytest.raises(CatalogError, match="unknown tar grouping 'last'"):
        list(TAR.scan(str(path), {"grouping": "last"}))
    assert TAR.key_rule({"grouping": "tfd"}) == "member-stem:tfd"
    assert TAR.key_rule({}) == "member-stem:webdataset"
    assert TAR.key_rule({"key": None}) == "position"


def test_entry_spans_and_member_offsets(tmp_path: Path):
    path = tmp_path / "e.tar"
    contents = write_samples(path)
    entries = list(TAR.scan(str(path), {}))
    offsets = {name: (off, size) for name, off, size in oracle(path)}
    assert [e.key for e in entries] == ["s0", "s1"]
    for e in entries:
        assert e.offset == offsets[f"{e.key}.{e.members[0][0]}"][0] - 512
        last_off, last_size = offsets[f"{e.key}.{e.members[-1][0]}"]
        assert e.offset + e.length == last_off + last_size
        for feature, off, size, extents, check in e.members:
            assert (off, size, extents) == (*offsets[f"{e.key}.{feature}"], None)
            assert len(contents[f"{e.key}.{feature}"]) == size
            assert check == crc32c.crc32c(contents[f"{e.key}.{feature}"])  # the member's check


def test_sql_fields(tmp_path: Path):
    path = tmp_path / "f.tar"
    write_samples(path)
    entries = list(TAR.scan(str(path), {}))
    assert entries[0].fields == {
        "cls": 3,
        "json_width": 640,
        "json_image_width": 1200,
        "json_image_id": 7,
    }
    assert entries[1].fields["txt"] == "a caption, ünïcode"
    assert all(e.fields == {} for e in TAR.scan(str(path), {"fields": False}))
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(path, "sa1b"):
        assert cat.query("SELECT key FROM sa1b WHERE json_image_width > 1000") == [("s0",)]
        assert cat.query("SELECT key, cls, txt FROM sa1b ORDER BY position") == [
            ("s0", 3, None),
            ("s1", 1, "a caption, ünïcode"),
        ]


def test_member_field_rules():
    assert tar_rules.member_fields("cls", b" 12\n") == {"cls": 12}
    notes = tar_rules.FieldNotes()
    assert tar_rules.member_fields("cls", b"-18446744073709551616", notes) == {
        "cls": "-18446744073709551616"
    }
    assert notes.beyond == [("cls", "-18446744073709551616")]
    assert tar_rules.member_fields("seg.cls", b"x1") == {"seg_cls": "x1"}  # not an integer: text
    assert tar_rules.member_fields("txt", b"42") == {"txt": "42"}  # txt stays text
    assert tar_rules.member_fields("txt", b"\xff\xfe") == {}
    doc = {
        "ok": True,
        "n": None,
        "f": 0.5,
        "inf": float("inf"),
        "s": "y" * 300,
        "l": [1, 2],
        "o": {"a-b": 1, "deep": {"x": 1}},
        "big": 2**70,
    }
    assert tar_rules.member_fields("meta.json", json.dumps(doc).encode()) == {
        "meta_json_ok": 1,
        "meta_json_f": 0.5,
        "meta_json_o_a_b": 1,
        "meta_json_big": str(2**70),  # beyond 64 bits: kept as text
    }
    assert tar_rules.member_fields("json", b"[1, 2]") == {}
    assert tar_rules.member_fields("json", b"{broken") == {}
    many = {f"k{i}": i for i in range(100)}
    assert (
        len(tar_rules.member_fields("json", json.dumps(many).encode())) == tar_rules.MAX_JSON_FIELDS
    )


def test_repeated_stems_are_duplicate_keys(tmp_path: Path):
    path = tmp_path / "dup.tar"
    with tarfile.open(path, "w") as tf:
        add(tf, "a.jpg", b"first")
        add(tf, "b.jpg", b"b")
        add(tf, "a.jpg", b"second")  # the stem comes back later
        add(tf, "c.jpg", b"c1")
        add(tf, "c.jpg", b"c2")  # the same feature twice in a row
    assert [e.key for e in TAR.scan(str(path), {})] == ["a", "b", "a", "c", "c"]
    with Catalog(tmp_path / "c.sqlite") as cat:
        with pytest.raises(IngestError) as err:
            cat.ingest(path, "d")
        assert "duplicate key 'a'" in str(err.value)
        with cat.ingest(path, "d", on_duplicate="last") as reader:
            assert reader.get_keys() == ["b", "a", "c"]
            assert reader.get_feature("a", "jpg") == b"second"
            assert reader.get_feature("c", "jpg") == b"c2"
    assert issubclass(DuplicateKeyError, ValueError)


def test_detection_and_sniff(tmp_path: Path):
    path = tmp_path / "no_extension"
    write_samples(path)
    assert detect_format(str(path)) == "tar"
    assert not TAR.sniff(bytes(512))
    assert not TAR.sniff(b"x" * 512)


# -- reading -------------------------------------------------------------------


def test_get_feature_reads_only_that_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "r.tar"
    contents = write_samples(path)
    reads: list[tuple[int, int]] = []
    real = FileSource.pread

    def counting(self: FileSource, length: int, offset: int) -> bytes:
        reads.append((length, offset))
        return real(self, length, offset)

    monkeypatch.setattr(FileSource, "pread", counting)
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(path, "r") as reader:
        for name, data in contents.items():
            key, feature = name.split(".", 1)
            reads.clear()
            assert reader.get_feature(key, feature) == data
            assert reads == [(len(data), dict((n, o) for n, o, _ in oracle(path))[name])]
        assert reader.get_feature("s0", "txt") is None
        assert reader.get_feature("nope", "jpg") is None
        assert reader.get_record("s1") == {k[3:]: v for k, v in contents.items() if k[:2] == "s1"}
        assert reader.verify() == []


def test_verify_finds_a_changed_header(tmp_path: Path):
    """A header changed in place, size and mtime put back: near either end of the
    file the fingerprint says the shard is stale; mid-file the header check finds it."""
    path = tmp_path / "v.tar"
    write_samples(path)
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "v").close()
        flip_keeping_mtime(path, oracle(path)[2][1] - 512 + 1, 0x01)
        problems = cat.verify("v")
        assert [(p.path, p.offset, p.problem) for p in problems] == [
            (
                str(path),
                0,
                "changed after it was indexed: its content changed (fingerprint "
                "differs); re-ingest it (catalog ingest, or reader.rebuild_index())",
            )
        ]
        assert str(problems[0]).count("v.tar") == 1  # the file named once

    big = tmp_path / "big.tar"
    with tarfile.open(big, "w") as tf:
        add(tf, "pad0.bin", bytes(100_000))
        add(tf, "s1.jpg", b"\xff\xd8" * 300)
        add(tf, "s1.cls", b"1")
        add(tf, "pad9.bin", bytes(100_000))
    with Catalog(tmp_path / "c2.sqlite") as cat:
        cat.ingest(big, "v").close()
        header = oracle(big)[1][1] - 512
        flip_keeping_mtime(big, header + 1, 0x01)
        problems = cat.verify("v")
        assert [(p.offset, p.problem) for p in problems] == [
            (header, "bad tar header checksum before member data (stale shard?)")
        ]


def test_tar_reader_api(tmp_path: Path):
    paths = []
    for i in range(2):
        p = tmp_path / f"part-{i}.tar"
        with tarfile.open(p, "w") as tf:
            for j in range(3):
                add(tf, f"k{i}{j}.seg.png", bytes([i, j]) * 5)
                add(tf, f"k{i}{j}.seg.json", b"{}")
        paths.append(p)
    with TarReader(str(tmp_path / "part-*.tar"), max_workers=2) as reader:
        assert TarRandomAccess is TarReader
        assert len(reader) == 6
        keys = reader.get_keys()
        assert keys == [f"k{i}{j}.seg" for i in range(2) for j in range(3)]  # tfd grouping
        assert reader["k01.seg"] == {"png": bytes([0, 1]) * 5, "json": b"{}"}
        assert reader.get_record("k01.seg") == reader["k01.seg"]
        assert reader.get_feature("k12.seg", "png") == bytes([1, 2]) * 5
        assert reader.get_feature_list("k12.seg", "png") == [bytes([1, 2]) * 5]
        assert reader.get_feature_list("k12.seg", "jpg") is None
        assert reader.contains_key("k00.seg") and "k00.seg" in reader and "k00" not in reader
        with pytest.raises(KeyError):
            reader["k00"]
        stats = reader.get_stats()
        assert stats["total_records"] == 6
        assert stats["records_per_file"] == {"part-0.tar": 3, "part-1.tar": 3}
        assert stats["key_rule"] == "member-stem:tfd"
        assert reader.index_file == str(tmp_path / "shardcat.sqlite")
        reader.rebuild_index()
        assert reader.get_keys() == keys
    with Catalog(tmp_path / "shardcat.sqlite") as cat:
        (info,) = cat.datasets()
        assert (info.format, info.grouping, info.key_rule) == ("tar", "tfd", "member-stem:tfd")
        with pytest.raises(CatalogError, match="grouping"):
            cat.ingest(str(tmp_path / "part-*.tar"), info.name, grouping="webdataset")
    with TarReader(paths, readonly=True, dataset=info.name) as again:
        assert again.get_keys() == keys
    with TarReader(paths[0], grouping="webdataset", dataset="wds") as wds:
        assert wds.get_keys() == ["k00", "k01", "k02"]
        assert wds.get_record("k00") == {"seg.png": bytes([0, 0]) * 5, "seg.json": b"{}"}


def test_parity_with_tfd_utils(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    tfd_utils = need("tfd_utils", why="shardcat[bench]")
    path = tmp_path / "p.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        add(tf, "dir/", type=tarfile.DIRTYPE)
        for i in range(20):
            for ext in ("jpg", "json", "seg.png"):
                add(tf, f"dir/ü{i:03d}.{ext}", f"{i}-{ext}".encode() * (i + 1))
        add(tf, "README", b"skipped by both")
        add(tf, f"{'l' * 120}.txt", b"long")
        add(tf, "./dot.cls", b"1")
        add(tf, "sym.jpg", type=tarfile.SYMTYPE, linkname="dir/ü000.jpg")
    theirs = tfd_utils.TarRandomAccess(str(path), index_file=str(tmp_path / "t.tar_index"))
    with contextlib.closing(theirs), TarRandomAccess(str(path)) as ours:
        assert sorted(ours.get_keys()) == sorted(theirs.get_keys())
        assert len(ours) == len(theirs)
        for key in theirs.get_keys():
            assert ours.get_record(key) == theirs.get_record(key)
            for feature in theirs.get_record(key):
                assert ours.get_feature(key, feature) == theirs.get_feature(key, feature)
        assert ours.get_feature("dir/ü003.seg", "png") == b"3-seg.png" * 4
    capsys.readouterr()  # tfd-utils prints its progress


# -- DALI ----------------------------------------------------------------------


def test_wds_index_lines_match_wds2idx(tmp_path: Path):
    path = tmp_path / "w.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for name in ["a.jpg", "a.seg.png", "sub/b.cls", ".hidden.txt", "sub/.h.cls", "c.jpg"]:
            add(tf, name, name.encode())
        add(tf, "link.jpg", type=tarfile.SYMTYPE, linkname="a.jpg")
    off = {n: (o, s) for n, o, s in oracle(path)}

    def group(name: str, ext: str) -> str:
        return f"{ext} {off[name][0]} {off[name][1]} {name}"

    expected = [
        "v1.2 3",
        f"{group('a.jpg', 'jpg')} {group('a.seg.png', 'seg.png')}",
        group("sub/b.cls", "cls"),
        group("c.jpg", "jpg"),
    ]
    assert tar.wds_index_lines(members_of(path)) == expected
    entries = list(TAR.scan(str(path), {}))
    assert list(TAR.index_lines(entries, {"grouping": "webdataset"})) == expected
    tfd_entries = list(TAR.scan(str(path), {"grouping": "tfd"}))  # regrouped as wds2idx does
    assert list(TAR.index_lines(tfd_entries, {"grouping": "tfd"})) == expected
    with pytest.raises(CatalogError, match="position"):
        list(TAR.index_lines(entries, {"key": None}))
    with pytest.raises(CatalogError, match="empty"):
        tar.wds_index_lines([])


def test_export_index_of_a_tar_dataset(tmp_path: Path):
    from shardcat.facade import export

    path = tmp_path / "data-0.tar"
    write_samples(path)
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "x").close()
        (target,) = export.export_index(cat, "x")
    assert target == tmp_path / "data-0.idx"
    lines = target.read_text().splitlines()
    assert lines == tar.wds_index_lines(members_of(path))
    assert lines[0] == "v1.2 2"


def test_get_many_returns_samples_in_the_order_asked(tmp_path: Path):
    """Batch lookups run in sorted key order; the samples must come back in the
    caller's order (they came back sorted: other keys' bytes)."""
    path = tmp_path / "m.tar"
    with tarfile.open(path, "w") as tf:
        for key in ("a", "b", "c", "d"):
            add(tf, f"{key}.bin", key.encode() * 3)
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(path, "m") as reader:
        asked = ["d", "a", "c", "b", "a"]
        assert [r["bin"] for r in reader.get_many(asked)] == [k.encode() * 3 for k in asked]
        assert [r["bin"] for r in reader.get_many_at([3, 0, 2])] == [b"ddd", b"aaa", b"ccc"]
