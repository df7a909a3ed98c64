"""``catalog serve`` over a PostgreSQL catalog and over remote shards (HTTP ranged
reads): the same pages, image bytes equal to the record's, the SQL box's guard."""

from __future__ import annotations

import re
from urllib.parse import quote

from web_browser import get, serving
from web_samples import make_sample

from shardcat import Catalog
from shardcat.testing.postgres import find_binaries, fresh_database, postgres_server
from shardcat.testing.required import missing, need
from shardcat.testing.servers import RangeServer


def _sql(base: str, sql: str) -> tuple[int, str]:
    status, _, body = get(f"{base}/-/sql?sql={quote(sql)}")
    return status, body.decode()


def _datasets(body: bytes) -> list[str]:
    return re.findall(r'<td><a href="/(\w+)">', body.decode())


def test_a_postgresql_catalog(tmp_path):
    need("psycopg", why="shardcat[postgres]")
    if find_binaries() is None:
        missing("the PostgreSQL server binaries (initdb, postgres)")
    with postgres_server() as server, fresh_database(server) as url:
        found = make_sample(tmp_path / "shards", url)
        with serving(url, "--timeout", "1", log=tmp_path / "log") as base:
            status, _, body = get(base + "/")
            assert status == 200 and _datasets(body) == ["faces", "photos", "table", "train"]
            for (dataset, key, feature), data in found.images.items():
                status, _, got = get(
                    f"{base}/-/bytes?dataset={dataset}&key={key}&feature={feature}"
                )
                assert (status, got) == (200, data), (dataset, key, feature)
            status, _, body = get(base + "/train/rec_000002")
            assert status == 200 and "a picture number 2" in body.decode()
            status, page = _sql(base, "SELECT count(*) FROM train WHERE label = 1")
            assert status == 200 and "<td>4</td>" in page
            status, page = _sql(base, "DELETE FROM train")
            assert status == 400 and 'id="error"' in page and "read-only" in page
            status, page = _sql(base, "SELECT pg_sleep(5)")
            assert status == 400 and "query exceeded its time limit of 1 s" in page


def test_remote_shards(tmp_path):
    need("fsspec", "aiohttp", why="shardcat[remote]")
    found = make_sample(tmp_path / "shards", tmp_path / "local.sqlite")
    http = RangeServer(str(tmp_path / "shards"))
    http.start()
    try:
        with Catalog(tmp_path / "remote.sqlite") as cat:
            cat.ingest(f"{http.url}/train-00000.tfrecord", "train", workers=1).close()
            cat.ingest(f"{http.url}/photos-00000.tar", "photos", workers=1).close()
        with serving(tmp_path / "remote.sqlite", log=tmp_path / "log") as base:
            status, _, body = get(base + "/")
            assert status == 200 and _datasets(body) == ["photos", "train"]
            http.counter.reset()
            for (dataset, key, feature), data in found.images.items():
                if dataset in ("train", "photos"):
                    status, _, got = get(
                        f"{base}/-/bytes?dataset={dataset}&key={key}&feature={feature}"
                    )
                    assert (status, got) == (200, data), (dataset, key, feature)
            assert http.counter.gets()  # read through ranged requests to the server
            status, _, body = get(base + "/photos/s002")
            assert status == 200 and "dataset=photos&amp;key=s002&amp;feature=jpg" in body.decode()
    finally:
        http.stop()
