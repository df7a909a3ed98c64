"""The format registry from outside the package: a format defined here, in a test
module, registered with the public :func:`shardcat.register_format`, passes the
same contract suite as the built-in ones (:mod:`shardcat.testing.formats`), and
the registry's refusals are clear errors."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from shardcat import (
    Catalog,
    CatalogError,
    CorruptRecordError,
    Format,
    IngestError,
    IngestOptions,
    Location,
)
from shardcat import register_format as public_register_format
from shardcat.facade.export import export_index
from shardcat.formats import registry as formats
from shardcat.formats.base import Entry
from shardcat.formats.registry import get_format, known_formats, register_format
from shardcat.sources.rawio import Source, pread_exact
from shardcat.testing.formats import FormatContract, Records

MAGIC = b"TOYREC1\n"
FRAME = struct.Struct("<cI")  # b"R", payload length


class ToyFormat(Format):
    """Records framed as ``b"R" + u32 length + JSON`` after a magic line: a format
    as a third party would write one, knowing nothing of the catalog."""

    NAME = "toy"
    TITLE = "toy records"
    EXTENSIONS = (".toy",)
    MAGIC = MAGIC

    def sniff(self, head: bytes) -> bool:
        return head.startswith(self.MAGIC)

    def scan(self, path: str, options: Mapping[str, Any]) -> Iterator[Entry]:
        data = Path(path).read_bytes()
        if not data.startswith(self.MAGIC):
            raise CorruptRecordError(path, 0, "not a toy file")
        at = len(self.MAGIC)
        while at < len(data):
            if len(data) - at < FRAME.size or data[at : at + 1] != b"R":
                raise CorruptRecordError(path, at, "bad frame")
            _, length = FRAME.unpack_from(data, at)
            if at + FRAME.size + length > len(data):
                raise CorruptRecordError(path, at, "truncated record")
            payload = json.loads(data[at + FRAME.size : at + FRAME.size + length])
            values = {k: base64.b64decode(v) for k, v in payload["features"].items()}
            fields = {k: v.decode() for k, v in values.items() if len(v) < 8 and v.isascii()}
            yield Entry(payload["key"], at, FRAME.size + length, fields)
            at += FRAME.size + length

    def read(self, source: Source, location: Location, verify: bool = False) -> bytes:
        frame = pread_exact(source, location.offset, location.length)
        if frame[:1] != b"R":
            raise CorruptRecordError(source.path, location.offset, "bad frame")
        return frame[FRAME.size :]

    def decode(self, raw: Any, options: Mapping[str, Any]) -> dict[str, bytes]:
        features = json.loads(raw)["features"]
        return {k: base64.b64decode(v) for k, v in features.items()}

    def feature_list(self, record: Any, name: str) -> Sequence[Any] | None:
        return [record[name]] if name in record else None


def write_toy(path: Path, records: Records, magic: bytes = MAGIC) -> list[int]:
    offsets, out = [], bytearray(magic)
    for key, features in records:
        payload = json.dumps(
            {"key": key, "features": {k: base64.b64encode(v).decode() for k, v in features.items()}}
        ).encode()
        offsets.append(len(out))
        out += FRAME.pack(b"R", len(payload)) + payload
    path.write_bytes(bytes(out))
    return offsets


class ToyPlus(ToyFormat):
    """The toy with capabilities beyond the core, defined as a format written against
    the old ``Format`` defined its optional methods: found by their names alone."""

    NAME = "toyplus"
    TITLE = "toy records with capabilities"
    EXTENSIONS = (".toyp",)
    MAGIC = b"TOYREC2\n"

    def features(self, record: Any) -> dict[str, list[Any]]:
        return {name: [value] for name, value in record.items()}

    def describe(self, record: Any) -> dict[str, str]:
        return {name: "bytes" for name in record}

    def detect_options(self, path: str, sidecar: bool | None = None) -> dict[str, Any]:
        return {"flavour": "plus"}

    def field_types(self, options: Mapping[str, Any]) -> dict[str, str]:
        return {"label": "text", "note": "text"} if options.get("fields", True) else {}

    def index_lines(self, entries: Sequence[Entry], options: Mapping[str, Any]) -> Iterator[str]:
        for entry in entries:
            yield f"{entry.offset} {entry.length}"


def private_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the registry for one test, the installed formats (entry points) read
    into the real one first: they are read once per process."""
    formats.known_formats()
    monkeypatch.setattr(formats, "_registry", dict(formats._registry))


@pytest.fixture
def toy_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """``toy`` and ``toyplus`` in the registry for one test (the registry as it was
    afterwards)."""
    private_registry(monkeypatch)
    public_register_format("toy", ToyFormat)
    public_register_format("toyplus", ToyPlus)


@pytest.mark.usefixtures("toy_registered")
class TestToyFormat(FormatContract):
    FORMAT = "toy"
    SUFFIX = ".toy"
    CHECKSUM = False

    def write(self, path: Path, records: Records) -> list[int]:
        return write_toy(path, records)


class TestToyPlusFormat(TestToyFormat):
    """A third-party format gets the contract of each capability it has."""

    FORMAT = "toyplus"
    SUFFIX = ".toyp"

    def write(self, path: Path, records: Records) -> list[int]:
        return write_toy(path, records, ToyPlus.MAGIC)


