"""What ``catalog`` prints when it fails, and which catalog file it uses.

Every failure is one line ``error: ...`` on stderr with exit code 1 (Ctrl-C: 130),
never a traceback, in the CLI's spelling (``--format``, not ``format=``); each
case runs in-process (``CliRunner``) and through the installed ``catalog``
entry point in a subprocess. Read-only directories and mounts are real: a
private read-only bind mount (``unshare -m``) or an unprivileged user
(``setpriv``), since root ignores mode bits.

Where the catalog is: ``--catalog``, else ``$SHARDCAT_CATALOG``, else
``./shardcat.sqlite``, for every command; a command that did not get
``--catalog`` ends with a line naming the file it used.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardcat import Catalog
from shardcat.catalog.versions import SCHEMA_VERSION
from shardcat.cli import app
from shardcat.formats.tfrecord import TFRecordWriter, make_example
from shardcat.sample import make_sample

runner = CliRunner()
HELP_DEFAULT = (
    "Catalog file (default: $SHARDCAT_CATALOG, else ./shardcat.sqlite in the current directory)."
)
RERUN = (
    "interrupted: run the same command again to finish (shards already indexed are not read again)"
)


def _catalog_command() -> list[str]:
    script = Path(sys.executable).with_name("catalog")  # the console script pip installed
    return [str(script)] if script.is_file() else [sys.executable, "-m", "shardcat"]


def _env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SHARDCAT_CATALOG", "SHARDCAT_DEBUG")}
    env.update(changes)
    return env


def real(
    *args: object,
    cwd: Path | None = None,
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``catalog ARGS`` through the installed entry point, in a subprocess."""
    return subprocess.run(
        [*prefix, *_catalog_command(), *map(str, args)],
        cwd=cwd,
        env=_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def fails_alike(args: Sequence[object], message: str, *, cwd: Path | None = None) -> None:
    """``catalog ARGS`` fails with exactly ``error: MESSAGE`` (one line on stderr,
    nothing on stdout, exit code 1), in-process and in a subprocess."""
    expected = (1, "", f"error: {message}\n")
    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = runner.invoke(app, [str(a) for a in args])
    finally:
        os.chdir(old)
    assert (result.exit_code, result.stdout, result.stderr) == expected, result.exception
    done = real(*args, cwd=cwd)
    assert (done.returncode, done.stdout, done.stderr) == expected


def _shard(path: Path, keys: Sequence[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with TFRecordWriter(path) as writer:
        for key in keys:
            writer.write(make_example({"key": key, "label": len(key)}))
    return path


def _catalog(db: Path, shard: Path, dataset: str = "train") -> Path:
    """A closed catalog holding ``shard`` as ``dataset``, with no -wal or -shm left."""
    with Catalog(db) as cat:
        cat.ingest(str(shard), dataset, workers=1).close()
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    return db


# -- 1. what --catalog names --------------------------------------------------------------


def test_a_catalog_that_is_a_text_file_or_a_pickle(tmp_path: Path) -> None:
    shard = _shard(tmp_path / "s" / "a.tfrecord", ["k0", "k1"])
    text = tmp_path / "notes.txt"
    text.write_text("not a catalog\n" * 40)
    pickled = tmp_path / "train.index"
    pickled.write_bytes(pickle.dumps({"k0": {"file": str(shard), "offset": 0, "length": 9}}))
    for path in (text, pickled):
        before = path.read_bytes()
        for command in (
            ["ingest", shard, "-d", "t"],
            ["datasets"],
            ["query", "SELECT 1"],
            ["drop", "t"],
            ["checkpoint"],
        ):
            fails_alike(
                [*command, "-c", path], f"cannot open catalog {path}: file is not a database"
            )
        assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "s", "train.index"]


def test_a_catalog_path_inside_a_file(tmp_path: Path) -> None:
    shard = _shard(tmp_path / "s" / "a.tfrecord", ["k0"])
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    db = a_file / "cat.sqlite"
    fails_alike(
        ["ingest", shard, "-c", db], f"cannot create catalog {db}: {a_file} is not a directory"
    )
    for command in (["datasets"], ["drop", "t"], ["get", "t", "k0", "label"]):
        fails_alike([*command, "-c", db], f"no catalog at {db}: {a_file} is not a directory")
    deeper = a_file / "sub" / "cat.sqlite"
    fails_alike(
        ["ingest", shard, "-c", deeper],
        f"cannot create catalog {deeper}: {a_file} is not a directory",
    )
    directory = tmp_path / "s"
    fails_alike(
        ["ingest", shard, "-c", directory], f"cannot open catalog {directory}: it is a directory"
    )


# -- 1. read-only directories, mounts and files ---------------------------------------------

_MOUNT_THEN_RUN = (
    'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && cd "$2" && shift 2 && exec "$@"'
)


def _read_only_mount(directory: Path, cwd: Path) -> list[str] | None:
    """A prefix running a command in ``cwd`` with ``directory`` mounted read-only
    (a bind mount in a private mount namespace), or None when that cannot be done."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return None
    for unshare in (["unshare", "-m"], ["unshare", "-rm"]):
        prefix = [*unshare, "sh", "-c", _MOUNT_THEN_RUN, "sh", str(directory), str(cwd)]
        probe = [*prefix, "sh", "-c", 'test ! -w "$0" && ! touch "$0/.probe" 2>/dev/null']
        done = subprocess.run([*probe, str(directory)], capture_output=True, check=False)
        if done.returncode == 0:
            return prefix
    return None


def _killed_writer(db: Path) -> None:
    """Commit a change and die: the commit stays in ``db``'s -wal file only."""
    code = (
        "import os, sqlite3, sys\n"
        "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "conn.execute('PRAGMA wal_autocheckpoint = 0')\n"
        "conn.execute('UPDATE shardcat_datasets SET created_at = 86400')\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(db)], check=True)


def test_read_only_mount(tmp_path: Path) -> None:
    mount = tmp_path / "ro"
    shard = _shard(mount / "a.tfrecord", ["k0", "k1", "k2"])
    db = _catalog(mount / "shardcat.sqlite", shard)
    dirty = _catalog(mount / "dirty.sqlite", shard)
    _killed_writer(dirty)
    Path(f"{dirty}-shm").unlink()  # as copied from where it was written: main file and -wal
    outside = _shard(tmp_path / "w" / "b.tfrecord", ["b0"])
    listing = sorted(p.name for p in mount.iterdir())
    prefix = _read_only_mount(mount, mount)
    if prefix is None:
        pytest.skip("cannot mount a directory read-only here (neither unshare -m nor -rm works)")

    def in_mount(*args: object) -> subprocess.CompletedProcess[str]:
        return real(*args, prefix=prefix)

    def fails(args: Sequence[object], message: str) -> None:
        done = in_mount(*args)
        assert (done.returncode, done.stdout, done.stderr) == (1, "", f"error: {message}\n")

    read_only = (
        f"cannot write catalog {db}: it is on a read-only file system "
        "(commands that only read it work)"
    )
    fails(["ingest", outside, "-d", "b"], read_only)  # ./shardcat.sqlite, in the mount
    fails(["ingest", outside, "-d", "b", "-c", db], read_only)
    fails(["drop", "train"], read_only)
    fails(["checkpoint", "-c", db], read_only)
    new = mount / "new.sqlite"
    fails(
        ["ingest", outside, "-c", new],
        f"cannot create catalog {new}: {mount} is on a read-only file system",
    )
    fails(
        ["datasets", "-c", dirty],
        f"cannot open {dirty} read-only: SQLite needs to create {dirty}-shm (the directory is "
        f"read-only) to read the commits in {dirty}-wal; checkpoint it where it is written "
        f"(`catalog checkpoint -c {dirty}`)",
    )
    done = in_mount("query", "SELECT count(*) AS n FROM train", "--json")
    assert (done.returncode, json.loads(done.stdout)) == (0, [{"n": 3}])
    assert done.stderr == f"catalog: {db} (default: ./shardcat.sqlite)\n"
    done = in_mount("get", "train", "k1", "label", "-c", db)
    assert (done.returncode, done.stdout, done.stderr) == (0, "2\n", "")
    assert sorted(p.name for p in mount.iterdir()) == listing


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can read (pytest's tmp_path is private to its user)."""
    directory = Path(tempfile.mkdtemp(prefix="shardcat-test-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        for path in (directory, *directory.rglob("*")):
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(directory)


def _unprivileged() -> list[str] | None:
    """A prefix running a command as a user the mode bits apply to: none when this
    is not root, ``setpriv`` to nobody when it is; None when neither works."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        return None
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    done = subprocess.run(
        [*prefix, sys.executable, "-c", "import shardcat.cli"], capture_output=True
    )
    return prefix if done.returncode == 0 else None


def _locked_catalogs(shared_dir: Path) -> dict[str, Path]:
    """``locked/``, a read-only directory holding a catalog anybody may write
    (``writable``) and one nobody may (``sealed``); ``open/``, a writable directory
    holding a read-only catalog (``frozen``); the shard they index."""
    shard = _shard(shared_dir / "shards" / "a.tfrecord", ["k0", "k1"])
    locked, open_dir = shared_dir / "locked", shared_dir / "open"
    found = {
        "shard": shard,
        "writable": _catalog(locked / "writable.sqlite", shard),
        "sealed": _catalog(locked / "sealed.sqlite", shard),
        "frozen": _catalog(open_dir / "frozen.sqlite", shard),
    }
    found["writable"].chmod(0o666)
    found["sealed"].chmod(0o444)
    found["frozen"].chmod(0o444)
    open_dir.chmod(0o777)
    locked.chmod(0o555)
    return found


def test_read_only_directory_and_file_for_an_unprivileged_user(shared_dir: Path) -> None:
    prefix = _unprivileged()
    if prefix is None:
        pytest.skip("running as root without a working setpriv: mode bits cannot be tested")
    dbs = _locked_catalogs(shared_dir)
    shard, locked = dbs["shard"], shared_dir / "locked"

    def fails(args: Sequence[object], message: str, cwd: Path | None = None) -> None:
        done = real(*args, prefix=prefix, cwd=cwd)
        assert (done.returncode, done.stdout, done.stderr) == (1, "", f"error: {message}\n")

    only_reads = " (commands that only read it work)"
    new = locked / "new.sqlite"
    fails(
        ["ingest", shard, "-c", new],
        f"cannot create catalog {new}: no permission to create files in {locked}",
    )
    default = locked / "shardcat.sqlite"
    fails(
        ["ingest", shard],
        f"cannot create catalog {default}: no permission to create files in {locked}",
        cwd=locked,
    )
    writable = dbs["writable"]
    fails(
        ["drop", "train", "-c", writable],
        f"cannot write catalog {writable}: SQLite needs to create writable.sqlite-wal and "
        f"writable.sqlite-shm beside it, but no permission to create files in {locked}"
        + only_reads,
    )
    for db in (dbs["sealed"], dbs["frozen"]):
        for command in (["ingest", shard, "-d", "t2"], ["drop", "train"], ["checkpoint"]):
            fails(
                [*command, "-c", db],
                f"cannot write catalog {db}: no permission to write it" + only_reads,
            )
    sealed = dbs["sealed"]
    for db, mode in ((sealed, "--immutable"), (dbs["frozen"], "--readonly")):
        done = real("stats", "train", "--json", mode, "-c", db, prefix=prefix)
        assert (done.returncode, done.stderr) == (0, "")
        assert json.loads(done.stdout)["total_records"] == 2
    assert sorted(p.name for p in locked.iterdir()) == ["sealed.sqlite", "writable.sqlite"]


def test_reading_a_catalog_in_a_read_only_directory(shared_dir: Path) -> None:
    prefix = _unprivileged()
    if prefix is None:
        pytest.skip("running as root without a working setpriv: mode bits cannot be tested")
    db = _locked_catalogs(shared_dir)["sealed"]
    done = real("stats", "train", "--json", "-c", db, prefix=prefix)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert json.loads(done.stdout)["total_records"] == 2


# -- 1. damaged data, failed shards ---------------------------------------------------------

SKIP = "(catalog ingest --on-bad-record skip indexes the other records)"


def test_damaged_data_with_format_given_is_one_line(tmp_path: Path) -> None:
    shards = make_sample(tmp_path / "d", shards=2, records=10, image_bytes=16)
    first = Path(shards[0])
    fails_alike(  # the file's bytes say what it is
        ["ingest", first, "--format", "tar", "-c", tmp_path / "a.sqlite"],
        f"{first} is a TFRecord file, not a tar file (a dataset holds files of one format)",
    )
    unknown = tmp_path / "u" / "x.rec"  # no known format's first bytes
    unknown.parent.mkdir()
    unknown.write_bytes(b"\0" * 4 + first.read_bytes()[4:])
    fails_alike(
        ["ingest", unknown, "-f", "recordio", "-c", tmp_path / "b.sqlite"],
        f"{unknown}: at byte 0: bad RecordIO magic 0x00000000, expected 0xced7230a {SKIP}",
    )
    truncated = tmp_path / "t" / "cut.tfrecord"
    truncated.parent.mkdir()
    truncated.write_bytes(first.read_bytes()[:-3])
    done = real("ingest", truncated, "--format", "tfrecord", "-c", tmp_path / "c.sqlite")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith(f"error: {truncated}: at byte ")
    assert "truncated record" in done.stderr and len(done.stderr.splitlines()) == 1


def test_the_other_shards_are_named_only_when_there_are_some(tmp_path: Path) -> None:
    a, b = map(Path, make_sample(tmp_path / "d", shards=2, records=10, image_bytes=16))
    problem = "is a TFRecord file, not a tar file (a dataset holds files of one format)"
    all_failed = f"failed: {a} {problem}\nfailed: {b} {problem}\nerror: 2 shard(s) failed\n"
    for done in (
        runner.invoke(
            app,
            [
                "ingest",
                str(tmp_path / "d"),
                "-f",
                "tar",
                "-w",
                "1",
                "-c",
                str(tmp_path / "x.sqlite"),
            ],
        ),
        real("ingest", tmp_path / "d", "-f", "tar", "-w", "1", "-c", tmp_path / "y.sqlite"),
    ):
        code = done.exit_code if hasattr(done, "exit_code") else done.returncode
        assert (code, done.stdout, done.stderr) == (1, "", all_failed)
    b.write_bytes(b.read_bytes()[:-3])
    done = real("ingest", tmp_path / "d", "-w", "1", "-c", tmp_path / "z.sqlite")
    lines = done.stderr.splitlines()
    assert (done.returncode, done.stdout, len(lines)) == (1, "", 2)
    assert lines[0].startswith(f"failed: {b}: at byte ")
    assert lines[1] == "error: 1 shard(s) failed; the other shards are in the catalog"


# -- 1. the CLI's spelling ------------------------------------------------------------------


def test_messages_name_options_not_python_arguments(tmp_path: Path) -> None:
    shard = _shard(tmp_path / "s" / "a.tfrecord", ["k0", "k1", "k0"])
    db = tmp_path / "cat.sqlite"
    fails_alike(
        ["ingest", shard, "--on-duplicate", "both", "-c", db],
        "--on-duplicate must be one of error, first, last, not 'both'",
    )
    fails_alike(
        ["ingest", shard, "-c", db],
        f"duplicate key 'k0' in s/a.tfrecord: records at bytes 0 and "
        f"{2 * (shard.stat().st_size // 3)} (use --on-duplicate first or last to keep one)",
    )
    noise = tmp_path / "noise.bin"
    noise.write_bytes(bytes(range(256)) * 4)
    fails_alike(
        ["ingest", noise, "-c", db],
        f"{noise}: cannot tell the container format from its first 512 bytes; "
        "pass --format (one of parquet, recordio, tar, tfrecord)",
    )
    ok = _shard(tmp_path / "ok" / "b.tfrecord", ["b0", "b1"])
    good = _catalog(tmp_path / "good.sqlite", ok)
    forever = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    )
    fails_alike(
        ["query", forever, "--timeout", "0.2", "-c", good],
        "query exceeded its time limit of 0.2 s; pass --timeout to allow more",
    )
    out = tmp_path / "idx"
    assert (
        runner.invoke(app, ["export-index", "train", "-o", str(out), "-c", str(good)]).exit_code
        == 0
    )
    fails_alike(
        ["export-index", "train", "-o", out, "-c", good],
        f"{out / 'b.idx'} exists (--force replaces it)",
    )
    _killed_writer(good)
    fails_alike(
        ["datasets", "--immutable", "-c", good],
        f"{good} has commits in {good}-wal that are not yet in the main file, so --immutable "
        "would not see them: open it with --readonly instead, or checkpoint it where it is "
        f"written (`catalog checkpoint -c {good}`)",
    )
    old = _catalog(tmp_path / "old.sqlite", ok)
    with sqlite3.connect(old) as conn:
        conn.execute("UPDATE shardcat_meta SET value = '1' WHERE name = 'schema_version'")
    conn.close()
    fails_alike(
        ["query", "SELECT 1", "-c", old],
        f"{old} has catalog schema version 1, this shardcat writes version {SCHEMA_VERSION}: "
        f"run `catalog upgrade -c {old}` to upgrade it",
    )


def test_recordio_samples_and_the_by_position_hint(tmp_path: Path) -> None:
    shards = make_sample(tmp_path / "rec", shards=2, records=6, image_bytes=16, format="recordio")
    db = tmp_path / "cat.sqlite"
    result = runner.invoke(
        app, ["ingest", str(tmp_path / "rec" / "*.rec"), "-d", "imagenet", "-c", str(db)]
    )
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["get", "imagenet", "4", "label", "-c", str(db)]).stdout != ""
    second = Path(shards[1])
    second.with_suffix(".idx").unlink()
    done = real(
        "ingest", tmp_path / "rec" / "*.rec", "-d", "imagenet", "--rescan", "-w", "1", "-c", db
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines() == [
        f"failed: {second}: no MXNet index {second.stem}.idx beside it, but this dataset is "
        "keyed by .idx files (ingest with --by-position to key records by position)",
        "error: 1 shard(s) failed; the other shards are in the catalog",
    ]


def test_every_python_spelling_the_library_uses_is_translated() -> None:
    """The CLI renders an error's hint (data), never rewrites its text: the same words
    without a hint stay as they are; rewording the text keeps the hint's option."""
    from shardcat.cli.common import cli_message
    from shardcat.errors import CorruptRecordError, Hint

    rescan = Hint("(rescan=True)", "(catalog ingest --rescan)")
    damaged = CorruptRecordError(
        "x.tgz", 0, "the catalog's gzip seek index of this shard is damaged (bad); "
        "re-ingest the shard", hint=rescan
    )  # fmt: skip
    assert str(damaged) == (
        "x.tgz: at byte 0: the catalog's gzip seek index of this shard is damaged (bad); "
        "re-ingest the shard (rescan=True)"
    )
    assert cli_message(str(damaged), damaged.hint) == (
        "x.tgz: at byte 0: the catalog's gzip seek index of this shard is damaged (bad); "
        "re-ingest the shard (catalog ingest --rescan)"
    )
    reworded = CorruptRecordError("x.tgz", 0, "seek index damaged, index again", hint=rescan)
    assert reworded.cli_message() == (
        "x.tgz: at byte 0: seek index damaged, index again (catalog ingest --rescan)"
    )
    assert cli_message("two\n  lines") == "two lines"
    for text in ("a key=None b", "re-ingest (rescan=True)", "index 3 out of range: x"):
        assert cli_message(text) == text  # text without a hint is never rewritten


def test_a_path_that_reads_like_a_python_argument_is_shown_as_it_is(tmp_path: Path) -> None:
    """Rewriting message text (the CLI did, with regexes) changed paths too: a directory
    named ``with key=None`` became ``with --by-position`` in the error."""
    shard = _shard(tmp_path / "with key=None" / "a.tfrecord", ["k0", "k1", "k0"])
    fails_alike(
        ["ingest", shard, "-c", tmp_path / "cat.sqlite"],
        f"duplicate key 'k0' in with key=None/a.tfrecord: records at bytes 0 and "
        f"{2 * (shard.stat().st_size // 3)} (use --on-duplicate first or last to keep one)",
    )


# -- 1. errors nobody planned for, Ctrl-C --------------------------------------------------


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _catalog(tmp_path / "cat.sqlite", _shard(tmp_path / "s" / "a.tfrecord", ["k0"]))

    def disk_error(self: Catalog) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Catalog, "datasets", disk_error)
    result = runner.invoke(app, ["datasets", "-c", str(db)])
    assert (result.exit_code, result.output) == (1, f"error: catalog {db}: disk I/O error\n")

    def bug(self: Catalog) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(Catalog, "datasets", bug)
    result = runner.invoke(app, ["datasets", "-c", str(db)])
    assert (result.exit_code, result.output) == (
        1,
        "error: unexpected RuntimeError: boom "
        "(a bug in shardcat; `catalog --debug ...` shows where)\n",
    )
    result = runner.invoke(app, ["--debug", "datasets", "-c", str(db)])
    assert result.exit_code == 1
    assert "Traceback" in result.stderr and "RuntimeError: boom" in result.stderr


_SLOW_INGEST = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # not ignored, as in a terminal
from shardcat.formats.tfrecord import TFRecordFormat
scan = TFRecordFormat.scan
def slow_scan(self, path, options):
    time.sleep(0.4)
    return scan(self, path, options)
TFRecordFormat.scan = slow_scan  # forked workers inherit it
from shardcat.cli import main
sys.argv = ["catalog", *sys.argv[1:]]
main()
"""


def _ready_shards(db: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    except sqlite3.Error:
        return 0
    try:
        return int(
            conn.execute("SELECT count(*) FROM shardcat_shards WHERE state = 'ready'").fetchone()[0]
        )
    except sqlite3.Error:
        return 0
    finally:
        conn.close()


def _gone(pgid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_ctrl_c_during_ingest_says_how_to_finish(tmp_path: Path) -> None:
    make_sample(tmp_path / "d", shards=8, records=80, image_bytes=16)
    db = tmp_path / "cat.sqlite"
    args = ["ingest", str(tmp_path / "d" / "*.tfrecord"), "-d", "train", "-w", "2", "-c", str(db)]
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_INGEST, *args],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    deadline = time.monotonic() + 60
    while _ready_shards(db) == 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the CLI and its workers get it
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, "", RERUN + "\n")
    assert _gone(proc.pid), "worker processes outlived the command"
    indexed = _ready_shards(db)
    assert 0 < indexed < 8
    done = real(*args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout.startswith("dataset train: 80 records in 8 shards (")
    assert done.stdout == (
        f"dataset train: 80 records in 8 shards ({80 - 10 * indexed} indexed now) -> {db}\n"
    )


# -- 2. one rule for where the catalog is ---------------------------------------------------


def test_ingest_then_read_commands_from_the_same_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_sample(tmp_path / "data" / "train", shards=2, records=10, image_bytes=16)
    db = tmp_path / "shardcat.sqlite"
    note = f"catalog: {db} (default: ./shardcat.sqlite)\n"
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["ingest", "data/train/*.tfrecord", "-d", "train", "-w", "1"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"dataset train: 10 records in 2 shards (10 indexed now) -> {db}\n"
    assert db.is_file() and not (tmp_path / "data" / "train" / "shardcat.sqlite").exists()
    for args, stdout in (
        (["query", "SELECT count(*) AS n FROM train", "--json"], '[\n  {\n    "n": 10\n  }\n]\n'),
        (["get", "train", "rec_000000003", "caption"], "sample 3"),
        (["stats", "train", "--json"], None),
    ):
        for done in (runner.invoke(app, args), real(*args, cwd=tmp_path)):
            code = done.exit_code if hasattr(done, "exit_code") else done.returncode
            assert (code, done.stderr) == (0, note), args
            if stdout is not None:
                assert done.stdout == stdout
    done = real("datasets", "--json", "-c", db, cwd=tmp_path)  # named: nothing to say
    assert (done.returncode, done.stderr) == (0, "")
    assert [d["name"] for d in json.loads(done.stdout)] == ["train"]
    elsewhere = tmp_path / "data"
    done = real("datasets", cwd=elsewhere)
    assert (done.returncode, done.stderr) == (
        1,
        f"error: no catalog at {elsewhere / 'shardcat.sqlite'}: pass --catalog FILE, set "
        "$SHARDCAT_CATALOG, or create one with `catalog ingest`\n",
    )
    result = runner.invoke(app, ["drop", "train"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "dropped dataset train\n", note)


def test_the_environment_variable_is_named_when_it_picked_the_catalog(tmp_path: Path) -> None:
    make_sample(tmp_path / "d", shards=1, records=4, image_bytes=16)
    db = tmp_path / "env.sqlite"
    env = _env(SHARDCAT_CATALOG=str(db))
    done = subprocess.run(
        [*_catalog_command(), "ingest", str(tmp_path / "d"), "-d", "e", "-w", "1"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path / "d",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"dataset e: 4 records in 1 shards (4 indexed now) -> {db}\n"
    done = subprocess.run(
        [*_catalog_command(), "query", "SELECT count(*) FROM e", "--csv"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "count(*)\n4\n",
        f"catalog: {db} (from $SHARDCAT_CATALOG)\n",
    )


def test_help_states_the_rule(tmp_path: Path) -> None:
    commands = ["ingest", "datasets", "stats", "list", "get", "extract", "query", "verify"]
    commands += ["export-index", "drop", "checkpoint"]
    for name in commands:
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"})
        text = " ".join(result.output.split())
        assert HELP_DEFAULT in text, name
        assert "shardcat.sqlite beside the shards" not in text, name
    root = " ".join(runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output.split())
    assert "$SHARDCAT_CATALOG, else ./shardcat.sqlite in the current directory" in root


def test_migrate_follows_the_same_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from legacy_fixtures import tfd_tfrecord_index, write_tfrecords

    write_tfrecords(tmp_path / "data", shards=2)
    tfd_tfrecord_index(str(tmp_path / "data" / "*.tfrecord"))
    monkeypatch.chdir(tmp_path)
    text = " ".join(
        runner.invoke(app, ["migrate", "--help"], env={"COLUMNS": "200"}).output.split()
    )
    assert HELP_DEFAULT in text and "shardcat.sqlite beside the shards" not in text
    result = runner.invoke(app, ["migrate", "data"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "shardcat.sqlite").is_file()
    assert not (tmp_path / "data" / "shardcat.sqlite").exists()
    assert json.loads(runner.invoke(app, ["datasets", "--json"]).stdout)[0]["records"] == 80
