"""What users of webdataset, fsspec, torch and tfd-utils expect on day one (issue 28):
shard specs with braces and file:// URLs, whole values in piped output, torch's
sampler conventions, help without internal types, commands on shard files,
formats named per file, bad catalog paths refused, and the small things."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardcat.cli import app
from shardcat.paths import resolve_paths
from shardcat.sample import make_sample

runner = CliRunner()


def run(*args: object, ok: bool = True):
    result = runner.invoke(app, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output + str(result.exception)
    return result


def catalog_cli(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The ``catalog`` command in a subprocess, stdout piped (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "shardcat", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "80"},
        check=False,
    )


# -- 1. shard specs -------------------------------------------------------------------


def test_brace_ranges_and_choices_expand_for_local_paths(tmp_path: Path):
    shards = make_sample(tmp_path / "wds", shards=4, records=40, format="tar")
    spec = str(tmp_path / "wds" / "train-{00000..00003}-of-00004.tar")
    assert resolve_paths(spec) == shards
    choice = str(tmp_path / "wds" / "train-0000{1,3}-of-00004.tar")
    assert resolve_paths(choice) == [shards[1], shards[3]]
    cat = tmp_path / "c.sqlite"
    result = run("ingest", spec, "-d", "wds", "-c", cat, "-w", "1")
    assert "dataset wds: 40 records in 4 shards" in result.output


def test_file_urls_are_local_paths(tmp_path: Path):
    shards = make_sample(tmp_path / "tfr", shards=2, records=10)
    url = f"file://{tmp_path}/tfr/*.tfrecord"
    assert resolve_paths(url) == shards
    assert resolve_paths(f"file://localhost{shards[0]}") == shards[:1]
    result = run("ingest", url, "-d", "t", "-c", tmp_path / "c.sqlite", "-w", "1")
    assert "dataset t: 10 records in 2 shards" in result.output


def test_a_file_named_with_braces_is_taken_as_it_is(tmp_path: Path):
    (tmp_path / "odd{1,2}.tfrecord").write_bytes(b"")
    assert resolve_paths(str(tmp_path / "odd{1,2}.tfrecord")) == [
        str(tmp_path / "odd{1,2}.tfrecord")
    ]


# -- 2. whole values on a pipe ----------------------------------------------------------


@pytest.fixture
def long_named(tmp_path: Path) -> Path:
    """A catalog over shards whose paths are far longer than 80 characters."""
    deep = tmp_path / ("a_directory_with_a_long_name_" * 3) / "train"
    make_sample(deep, shards=2, records=20)
    cat = tmp_path / "c.sqlite"
    run("ingest", deep, "-d", "big", "-c", cat, "-w", "1")
    return cat


def test_query_to_a_pipe_prints_whole_values(long_named: Path):
    done = catalog_cli("query", "SELECT key, shard FROM big ORDER BY key LIMIT 2", "-c", long_named)
    assert done.returncode == 0, done.stderr
    shard = ("a_directory_with_a_long_name_" * 3) + "/train/train-00000-of-00002.tfrecord"
    assert shard in done.stdout  # the shard's path relative to the catalog, whole
    assert "rec_000000000" in done.stdout and "…" not in done.stdout


def test_datasets_stats_list_to_a_pipe_print_whole_values(long_named: Path):
    stats = catalog_cli("stats", "big", "-c", long_named)
    assert "│ train-00001-of-00002.tfrecord │ 10 " in stats.stdout
    for command in (("datasets",), ("list", "big")):
        done = catalog_cli(*command, "-c", long_named)
        assert done.returncode == 0, done.stderr
        assert "…" not in done.stdout, done.stdout
    assert "tfrecord" in catalog_cli("datasets", "-c", long_named).stdout


def test_demo_output_in_a_file_has_whole_values(tmp_path: Path):
    log = tmp_path / "demo.log"
    venv = Path(sys.executable).parent.parent
    with log.open("w") as out:
        done = subprocess.run(
            ["sh", str(Path(__file__).parent.parent / "scripts" / "demo.sh")],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "VENV": str(venv), "DEMO_DIR": str(tmp_path / "demo")},
            check=False,
        )
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    assert "demo OK" in text and "…" not in text
    assert time_like(text)


def time_like(text: str) -> bool:
    """The datasets table's 'created' column whole: a YYYY-MM-DD HH:MM value."""
    import re

    return re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", text) is not None