def test_the_format_core_is_small():
    """The methods every format has: six (the abstract five and the stream scan),
    the key rule and the scan of a whole shard made of the two scans."""
    methods = {
        name
        for name, value in vars(Format).items()
        if callable(value) and not name.startswith("__")
    }
    assert methods == {
        "sniff",
        "scan",
        "scan_stream",
        "read",
        "decode",
        "feature_list",
        "key_rule",
        "scan_shard",
    }
    assert Format.__abstractmethods__ == {"sniff", "scan", "read", "decode", "feature_list"}


@pytest.mark.usefixtures("toy_registered")
def test_capabilities_are_found_by_their_methods(tmp_path: Path):
    """What a format without a capability gets, and one with it, through the catalog:
    features, declared SQL columns, detected options and DALI index files."""
    records: Records = [("a", {"label": b"x", "image": b"\0" * 9}), ("b", {"label": b"y"})]
    write_toy(tmp_path / "a.toy", records)
    starts = write_toy(tmp_path / "a.toyp", records, ToyPlus.MAGIC)
    ends = [*starts[1:], (tmp_path / "a.toyp").stat().st_size]
    with Catalog(tmp_path / "c.sqlite") as cat:
        with cat.ingest(tmp_path / "a.toy", "core", format="toy") as reader:
            assert reader.features(reader["a"]) == {} and reader.describe() == {}
            assert reader.get_feature("a", "image") == b"\0" * 9
        with pytest.raises(CatalogError, match=r"^DALI has no index file for toy records shards$"):
            export_index(cat, "core", tmp_path / "dali")
        with cat.ingest(tmp_path / "a.toyp", "plus") as reader:
            assert reader.to_dict(reader["a"]) == {"label": b"x", "image": b"\0" * 9}
            assert reader.describe() == {"label": "bytes", "image": "bytes"}
            assert reader.options["flavour"] == "plus"
        assert cat.query("SELECT key, label, note FROM plus ORDER BY key") == [
            ("a", "x", None),
            ("b", "y", None),
        ]
        (written,) = export_index(cat, "plus", tmp_path / "dali")
        lines = [f"{a} {b - a}\n" for a, b in zip(starts, ends, strict=True)]
        assert written.read_text() == "".join(lines)


class PiecesToy(ToyFormat):
    """A toy that claims one-range records but scans locations of two pieces."""

    ONE_RANGE = True

    def scan(self, path: str, options: Mapping[str, Any]) -> Iterator[Entry]:
        for entry in super().scan(path, options):
            entry.extents = ((entry.offset, 1), (entry.offset + 1, entry.length - 1))
            yield entry


def test_a_one_range_format_with_pieces_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Readers of ONE_RANGE formats read offset and length only: a location of
    pieces would be read wrong, so the ingest refuses to index it."""
    private_registry(monkeypatch)
    register_format("toy", PiecesToy)
    write_toy(tmp_path / "a.toy", [("a", {"image": b"x"})])
    with Catalog(tmp_path / "c.sqlite") as cat:
        with pytest.raises(IngestError, match="declares every record one byte range"):
            cat.ingest(tmp_path / "a.toy", "d", format="toy")
        assert cat.datasets() == []  # a first ingest that indexed nothing leaves none


def test_no_test_leaves_a_format_behind():
    assert {"tfrecord", "recordio", "tar"} <= set(known_formats())
    assert not {"toy", "toyplus", "ghost"} & set(known_formats())


def test_a_name_is_registered_once(toy_registered: None):
    with pytest.raises(CatalogError, match="a format named 'toy' is registered already"):
        register_format("toy", ToyFormat)
    register_format("toy", ToyFormat(), replace=True)
    assert isinstance(get_format("toy"), ToyFormat)
    with pytest.raises(CatalogError, match="is named 'toy', not 'other'"):
        register_format("other", ToyFormat)


def test_a_lazy_format_names_what_to_install(monkeypatch: pytest.MonkeyPatch):
    private_registry(monkeypatch)
    register_format("ghost", "no_such_module_here:Ghost", install_hint="pip install ghost")
    assert "ghost" in known_formats()
    with pytest.raises(CatalogError) as err:
        get_format("ghost")
    assert str(err.value) == (
        "format 'ghost' needs no_such_module_here, which is not installed: pip install ghost"
    )
    register_format("nothing", f"{__name__}:NoSuchClass")
    with pytest.raises(CatalogError, match=f"{__name__} has no NoSuchClass"):
        get_format("nothing")
    register_format("notaformat", f"{__name__}:write_toy")
    with pytest.raises(CatalogError, match="is not a shardcat Format named 'notaformat'"):
        get_format("notaformat")


def test_a_format_that_cannot_be_imported_is_no_candidate_for_detection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    private_registry(monkeypatch)
    register_format("ghost", "no_such_module_here:Ghost")
    path = tmp_path / "x.toy"
    write_toy(path, [("a", {"image": b"1"})])
    with pytest.raises(CatalogError, match="cannot tell the container format"):
        formats.detect_format(str(path))


def test_a_format_must_declare_the_abstract_methods():
    class Half(Format):
        NAME = "half"
        TITLE = "half"

        def sniff(self, head: bytes) -> bool:
            return False

    with pytest.raises(TypeError, match="abstract"):
        Half()  # type: ignore[abstract]


def test_ingest_options_refuse_an_unknown_duplicate_policy():
    with pytest.raises(CatalogError, match="on_duplicate must be one of error, first, last"):
        IngestOptions(on_duplicate="newest")
    opts = IngestOptions(key=None, fields=False, options={"grouping": "tfd"})
    assert opts.explicit() == {"key": None, "fields": False, "grouping": "tfd"}
    with pytest.raises(AttributeError):
        opts.rescan = True  # type: ignore[misc]
