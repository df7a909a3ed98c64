"""tfd-utils 1.3.0's own test suite, run against shardcat's readers.

"Drop-in" means passing the peer's public tests, not our idea of them. The
tests are not copied here: ``make test`` downloads tfd-utils' sdist into the
git-ignored ``.peer/`` (``make peer-tfd``, which also installs Pillow and
requests, what the peer's test helpers import), and this module unpacks its
``tests/`` into a temporary directory and runs them with pytest in a
subprocess, with the plugin ``PLUGIN`` loaded first: its one line
``sys.modules[...] = shim`` makes ``tfd_utils.random_access`` and
``tfd_utils.tar_random_access`` a module that re-exports shardcat's classes,
so ``from tfd_utils.random_access import TFRecordRandomAccess`` and
``from tfd_utils import TarRandomAccess`` are shardcat's (the real tfd-utils
is installed too, as the ``bench`` extra, and its writer still writes the
test data: the shim must win, and that is checked). A second line maps
``tfd_utils.pb2`` to ``shardcat.pb2``, as a user switching imports does: the
records shardcat returns are ``shardcat.pb2`` messages (built in a private
descriptor pool, the same wire format), and the peer's tests check
``isinstance(record, Example)``. The peer's
helpers download a photo from the web; there is no network here, so the
plugin hands them a JPEG generated with Pillow instead.

Every test of the public API must pass. The tests of tfd-utils' insides (its
pickle file's name and validity check, its shard-set detector, a private
attribute) and of other parts of tfd-utils (its CLI, writer and protos,
TensorFlow interop) are listed in ``OUT_OF_SCOPE`` / ``OUT_OF_SCOPE_FILES``
with the reason and deselected or not run, never skipped; the run checks that
each of them still exists.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from peer_suite import imported, missing, peer_env, run_suite, sdist, unpack_tests

VERSION = "1.3.0"
SDIST_SHA256 = "7f321ca9cac0cd06e7e8680dee6698d4ba9c6575dfba70bc8041b24c09c37f90"

PLUGIN = '''"""pytest plugin: tfd-utils' reader modules are shardcat's."""
import io
import sys
import types

import shardcat
import shardcat.pb2


def _out_of_scope(*args, **kwargs):
    raise NotImplementedError("tfd-utils' index file naming is out of scope for shardcat")


shim = types.ModuleType("tfd_utils.random_access")
shim.TFRecordRandomAccess = shardcat.TFRecordRandomAccess
shim.TarRandomAccess = shardcat.TarRandomAccess
shim._detect_complete_shard_set = _out_of_scope  # imported by a test module; its tests are out
sys.modules["tfd_utils.random_access"] = sys.modules["tfd_utils.tar_random_access"] = shim
sys.modules["tfd_utils.pb2"] = shardcat.pb2  # records are shardcat.pb2 messages


def _generated_jpeg(url=None):
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (320, 240), (200, 120, 40)).save(out, "JPEG", quality=90)
    return out.getvalue()


def pytest_sessionstart(session):
    import tests.helpers.generate_test_data as helpers

    helpers.download_test_image = _generated_jpeg  # no network: a local image
'''

# The test files that are run, and how many tests they hold in all.
RUN = [
    "tests/unit/test_random_access.py",
    "tests/unit/test_tar_random_access.py",
    "tests/integration/integration_test.py",
    "tests/integration/test_readme_examples.py",
]
TOTAL = 78

_NAMING = "tfd-utils' pickle file name (shardcat's index is the catalog file)"
_VALID = "tfd-utils' private _is_index_valid (a check on its pickle file)"
_DETECT = "tfd-utils' private shard-set detector behind its pickle file names"
OUT_OF_SCOPE: dict[str, str] = {
    "tests/unit/test_random_access.py::TestTFRecordRandomAccess::test_is_index_valid": _VALID,
    **{
        f"tests/unit/test_random_access.py::TestTFRecordRandomAccess::{name}": _NAMING
        for name in (
            "test_index_file_naming_single",
            "test_index_file_naming_unified_tot",
            "test_index_file_naming_all_shards",
            "test_index_file_naming_incomplete_shards_falls_back",
            "test_index_path_changes_when_file_count_changes",
        )
    },
    **{
        f"tests/unit/test_random_access.py::TestDetectCompleteShardSet::{name}": _DETECT
        for name in (
            "test_complete_set",
            "test_complete_set_user_example",
            "test_missing_shard",
            "test_inconsistent_total",
            "test_non_shard_filenames",
            "test_handles_compound_extension",
        )
    },
    "tests/unit/test_tar_random_access.py::TestInitialization::"
    "test_use_multiprocessing_disabled_for_single_file": (
        "tfd-utils' internal use_multiprocessing attribute"
    ),
    "tests/unit/test_tar_random_access.py::TestIndex::test_index_file_naming_single": _NAMING,
    "tests/unit/test_tar_random_access.py::TestIndex::test_index_file_naming_unified": _NAMING,
    **{
        f"tests/unit/test_tar_random_access.py::TestIndexValidity::{name}": _VALID
        for name in (
            "test_index_valid_after_build",
            "test_index_invalid_when_missing",
            "test_index_invalid_after_tar_modified",
            "test_index_valid_many_files_uses_parent_dir",
        )
    },
    "tests/integration/test_readme_examples.py::test_01_write_tfrecords": (
        "tests tfd-utils' TFRecordWriter"
    ),
    "tests/integration/test_readme_examples.py::test_03_tensorflow_interoperability": (
        "tests tfd-utils' writer against TensorFlow (not installed)"
    ),
}
OUT_OF_SCOPE_FILES: dict[str, str] = {
    "tests/integration/test_cli.py": "tfd-utils' own `tfd` command (run with `uv run tfd`)",
    "tests/integration/test_pb2_compatibility.py": "tfd_utils.pb2 against TensorFlow's protos",
    "tests/integration/test_tf_writer_compatibility.py": (
        "tfd-utils' TFRecordWriter against TensorFlow's"
    ),
}
IN_SCOPE = TOTAL - len(OUT_OF_SCOPE)  # 57


def test_tfd_utils_suite_passes_against_shardcat(tmp_path: Path) -> None:
    archive = sdist(f"tfd_utils-{VERSION}.tar.gz", SDIST_SHA256, "peer-tfd")
    for module in ("PIL", "requests"):
        if subprocess.run([sys.executable, "-c", f"import {module}"]).returncode != 0:
            missing(f"{module} (imported by tfd-utils' test helpers) is missing: `make peer-tfd`")
    peer = unpack_tests(archive, f"tfd_utils-{VERSION}", tmp_path / "peer")
    for path in [*RUN, *OUT_OF_SCOPE_FILES]:
        assert (peer / path).is_file(), path
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    (plugin_dir / "tfd_shim.py").write_text(PLUGIN)
    (tmp_path / "tmp").mkdir()
    env = peer_env(plugin_dir, tmp_path / "tmp")  # the peer's tests write under mkdtemp()
    assert imported(
        "import tfd_shim, tfd_utils\n"
        "from tfd_utils.random_access import TFRecordRandomAccess\n"
        "print(TFRecordRandomAccess.__module__, TFRecordRandomAccess.__name__,"
        " tfd_utils.TarRandomAccess.__name__)",
        peer,
        env,
    ) == ["shardcat.facade.dropin", "TFRecordReader", "TarReader"]

    run = run_suite(peer, env, tmp_path, RUN, list(OUT_OF_SCOPE), plugins=["tfd_shim"])
    print(f"tfd-utils {VERSION}'s suite against shardcat: {run.summary}")
    assert len(run.outcomes) == IN_SCOPE == 57, run.summary