# -- 3. torch's sampler conventions -------------------------------------------------------


def test_sampler_shuffles_by_default_and_takes_true_as_full(tmp_path: Path):
    from torch.utils.data import DataLoader, DistributedSampler

    from shardcat import TFRecordRandomAccess
    from shardcat.torch import RecordDataset, RecordSampler

    make_sample(tmp_path / "t", shards=2, records=64)
    with TFRecordRandomAccess(str(tmp_path / "t" / "*.tfrecord")) as reader:
        dataset = RecordDataset(reader, transform=lambda ex: reader.to_dict(ex)["key"].decode())
        default = RecordSampler(dataset, num_replicas=1, rank=0, seed=5)
        as_torch = RecordSampler(dataset, num_replicas=1, rank=0, seed=5, shuffle=True)
        full = RecordSampler(dataset, num_replicas=1, rank=0, seed=5, shuffle="full")
        assert default.shuffle == as_torch.shuffle == "full"
        assert DistributedSampler(dataset, num_replicas=1, rank=0).shuffle  # torch's default
        batches = list(DataLoader(dataset, sampler=default, batch_size=16))
        keys = [k for batch in batches for k in batch]
        in_order = [f"rec_{i:09d}" for i in range(64)]
        assert sorted(keys) == in_order and keys != in_order
        assert keys == [k for b in DataLoader(dataset, sampler=as_torch, batch_size=16) for k in b]
        assert default.global_order().tolist() == full.global_order().tolist()
        state = as_torch.state_dict()
        full.load_state_dict(state)  # True and "full" are one order
        ordered = RecordSampler(dataset, num_replicas=1, rank=0, shuffle=False)
        assert [k for b in DataLoader(dataset, sampler=ordered, batch_size=16) for k in b] == (
            in_order
        )


# -- 4. help and conventions ------------------------------------------------------------


def _commands() -> list[str]:
    return [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands]


def test_help_shows_no_python_types():
    for name in _commands():
        text = run(name, "--help").output
        usage = text.split("\n\n")[0]
        assert "{" not in usage, usage
        for internal in ("<str>", "<int", "<list[", "<float>", "<path>", "range>"):
            assert internal not in text, f"catalog {name} --help: {text}"
    ingest = run("ingest", "--help").output
    assert "ingest [OPTIONS] PATHS..." in ingest
    assert "--storage-option KEY=VALUE" in ingest and "-w, --workers N" in ingest
    assert "--depth DEPTH" in run("migrate", "--help").output


def test_version_and_parquet_in_the_top_level_help():
    from shardcat import __version__

    assert run("--version").output == f"catalog (shardcat) {__version__}\n"
    assert "Parquet" in run("--help").output


def test_one_meaning_per_short_option():
    meanings: dict[str, set[str]] = {}
    for name in _commands():
        command = next(
            c
            for c in app.registered_commands
            if (c.name or "") == name or (c.callback.__name__.replace("_", "-") == name)
        )
        import typer

        click_command = typer.main.get_command_from_info(
            command, pretty_exceptions_short=True, rich_markup_mode=None
        )
        for param in click_command.params:
            if getattr(param, "hidden", False):
                continue
            longs = [o for o in param.opts if o.startswith("--")]
            for short in (o for o in param.opts if len(o) == 2):
                meanings.setdefault(short, set()).update(longs)
    wrong = {s: m for s, m in meanings.items() if len(m) > 1 and m != {"--output", "--output-dir"}}
    assert not wrong, wrong


