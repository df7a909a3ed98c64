"""A catalog on a PostgreSQL server (issue 13): a private server started for the run.

Same reads as a SQLite catalog of the same files, read-only queries, cooperative
ingest by several processes with ``FOR UPDATE SKIP LOCKED`` claims, takeover of
dead claims, COPY for bulk rows, fork safety, the CLI with a URL.
"""

from __future__ import annotations

import gzip
import io
import multiprocessing
import os
import socket
import tarfile
import time
from pathlib import Path

import checked
import pytest
from features import payloads

from shardcat import Catalog, CatalogError, IngestError, TFRecordWriter, make_example
from shardcat.catalog import postgres
from shardcat.catalog.backend import make_engine
from shardcat.catalog.claims import claim_next
from shardcat.catalog.versions import SCHEMA_VERSION
from shardcat.formats.tfrecord import HEADER
from shardcat.pb2 import Example
from shardcat.sample import make_sample
from shardcat.testing.postgres import find_binaries, fresh_database, postgres_server
from shardcat.testing.required import missing, need

psycopg = need("psycopg", why="shardcat[postgres]")
if find_binaries() is None:
    missing("the PostgreSQL server binaries (initdb, postgres)")


@pytest.fixture(scope="module")
def server():
    with postgres_server() as url:
        yield url


@pytest.fixture
def pg_url(server):
    """A fresh database on the server, dropped afterwards."""
    with fresh_database(server) as url:
        yield url


