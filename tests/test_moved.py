"""Old import paths of the modules that moved in 0.2.0 keep working, and warn."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from shardcat.moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_gives_the_module_at_its_new_place(old: str):
    script = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({MOVED[old]!r})\n"
        "assert old is new, (old, new)\n"
        "assert new.__spec__.name == new.__name__ == " + repr(MOVED[old]) + ", new.__spec__\n"
        "print([(w.category.__name__, str(w.message)) for w in caught])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    message = f"{old} moved to {MOVED[old]} in shardcat 0.2.0; import it from there"
    assert f"('DeprecationWarning', {message!r})" in out


def test_from_an_old_module_import_a_name():
    sys.modules.pop("shardcat.readers.recordio", None)  # as in a process that never imported it
    with pytest.warns(DeprecationWarning, match="shardcat.readers.recordio moved to"):
        from shardcat.readers.recordio import RecordIOWriter
    from shardcat.formats.recordio import RecordIOWriter as new

    assert RecordIOWriter is new


def test_format_names_from_shardcat_readers_warn():
    import shardcat.formats
    import shardcat.readers

    shardcat.readers.__dict__.pop("Format", None)
    moved = r"shardcat.readers.Format moved to shardcat.formats"
    with pytest.warns(DeprecationWarning, match=moved):
        assert shardcat.readers.Format is shardcat.formats.Format
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        _ = shardcat.readers.nothing


def test_an_entry_point_naming_the_old_path_still_loads():
    from importlib.metadata import EntryPoint

    sys.modules.pop("shardcat.readers.parquet", None)
    point = EntryPoint("parquet", "shardcat.readers.parquet:ParquetFormat", "shardcat.formats")
    with pytest.warns(DeprecationWarning):
        loaded = point.load()
    assert loaded is importlib.import_module("shardcat.formats.parquet").ParquetFormat


def test_a_name_that_never_existed_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("shardcat.readers.nothing_here")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("shardcat.legacy.nothing_here")