def test_old_short_options_still_work_with_a_warning(tmp_path: Path):
    make_sample(tmp_path / "t", shards=1, records=5)
    result = run("ingest", tmp_path / "t", "-c", tmp_path / "c.sqlite", "-o", "anon=true")
    assert "warning: -o is --storage-option here for now" in result.output


@pytest.mark.parametrize("workers", ["0", "-3"])
def test_workers_below_one_are_refused(tmp_path: Path, workers: str):
    make_sample(tmp_path / "t", shards=1, records=5)
    cat = tmp_path / "c.sqlite"
    result = run("ingest", tmp_path / "t", "-c", cat, "--workers", workers, ok=False)
    assert result.exit_code == 2 and "greater than or equal to 1" in result.output
    assert not cat.exists()


def test_help_imports_no_library():
    code = (
        "import sys\nfrom shardcat.cli import app\n"
        "heavy = [m for m in ('sqlalchemy', 'numpy', 'google.protobuf', 'torch', 'fsspec')"
        " if m in sys.modules]\nprint(heavy)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "[]\n"
    done = subprocess.run(
        [sys.executable, "-c", "import shardcat, sys; print('sqlalchemy' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout == "False\n"


# -- 7. bad catalog paths ------------------------------------------------------------------


def test_a_missing_catalog_directory_is_refused_unless_mkdir(tmp_path: Path):
    make_sample(tmp_path / "t", shards=1, records=5)
    where = tmp_path / "no" / "such" / "c.sqlite"
    result = run("ingest", tmp_path / "t", "-c", where, ok=False)
    assert result.exit_code == 1
    assert f"error: cannot create catalog {where}: no directory {where.parent} (create it, or " \
        "pass --mkdir)" in result.output  # fmt: skip
    assert not (tmp_path / "no").exists()
    run("ingest", tmp_path / "t", "-c", where, "--mkdir")
    assert where.is_file()


def test_a_catalog_that_is_a_directory_is_named_so(tmp_path: Path):
    (tmp_path / "adir.tfrecord").mkdir()
    result = run("datasets", "-c", tmp_path / "adir.tfrecord", ok=False)
    assert f"error: no catalog at {tmp_path / 'adir.tfrecord'}: it is a directory" in result.output


# -- 8. the small things ---------------------------------------------------------------------


@pytest.fixture
def wds(tmp_path: Path) -> Path:
    make_sample(tmp_path / "wds", shards=2, records=20, format="tar")
    cat = tmp_path / "c.sqlite"
    run("ingest", tmp_path / "wds", "-d", "wds", "-c", cat, "-w", "1")
    return cat


def test_list_names_the_json_columns_of_a_json_member(wds: Path):
    done = catalog_cli("list", "wds", "-c", wds)
    row = next(line for line in done.stdout.splitlines() if line.startswith("│ json "))
    assert "json_caption, json_score" in row or "json_score, json_caption" in row


def test_extract_saves_cls_as_a_file_like_other_members(wds: Path, tmp_path: Path):
    out = tmp_path / "out"
    result = run("extract", "wds", "rec_000000003", "-c", wds, "-o", out)
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "rec_000000003_cls_0.txt",
        "rec_000000003_jpg_0.jpg",
        "rec_000000003_json_0.json",
    ]
    label = (out / files[0]).read_text()
    assert f"cls[0] (text): {label} -> {out / files[0]}" in result.output


def test_verify_and_sample_show_counts_rate_and_time(tmp_path: Path):
    sample = catalog_cli("sample", tmp_path / "s", "--records", "3000", "--shards", "2")
    assert sample.returncode == 0, sample.stderr
    assert "3,000/3,000 records" in sample.stderr and "/s " in sample.stderr
    cat = tmp_path / "c.sqlite"
    assert catalog_cli("ingest", tmp_path / "s", "-d", "s", "-c", cat).returncode == 0
    verify = catalog_cli("verify", "s", "-c", cat)
    assert verify.returncode == 0, verify.stderr
    line = next(x for x in verify.stderr.splitlines() if x.startswith("verify"))
    assert "3,000/3,000 records" in line and "/s" in line and "0:00:" in line


def test_ingest_json_summary(tmp_path: Path):
    make_sample(tmp_path / "t", shards=2, records=10)
    cat = tmp_path / "c.sqlite"
    done = catalog_cli("ingest", tmp_path / "t", "-d", "t", "-c", cat, "--json")
    assert done.returncode == 0, done.stderr

    assert json.loads(done.stdout) == {
        "dataset": "t",
        "records": 10,
        "shards": 2,
        "indexed_now": 10,
        "duplicates_dropped": 0,
        "bad_records": 0,
        "catalog": str(cat),
    }


def test_index_files_are_named_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import pickle

    from shardcat import TFRecordRandomAccess

    make_sample(tmp_path / "data", shards=2, records=10)
    monkeypatch.chdir(tmp_path)
    with TFRecordRandomAccess("data/*.tfrecord") as reader:
        assert reader.index["rec_000000007"]["file"] == "data/train-00001-of-00002.tfrecord"
        assert reader.tfrecord_files[0] == str(tmp_path / "data/train-00000-of-00002.tfrecord")
        clone = pickle.loads(pickle.dumps(reader))
        try:
            assert clone.index["rec_000000001"]["file"] == "data/train-00000-of-00002.tfrecord"
        finally:
            clone.close()
    with TFRecordRandomAccess(str(tmp_path / "data")) as reader:
        assert reader.index["rec_000000001"]["file"] == str(
            tmp_path / "data/train-00000-of-00002.tfrecord"
        )


# -- 6. mixed and wrong inputs ---------------------------------------------------------------


def _mixed(tmp_path: Path) -> Path:
    """legacy/: two tar archives and two TFRecord files."""
    legacy = tmp_path / "legacy"
    make_sample(legacy, shards=2, records=10, format="tar")
    for path in make_sample(tmp_path / "tf", shards=2, records=10):
        os.rename(path, legacy / ("z" + os.path.basename(path)))
    return legacy


def test_files_of_another_format_are_named_for_what_they_are(tmp_path: Path):
    legacy = _mixed(tmp_path)
    cat = tmp_path / "c.sqlite"
    result = run("ingest", f"{legacy}/*", "-d", "mixed", "-c", cat, "-w", "1", ok=False)
    for name in ("ztrain-00000-of-00002.tfrecord", "ztrain-00001-of-00002.tfrecord"):
        assert (
            f"failed: {legacy / name} is a TFRecord file, not a tar file (a dataset holds "
            "files of one format)" in result.output
        )
    assert "error: 2 shard(s) failed; the other shards are in the catalog" in result.output


def test_a_failed_first_open_leaves_no_catalog_beside_the_shards(tmp_path: Path):
    from shardcat import IngestError, TFRecordRandomAccess

    shards = make_sample(tmp_path / "wds", shards=1, records=5, format="tar")
    with pytest.raises(IngestError, match="is a tar file, not a TFRecord file"):
        TFRecordRandomAccess(shards[0])
    assert sorted(os.listdir(tmp_path / "wds")) == ["train-00000-of-00001.tar"]


def test_a_failed_first_ingest_leaves_no_empty_dataset_or_catalog(tmp_path: Path):
    shard = Path(make_sample(tmp_path / "t", shards=1, records=50)[0])
    shard.write_bytes(shard.read_bytes()[:-10])  # truncated
    cat = tmp_path / "c.sqlite"
    result = run("ingest", shard, "-d", "t", "-c", cat, ok=False)
    assert result.exit_code == 1 and "error: " in result.output
    assert sorted(os.listdir(tmp_path)) == ["t"]  # no catalog, no -wal/-shm
    good = make_sample(tmp_path / "g", shards=1, records=5)
    run("ingest", good[0], "-d", "g", "-c", cat)
    run("ingest", shard, "-d", "t", "-c", cat, ok=False)
    datasets = json.loads(run("datasets", "-c", cat, "--json").stdout)
    assert [d["name"] for d in datasets] == ["g"]  # no empty dataset t


def test_a_reader_process_leaves_no_wal_or_shm(tmp_path: Path):
    make_sample(tmp_path / "t", shards=2, records=10)
    code = (
        "import sys\nfrom shardcat import TFRecordRandomAccess\n"
        "with TFRecordRandomAccess(sys.argv[1]) as r:\n"
        "    assert r['rec_000000003'] is not None\n"
    )
    for _ in range(2):  # the first indexes, the second only reads
        subprocess.run([sys.executable, "-c", code, str(tmp_path / "t")], check=True)
        assert sorted(os.listdir(tmp_path / "t")) == [
            "shardcat.sqlite",
            "train-00000-of-00002.tfrecord",
            "train-00001-of-00002.tfrecord",
        ]


# -- 5. commands on shard files ----------------------------------------------------------------


def test_list_get_extract_stats_on_shard_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from shardcat import TFRecordRandomAccess

    make_sample(tmp_path / "tfr", shards=2, records=10)
    monkeypatch.chdir(tmp_path)  # no ./shardcat.sqlite here
    listed = run("list", "tfr/train-00000-of-00002.tfrecord")
    assert "first record: rec_000000000" in listed.output
    assert f"catalog: {tmp_path / 'tfr' / 'shardcat.sqlite'}" in listed.output
    got = run("get", "tfr/*.tfrecord", "rec_000000007", "caption")
    assert got.stdout == "sample 7"
    stats = json.loads(run("stats", "tfr/*.tfrecord", "--json").stdout)
    assert stats["total_records"] == 10 and stats["total_files"] == 2
    run("extract", "tfr", "rec_000000003", "-o", "out")
    assert (tmp_path / "out" / "rec_000000003_image_0.jpg").is_file()
    assert not (tmp_path / "shardcat.sqlite").exists()
    # the catalog the Python readers of these shards use: no re-indexing there
    with TFRecordRandomAccess("tfr/*.tfrecord") as reader:
        assert reader.catalog.path == tmp_path / "tfr" / "shardcat.sqlite"
        assert reader.get_feature("rec_000000007", "caption") == b"sample 7"


def test_a_name_that_is_neither_dataset_nor_file_keeps_its_error(tmp_path: Path):
    cat = tmp_path / "c.sqlite"
    make_sample(tmp_path / "t", shards=1, records=3)
    run("ingest", tmp_path / "t", "-d", "t", "-c", cat)
    result = run("list", "nope", "-c", cat, ok=False)
    assert f"error: no dataset 'nope' in {cat} (it has: t)" in result.output
    result = run("list", tmp_path / "t", "-c", cat, ok=False)  # --catalog: datasets only
    assert f"error: no dataset '{tmp_path / 't'}' in {cat}" in result.output


def test_the_cli_copies_of_library_defaults_agree():
    """What the help shows without importing the library is the library's value."""
    from shardcat.cli import ingest, migrate
    from shardcat.migrations.legacy.verify import DEFAULT_SAMPLE
    from shardcat.sample import SAMPLE_FORMATS

    assert migrate.DEFAULT_SAMPLE == DEFAULT_SAMPLE
    assert ", ".join(SAMPLE_FORMATS) == ingest._SAMPLE_FORMATS


def test_lazy_packages_still_reach_their_modules_as_attributes():
    code = (
        "import shardcat\n"
        "print(shardcat.catalog.engine.DEFAULT_NAME, shardcat.Catalog.__name__,"
        " 'TensorDB' in dir(shardcat))\n"
        "try:\n    shardcat.nope\nexcept AttributeError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (
        done.stdout == "shardcat.sqlite Catalog True\nmodule 'shardcat' has no attribute 'nope'\n"
    )