def _tar_gz(directory: Path, n: int) -> Path:
    path = directory / "s.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for i in range(n):
            for ext, data in (("txt", f"text {i}".encode()), ("cls", str(i % 7).encode())):
                info = tarfile.TarInfo(f"sample{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _gzip_tfrecord(directory: Path, n: int) -> Path:
    plain = directory / "g.tfrecord"
    with TFRecordWriter(plain) as w:
        for i in range(n):
            w.write(make_example({"key": f"g{i:05d}", "label": i % 5}).SerializeToString())
    packed = directory / "g.tfrecord.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    return packed


def _written(directory: Path, kind: str) -> str:
    """Shards of ``kind`` written into ``directory``: the pattern matching them."""
    if kind == "tar.gz":
        _tar_gz(directory, 150)
    elif kind == "gzip-tfrecord":
        _gzip_tfrecord(directory, 400)
    else:
        make_sample(directory, shards=3, records=240, format=kind)
    suffix = {"tfrecord": "tfrecord", "tar": "tar", "recordio": "rec"}.get(kind, kind)
    return str(directory / f"*.{suffix.replace('gzip-tfrecord', 'tfrecord.gz')}")


@pytest.mark.parametrize("kind", ["tfrecord", "tar", "recordio", "tar.gz", "gzip-tfrecord"])
def test_reads_are_those_of_a_sqlite_catalog(tmp_path, pg_url, kind):
    data = tmp_path / "data"
    data.mkdir()
    pattern = _written(data, kind)
    with Catalog(tmp_path / "c.sqlite") as local, Catalog(pg_url) as remote:
        local.ingest(pattern, "d", workers=1).close()
        remote.ingest(pattern, "d", workers=2).close()
        assert [(i.records, i.shards, i.fields) for i in remote.datasets()] == [
            (i.records, i.shards, i.fields) for i in local.datasets()
        ]
        with local.dataset("d") as a, remote.dataset("d") as b:
            n = len(a)
            assert n > 0 and len(b) == n
            keys = a.get_keys()
            assert b.get_keys() == keys
            for key in keys[:: max(1, n // 40)]:
                assert b.get_raw(key) == a.get_raw(key)
            assert b.get_many(keys[::-3], raw=True) == a.get_many(keys[::-3], raw=True)
            assert b.get_many_at(slice(2, n, 7), raw=True) == a.get_many_at(
                slice(2, n, 7), raw=True
            )
            assert [b.key_at(p) for p in (0, n // 2, n - 1)] == [
                a.key_at(p) for p in (0, n // 2, n - 1)
            ]
            if a.describe():
                column = next(iter(local.info("d").fields))
                assert remote.query(f"SELECT count({column}) FROM d") == local.query(
                    f"SELECT count({column}) FROM d"
                )
            assert b.get_raw("no such key") is None
            with pytest.raises(KeyError):
                b["no such key"]


def test_where_views_indexes_and_readonly_queries(tmp_path, pg_url):
    make_sample(tmp_path, shards=2, records=200)
    with Catalog(pg_url) as cat:
        cat.ingest(str(tmp_path / "*.tfrecord"), "train").close()
        with cat.dataset("train") as reader:
            labels = {k: reader.get_feature(k, "label") for k in reader.get_keys()}
            want = [k for k in reader.get_keys() if labels[k] < 3]
            assert reader.where("label < 3") == want
            assert reader.where("label < ?", [3]) == want
            assert reader.where("label < :n", {"n": 3}) == want
        assert cat.create_index("train", "label") is True
        assert cat.create_index("train", "label") is False
        assert cat.info("train").indexed == ["label"]
        rows = cat.query("SELECT label, count(*) FROM train GROUP BY label ORDER BY label")
        assert sum(n for _, n in rows) == 200 and rows.columns == ["label", "count"]
        assert (
            cat.query("SELECT key, position, shard FROM train ORDER BY position LIMIT 1")[0][1] == 0
        )
        for sql in (
            "DELETE FROM train",
            "DROP TABLE shardcat_shards",
            "UPDATE shardcat_datasets SET name = 'x'",
            "SELECT 1; DELETE FROM shardcat_shards",
            "SELECT set_config('transaction_read_only', 'off', true), count(*) "
            "FROM shardcat_shards",
        ):
            with pytest.raises(CatalogError, match="query failed"):
                cat.query(sql)
        with pytest.raises(CatalogError, match=r"time limit of 0\.3 s"):
            cat.query("SELECT pg_sleep(3)", timeout=0.3)
        assert cat.query("SELECT count(*) FROM shardcat_shards")[0][0] == 2  # nothing changed
        cat.drop("train")
        assert cat.datasets() == []


def _ingest_in_process(url: str, pattern: str, out: multiprocessing.Queue) -> None:
    with Catalog(url) as cat, cat.ingest(pattern, "d", workers=2) as reader:
        out.put((os.getpid(), len(reader), sorted(reader.get_keys())[:3]))


def test_cooperative_ingest_indexes_each_shard_once(tmp_path, pg_url):
    """Four processes (as on four hosts) ingest the same shards into one server."""
    written = payloads(*make_sample(tmp_path, shards=12, records=2400))
    pattern = str(tmp_path / "*.tfrecord")
    with Catalog(pg_url):  # the schema, before the processes race for it
        pass
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_ingest_in_process, args=(pg_url, pattern, out)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert {n for _, n, _ in results} == {2400}  # every process ends with every key
    with Catalog(pg_url) as cat:
        rows = cat.query("SELECT state, generation, num_records FROM shardcat_shards ORDER BY path")
        assert rows == [("ready", 1, 200)] * 12  # each shard indexed exactly once
        with cat.dataset("d") as reader:
            keys = reader.get_keys()
            assert sorted(keys) == sorted(written)
            key = keys[1234]
            label = Example.FromString(written[key]).features.feature["label"].int64_list.value[0]
            assert reader.get_raw(key) == written[key]
            assert reader.get_feature(key, "label") == label


def test_bulk_rows_go_through_copy(tmp_path, pg_url, monkeypatch):
    calls = []
    real = postgres.copy_rows

    def spy(dbapi_conn, table, columns, rows):
        calls.append((table, len(rows)))
        real(dbapi_conn, table, columns, rows)

    monkeypatch.setattr(postgres, "copy_rows", spy)
    make_sample(tmp_path, shards=2, records=500)
    with Catalog(pg_url) as cat:
        cat.ingest(str(tmp_path / "*.tfrecord"), "d", workers=1).close()
    assert sorted(calls) == [("shardcat_records_1", 250), ("shardcat_records_1", 250)]


def test_claims_skip_locked_rows_and_take_over_dead_ones(tmp_path, pg_url):
    make_sample(tmp_path, shards=3, records=30)
    with Catalog(pg_url) as cat:
        cat.ingest(str(tmp_path / "*.tfrecord"), "d").close()
        engine = make_engine(pg_url)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("UPDATE shardcat_shards SET state = 'pending'")
            # another session holds the first shard's row locked: a claim skips it
            blocker = psycopg.connect(postgres.engine_url(pg_url).set(drivername="postgresql")
                                      .render_as_string(hide_password=False))  # fmt: skip
            first = blocker.execute(
                "SELECT id, path FROM shardcat_shards ORDER BY path LIMIT 1 FOR UPDATE"
            ).fetchone()
            started = time.monotonic()
            got = claim_next(engine, 1, 600.0, "me")
            assert got is not None and got.id != first[0]
            assert time.monotonic() - started < 30  # did not wait for the lock
            blocker.rollback()
            blocker.close()
            # a claim by a dead process of this host is taken over at once
            host = socket.gethostname()
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    "UPDATE shardcat_shards SET state = 'indexing', claim_owner = %s, "
                    "claimed_at = %s",
                    (f"{host}:999999999:0", time.time()),
                )
            assert claim_next(engine, 1, 600.0, "me") is not None
            # one from another host only after the lease
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    "UPDATE shardcat_shards SET state = 'indexing', claim_owner = %s, "
                    "claimed_at = %s",
                    ("elsewhere:1:0", time.time()),
                )
            assert claim_next(engine, 1, 600.0, "me") is None
            assert claim_next(engine, 1, 0.0, "me") is not None
        finally:
            engine.dispose()


def _read_in_child(reader, keys, out):
    out.put([reader.get_raw(k) for k in keys])


def test_readers_work_in_forked_children(tmp_path, pg_url):
    make_sample(tmp_path, shards=2, records=100)
    with Catalog(pg_url) as cat, cat.ingest(str(tmp_path / "*.tfrecord"), "d") as reader:
        keys = reader.get_keys()[::9]
        want = [reader.get_raw(k) for k in keys]  # the parent's connection is open
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        children = [ctx.Process(target=_read_in_child, args=(reader, keys, out)) for _ in range(2)]
        for c in children:
            c.start()
        got = [out.get(timeout=60) for _ in children]
        for c in children:
            c.join(30)
            assert c.exitcode == 0
        assert got == [want, want]
        assert [reader.get_raw(k) for k in keys] == want  # the parent's still works


def test_messages_hide_the_password_and_name_the_server(pg_url):
    secret = pg_url.replace("shardcat@", "shardcat:hunter2@")
    assert postgres.display(secret).count("hunter2") == 0
    bad = secret.rsplit(":", 1)[0] + ":1/nowhere"  # a port nothing listens on
    with pytest.raises(CatalogError) as err:
        Catalog(bad)
    assert "hunter2" not in str(err.value) and "cannot open catalog postgresql" in str(err.value)
    with pytest.raises(CatalogError, match="only the psycopg"):
        Catalog(pg_url.replace("postgresql://", "postgresql+pg8000://"))
    with pytest.raises(CatalogError, match="immutable=True is for SQLite"):
        Catalog(pg_url, immutable=True)


def test_readonly_open_of_an_empty_server_database(pg_url):
    with pytest.raises(CatalogError, match="no catalog at"):
        Catalog(pg_url, readonly=True)
    with Catalog(pg_url):
        pass
    with Catalog(pg_url, readonly=True) as cat:
        assert cat.datasets() == []


def test_cli_with_a_server_url(tmp_path, pg_url):
    from typer.testing import CliRunner

    from shardcat.cli import app

    make_sample(tmp_path, shards=2, records=40)
    runner = CliRunner()
    secret = pg_url.replace("shardcat@", "shardcat:hunter2@")  # (trust: any password works)
    done = runner.invoke(app, ["ingest", str(tmp_path / "*.tfrecord"), "-d", "t", "-c", secret])
    assert done.exit_code == 0, done.output
    assert "40 records in 2 shards" in done.output and "hunter2" not in done.output
    done = runner.invoke(app, ["checkpoint", "-c", secret])
    assert done.exit_code == 0 and "nothing to fold" in done.output
    assert "hunter2" not in done.output
    done = runner.invoke(app, ["migrate", "--upgrade", "-c", secret])
    assert done.exit_code == 0 and f"schema version {SCHEMA_VERSION} (up to date)" in done.output
    assert "hunter2" not in done.output and "postgresql://shardcat:***@" in done.output
    done = runner.invoke(app, ["migrate", "--upgrade"], env={"SHARDCAT_CATALOG": secret})
    assert done.exit_code == 0 and f"schema version {SCHEMA_VERSION} (up to date)" in done.output
    assert "hunter2" not in done.output
    done = runner.invoke(app, ["query", "SELECT count(*) AS n FROM t", "-c", pg_url, "--json"])
    assert done.exit_code == 0, done.output
    assert '"n": 40' in done.output
    done = runner.invoke(app, ["query", "DELETE FROM t", "-c", pg_url])
    assert done.exit_code != 0 and "Traceback" not in done.output
    assert "only SELECT statements are allowed" in done.output


def _shard(path: Path, keys: list[str], label: int) -> None:
    with TFRecordWriter(path) as w:
        for k in keys:
            w.write(make_example({"key": k, "label": label}).SerializeToString())


def _outcome(cat: Catalog, call, base: Path, dataset: str = "d") -> object:
    """What ``call`` left: the error (shard paths as a file catalog stores them,
    relative to its directory; a server stores them absolute), else the records."""
    try:
        call()
    except Exception as exc:  # compared, not swallowed
        return type(exc).__name__, str(exc).replace(f"{base}{os.sep}", "")
    with cat.dataset(dataset) as reader:
        keys = reader.get_keys()
        return (
            keys,
            [reader.get_feature(k, "label") for k in keys],
            reader.get_stats()["duplicates_dropped"],
        )


@pytest.mark.parametrize("policy", ["error", "first", "last"])
def test_duplicates_reingest_and_copies_match_sqlite(tmp_path, pg_url, policy):
    data = tmp_path / "data"
    data.mkdir()
    _shard(data / "a.tfrecord", [f"k{i:03d}" for i in range(0, 60)], 1)
    _shard(data / "b.tfrecord", [f"k{i:03d}" for i in range(40, 100)], 2)  # 20 shared keys
    pattern = str(data / "*.tfrecord")
    # One worker: with two, which of two shards sharing a key commits first (and so
    # which one an "error" policy fails) is up to the scheduler, on either database.
    with Catalog(tmp_path / "c.sqlite") as local, Catalog(pg_url) as remote:
        steps = [
            # a first ingest
            lambda cat: cat.ingest(pattern, "d", on_duplicate=policy, workers=1).close(),
            # b rewritten with other keys, then with a third of them shared again
            lambda cat: (
                _shard(data / "b.tfrecord", [f"k{i:03d}" for i in range(60, 130)], 3),
                cat.ingest(pattern, "d", on_duplicate=policy, workers=1).close(),
            ),
            lambda cat: (
                _shard(data / "c.tfrecord", [f"k{i:03d}" for i in range(120, 140)], 4),
                cat.ingest(pattern, "d", on_duplicate=policy, workers=1).close(),
            ),
        ]
        for step in steps:
            results = []
            for cat in (local, remote):
                results.append(_outcome(cat, lambda cat=cat, step=step: step(cat), tmp_path))
                if cat is local:
                    (data / "b.tfrecord").touch()  # the server sees a changed file too
            assert results[1] == results[0]
        # a second dataset over the same files copies the rows (INSERT ... SELECT)
        copies = [
            _outcome(
                cat,
                lambda cat=cat: cat.ingest(pattern, "copy", on_duplicate=policy, workers=1).close(),
                tmp_path,
                "copy",
            )
            for cat in (local, remote)
        ]
        assert copies[1] == copies[0]
        if policy != "error":
            q = "SELECT key, label, position FROM copy ORDER BY position"
            assert remote.query(q) == local.query(q) and len(local.query(q)) == 140


def test_a_sqlite_url_is_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_sample(tmp_path / "data", shards=1, records=10)
    with Catalog("sqlite:///rel.sqlite") as cat:  # SQLAlchemy's spelling of a file
        cat.ingest("data/*.tfrecord", "d").close()
        assert cat.store.backend.local_file == cat.path == tmp_path / "rel.sqlite"
    absolute = tmp_path / "abs.sqlite"
    with Catalog(f"sqlite:///{absolute}") as cat:
        assert cat.path == absolute and cat.datasets() == []
    assert (tmp_path / "rel.sqlite").is_file() and absolute.is_file()


def test_batches_are_one_query_each(tmp_path, pg_url, monkeypatch):
    from shardcat.catalog import store

    monkeypatch.setattr(store, "SNAPSHOT_SECONDS", 3600.0)  # no snapshot renewal in between
    make_sample(tmp_path / "tf", shards=3, records=300)
    make_sample(tmp_path / "tar", shards=2, records=100, format="tar")
    with Catalog(pg_url) as cat:
        cat.ingest(str(tmp_path / "tf" / "*.tfrecord"), "tf").close()
        cat.ingest(str(tmp_path / "tar" / "*.tar"), "web").close()
        statements: list[str] = []
        real = postgres.ServerConnection.execute

        def counted(self, sql, params=()):
            statements.append(sql)
            return real(self, sql, params)

        with cat.dataset("tf") as tf, cat.dataset("web") as web:
            keys, tar_keys = tf.get_keys(), web.get_keys()
            monkeypatch.setattr(postgres.ServerConnection, "execute", counted)
            for call, want in (
                (lambda: tf.get_many(keys[::2]), 1),
                (lambda: tf.get_many_at(slice(0, 300, 3)), 1),
                (lambda: tf.get_many_at([5, 1, 250, 1]), 1),
                (lambda: web.get_many(tar_keys[::3]), 2),  # the records, then their members
                (lambda: tf.get_feature(keys[7], "label"), 1),
            ):
                tf.get_feature(keys[0], "label")  # the read snapshot is begun
                statements.clear()
                call()
                lookups = [s for s in statements if s.startswith("SELECT")]
                assert len(lookups) == want, lookups
            monkeypatch.setattr(postgres.ServerConnection, "execute", real)
            assert len(tf.get_many(keys[::2])) == 150


def test_snapshot_of_a_server_catalog_reads_the_same(tmp_path, pg_url):
    """``catalog snapshot`` of a PostgreSQL catalog: one SQLite file for readers on any host."""
    data = tmp_path / "data"
    make_sample(data / "tf", shards=3, records=240)
    _tar_gz(data, 60)
    with Catalog(pg_url) as server:
        server.ingest(str(data / "tf" / "*.tfrecord"), "train").close()
        server.ingest(str(data / "*.tar.gz"), "web").close()
        server.create_index("train", "label")
        out = data / "catalog.sqlite"  # beside the shards: their paths are stored relative
        done = server.snapshot(["train", "web"], out)
        assert done.provenance.snapshot_of == postgres.display(pg_url)
        with Catalog(out, immutable=True) as snap:
            assert snap.info("train").indexed == ["label"]
            assert snap.query("SELECT path FROM shardcat_shards ORDER BY path")[0][0] == (
                "s.tar.gz"
            )
            for name in ("train", "web"):
                with server.dataset(name) as a, snap.dataset(name) as b:
                    keys = a.get_keys()
                    assert b.get_keys() == keys and len(keys) > 0
                    assert b.get_many(keys, raw=True) == a.get_many(keys, raw=True)
                    assert b.get_many_at(slice(0, len(keys), 5), raw=True) == a.get_many_at(
                        slice(0, len(keys), 5), raw=True
                    )
            assert snap.query("SELECT count(*) FROM train WHERE label < 3") == server.query(
                "SELECT count(*) FROM train WHERE label < 3"
            )


def test_text_with_a_nul_byte(tmp_path, pg_url):
    """PostgreSQL text cannot hold NUL: such a field is NULL in SQL (the record keeps its
    bytes), such a key fails its shard with a clear error, never the whole ingest."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    with TFRecordWriter(good / "n.tfrecord") as w:
        w.write(make_example({"key": "k1", "note": b"a\x00b", "label": 1}).SerializeToString())
        w.write(make_example({"key": "k2", "note": b"plain", "label": 2}).SerializeToString())
    with TFRecordWriter(bad / "b.tfrecord") as w:
        w.write(make_example({"key": b"x\x00y", "label": 3}).SerializeToString())
    with TFRecordWriter(bad / "c.tfrecord") as w:
        w.write(make_example({"key": "fine", "label": 4}).SerializeToString())
    with Catalog(pg_url) as cat:
        cat.ingest(str(good / "*.tfrecord"), "d").close()
        assert cat.query("SELECT key, note, label FROM d ORDER BY key") == [
            ("k1", None, 1),
            ("k2", "plain", 2),
        ]
        with cat.dataset("d") as reader:
            assert reader.get_feature("k1", "note") == b"a\x00b"
        with pytest.raises(
            IngestError, match=r"b\.tfrecord: at byte 0: record 'x\\x00y': its key holds a NUL"
        ):
            cat.ingest(str(bad / "*.tfrecord"), "e")
        assert cat.query("SELECT key FROM e") == [("fine",)]  # the other shard is in


def test_migrate_a_tfd_utils_index_into_a_server_catalog(tmp_path, pg_url):
    """``catalog migrate -c postgresql://...``: the legacy entries go to the server (it
    was a SQLite file named after the URL), shard paths stored absolute, no re-scan."""
    from typer.testing import CliRunner

    from shardcat.cli import app
    from tests.legacy_fixtures import tfd_tfrecord_index, write_tfrecords

    d = tmp_path / "shards"
    write_tfrecords(d)
    tfd_tfrecord_index(str(d / "*.tfrecord"))
    done = CliRunner().invoke(app, ["migrate", str(d), "-c", pg_url, "--json"])
    assert done.exit_code == 0, done.output
    assert '"action": "imported"' in done.output and postgres.display(pg_url) in done.output
    assert not list(tmp_path.glob("postgresql*")) and not Path("postgresql:").exists()
    with Catalog(pg_url) as cat, cat.dataset("train") as reader:
        assert len(reader) == 120 and reader.get_feature("r1_7", "label") == 0
        paths = [p for (p,) in cat.query("SELECT path FROM shardcat_shards")]
        assert len(paths) == 3 and all(os.path.isabs(p) for p in paths)


@pytest.mark.parametrize("kind", ["tfrecord", "tar", "recordio"])
def test_reads_through_a_server_catalog_are_checked(tmp_path, pg_url, kind):
    """The checks live in the server's tables too: a record damaged past the
    fingerprint is refused by every read path; a moved offset as well."""
    d = checked.write(kind, tmp_path / "data")
    with Catalog(pg_url) as cat:
        cat.ingest(str(d.path), "d", workers=1).close()
        with cat.dataset("d") as reader:
            assert reader.get_raw(d.key) == d.good
        d.damage()
        with cat.dataset("d") as reader:
            checked.every_read_refuses(reader, d)
            assert [(p.path, p.offset) for p in reader.verify()] == [(str(d.path), d.offset)]


def test_a_key_index_entry_naming_another_row_is_refused_on_a_server(tmp_path, pg_url):
    """The server's checks mix each record's key as SQLite's do: with two rows'
    keys exchanged (each key's index entry names the other's row), reads of either
    key are refused, never the other record's bytes."""
    d = checked.write("tfrecord", tmp_path / "data")
    with Catalog(pg_url) as cat:
        cat.ingest(str(d.path), "d", workers=1).close()
        with cat.dataset("d") as reader:
            other = reader.get_raw("r2")
    with psycopg.connect(pg_url, autocommit=True) as c:
        t = "shardcat_records_1"
        (d.offset,) = c.execute(f'SELECT "offset" FROM {t} WHERE key = %s', ("r2",)).fetchone()
        c.execute(f"UPDATE {t} SET key = '#swap' WHERE key = %s", (d.key,))
        c.execute(f"UPDATE {t} SET key = %s WHERE key = 'r2'", (d.key,))
        c.execute(f"UPDATE {t} SET key = 'r2' WHERE key = '#swap'")
    with Catalog(pg_url) as cat:
        with cat.dataset("d") as reader:
            checked.every_read_refuses(reader, d, 2)  # d.key now names record 2's row
            assert len(reader.verify()) == 2
        with cat.dataset("d", verify=False) as reader:
            assert reader.get_raw(d.key) == other


def test_bad_records_set_aside_on_a_server(tmp_path, pg_url):
    from tests.damage import flip_keeping_mtime
    from tests.test_bad_records import write_tfrecord

    path = tmp_path / "a.tfrecord"
    truth = write_tfrecord(path, 6)
    pristine = path.read_bytes()
    flip_keeping_mtime(path, truth["r4"][0] + HEADER + truth["r4"][1].index(bytes([4]) * 50))
    with Catalog(pg_url) as cat:
        with cat.ingest(path, "d", on_bad_record="skip", workers=2) as reader:
            assert sorted(reader.get_keys()) == ["r0", "r1", "r2", "r3", "r5"]
            assert reader.get_raw("r5") == truth["r5"][1]
        (found,) = cat.bad_records("d")
        assert (found.shard, found.offset, found.reason, found.key) == (
            str(path),
            truth["r4"][0],
            "data CRC mismatch",
            "r4",
        )
        path.write_bytes(pristine)
        cat.ingest(path, "d", workers=1).close()
        assert cat.bad_records("d") == []


def test_names_refused_as_on_sqlite_and_nul_errors_name_the_record(tmp_path, pg_url):
    """Issue 26 item 9 on the server: a dataset name taken in another case is refused
    (quoted, PostgreSQL would make two views); a NUL in a key (text PostgreSQL cannot
    store) or in a field name fails its shard, naming the record's byte offset and key."""
    _shard(tmp_path / "a.tfrecord", ["a0", "a1"], 1)
    first = make_example({"key": "n0", "label": 1}).SerializeToString()
    for name, second in (
        ("key", make_example({"key": "n\x001", "label": 2})),
        ("field", make_example({"key": "n1", "la\x00bel": 2})),
    ):
        with TFRecordWriter(tmp_path / f"{name}.tfrecord") as w:
            w.write(first)
            w.write(second.SerializeToString())
    at = f"{tmp_path}{os.sep}%s.tfrecord: at byte {16 + len(first)}: record "
    with Catalog(pg_url) as cat:
        cat.ingest(str(tmp_path / "a.tfrecord"), "train").close()
        with pytest.raises(CatalogError, match="dataset name 'TRAIN' is taken by dataset 'train'"):
            cat.ingest(str(tmp_path / "a.tfrecord"), "TRAIN")
        with pytest.raises(IngestError) as err:
            cat.ingest(str(tmp_path / "key.tfrecord"), "k")
        assert str(err.value) == (
            at % "key" + "'n\\x001': its key holds a NUL character, which PostgreSQL text "
            "cannot store (key the dataset by position, key=None, or by another feature)"
        )
        with pytest.raises(IngestError) as err:
            cat.ingest(str(tmp_path / "field.tfrecord"), "f")
        assert str(err.value) == (
            at % "field" + "'n1' has a field named 'la\\x00bel': a NUL character cannot be "
            "in a SQL name (rename the feature, or ingest with fields=False)"
        )
        # a first ingest that indexed nothing leaves no empty dataset (issue 28)
        assert [d.name for d in cat.datasets()] == ["train"]


def test_one_backend_object_answers_for_either_database(pg_url, tmp_path):
    """The same ``?`` statements, bulk rows and ``any_of`` through each backend; callers
    ask what it can do (a local file, one writer at a time), never which it is."""
    from shardcat.catalog.backend import backend_for, dialect_of, run

    file, server = backend_for(tmp_path / "c.sqlite"), backend_for(pg_url)
    assert (file.local_file, file.directory, file.one_writer) == (
        tmp_path / "c.sqlite",
        str(tmp_path),
        True,
    )
    assert (server.local_file, server.directory, server.one_writer) == (None, "", False)
    assert server.display == postgres.display(pg_url) and server.location == pg_url
    for backend in (file, server):
        engine = backend.engine()
        try:
            with engine.begin() as conn:
                run(conn, "CREATE TABLE t (k TEXT, n BIGINT)")
                dialect = dialect_of(conn)
                dialect.insert_rows(conn, "t", ["k", "n"], [["a", "b%", "c?"], [1, 2, 3]], 3)
                among, listed = dialect.any_of("k", ["b%", "c?", "zz"])
                sql = f"SELECT k, n FROM t WHERE n > ? AND {among} ORDER BY n"
                rows = [tuple(r) for r in run(conn, sql, (1, listed))]
            assert rows == [("b%", 2), ("c?", 3)]
            reads = backend.read_connection()
            try:
                assert reads.execute("SELECT count(*) FROM t WHERE n >= ?", (2,)).fetchone()[0] == 2
            finally:
                reads.close()
        finally:
            engine.dispose()


def test_soft_deletes_on_a_server_catalog(pg_url: str, tmp_path: Path) -> None:
    """Soft deletes (issue 32) on PostgreSQL: the same view, readers and samplers."""
    from tests.test_deletes import check_deleted, write

    write(tmp_path / "a.tfrecord", 0, 10)
    write(tmp_path / "b.tfrecord", 10, 10)
    with Catalog(pg_url) as cat:
        cat.ingest(str(tmp_path / "*.tfrecord"), "d", workers=1).close()
        assert cat.delete("d", "label % 5 = 0") == 4
        assert cat.delete("d", keys=["r05"]) == 0
        check_deleted(cat)
        assert cat.undelete("d", "label < 10") == 2
        assert cat.undelete("d") == 2
        assert cat.query("SELECT count(*) FROM d") == [(20,)]
        with cat.dataset("d") as reader:
            assert len(reader) == 20
