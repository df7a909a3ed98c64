"""``catalog serve`` in a real headless Chromium (Debian's, driven by Selenium): the
datasets page, a record page whose images decode with the record's bytes, the SQL
box (rows; writes refused; a slow query cut off), keys and values holding HTML
shown as text; and over HTTP: nothing written, no path reaching the filesystem,
TensorBlob/TensorDB shapes, PostgreSQL catalogs and remote shards."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import shutil
import tarfile
import tracemalloc
from pathlib import Path
from urllib.parse import quote

import pytest
from web_browser import chromium, get, serving
from web_samples import XSS_JSON, XSS_KEY, XSS_TEXT, Sample, image, make_sample

from shardcat.testing.required import need

SLOW_SQL = "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) SELECT count(*) FROM c"


def _tensors(root: Path) -> dict[str, Path]:
    torch = need("torch", why="the serve tests list a TensorBlob and a TensorDB")
    from shardcat import TensorBlob, TensorDB

    blob, db = root / "blob", root / "emb"
    with TensorBlob.open(blob, "w", dtype="float32", shape=(3, 4)) as b:
        b.write(torch.zeros(5, 3, 4))
    schema = {"vec": ("float16", (8,)), "label": ("int64", (), {"filter": True})}
    with TensorDB.open(db, "w", schema=schema) as d:
        d.write(
            {"vec": torch.ones(2, 8, dtype=torch.float16), "label": torch.tensor([1, 2])},
            keys=["a", "b"],
        )
    return {"blob": blob, "emb": db}


def _digest(paths: list[Path]) -> dict[str, str]:
    """Every file under ``paths`` (files or directories) -> sha256 of its bytes."""
    files = []
    for path in paths:
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Sample, dict[str, Path]]:
    root = tmp_path_factory.mktemp("serve")
    return make_sample(root / "shards"), _tensors(root)


@pytest.fixture(scope="module")
def server(sample, tmp_path_factory):
    found, tensors = sample
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    args = ["--timeout", "1"]
    for name, path in tensors.items():
        args += ["--tensors", f"{name}={path}"]
    with serving(found.catalog, *args, log=log) as base:
        yield base


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def _open(driver, url: str) -> None:
    driver.get(url)
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 20).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )


def _table(driver, table_id: str) -> list[list[str]]:
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' tr')].slice(1)"
        ".map(tr => [...tr.children].map(td => td.innerText))",
        "#" + table_id,
    )


def test_datasets_page_lists_the_datasets_and_tensor_stores(server, browser):
    _open(browser, server + "/")
    rows = _table(browser, "datasets")
    assert [r[:3] for r in rows] == [
        ["faces", "recordio", "4"],
        ["photos", "tar", "5"],
        ["table", "parquet", "6"],
        ["train", "tfrecord", "13"],
    ]
    assert rows[3][3] == "1/1" and rows[3][5] == "caption, label, meta, score"
    assert _table(browser, "tensors") == [
        ["blob", "TensorBlob", "5", "data: float32 (3, 4)"],
        ["emb", "TensorDB", "2", "vec: float16 (8,); label: int64 ()"],
    ]
    browser.find_element("link text", "train").click()
    assert browser.current_url == server + "/train"


def _images(driver) -> list[dict[str, object]]:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 20).until(
        lambda d: d.execute_script("return [...document.images].every(i => i.complete)")
    )
    return driver.execute_script(
        "return [...document.images].map(i => ({alt: i.alt, src: i.src, "
        "width: i.naturalWidth, height: i.naturalHeight}))"
    )


@pytest.mark.parametrize(
    ("path", "sizes"),
    [
        ("/train/rec_000003", {"image": (96, 64), "mask": (48, 48)}),
        ("/photos/s001", {"jpg": (80, 80)}),
        ("/faces/2", {"data": (32, 32)}),
    ],
)
def test_record_page_images_decode_with_the_records_bytes(
    server, browser, sample, tmp_path, path, sizes
):
    found, _ = sample
    dataset, key = path.strip("/").split("/")
    _open(browser, server + path)
    assert browser.find_element("id", "key").text == key
    shown = _images(browser)
    assert {i["alt"]: (i["width"], i["height"]) for i in shown} == sizes
    for item in shown:
        status, headers, data = get(str(item["src"]))  # the URL the browser decoded
        expected = found.images[(dataset, key, str(item["alt"]))]
        assert status == 200 and data == expected
        assert headers["content-type"] == (
            "image/png" if expected.startswith(b"\x89PNG") else "image/jpeg"
        )
    shot = tmp_path / f"serve-{dataset}.png"
    assert browser.save_screenshot(str(shot))
    pil = need("PIL.Image", why="the screenshot is checked with Pillow")
    with pil.open(shot) as picture:
        assert picture.size[0] > 500 and len(picture.convert("RGB").getcolors(1 << 20)) > 20
    keep = os.environ.get("SHARDCAT_SERVE_SCREENSHOT")  # docs/img/serve-record.png
    if keep and dataset == "train":
        shutil.copy(shot, keep)


def test_records_page_shows_thumbnails(server, browser):
    _open(browser, server + "/photos")
    assert [row[0] for row in _table(browser, "records")] == [f"s{i:03d}" for i in range(5)]
    assert {(i["alt"], i["width"]) for i in _images(browser)} == {("jpg", 80)}
    _open(browser, server + "/train")
    shown = _images(browser)  # (the record keyed <script>... has no image: its two are not)
    decoded = sorted((i["alt"], i["width"]) for i in shown if i["width"])
    assert decoded == [("image", 96)] * 12 + [("mask", 48)] * 12


def test_record_page_shows_json_text_numbers_and_tensors(server, browser):
    _open(browser, server + "/train/rec_000003")
    text = browser.find_element("tag name", "main").text
    assert (
        '"tags": [\n    "a",\n    "b"\n  ]' in browser.find_element("css selector", "pre.json").text
    )
    assert "a picture number 3" in text
    assert "shape (8,)" in text and "[0.0, 0.125, 0.25, 0.375, 0.5" in text
    assert text.endswith("score\n0.3")  # a float32 with a float32's digits
    assert browser.find_element("css selector", "span.number").text == "0"  # label


def test_keys_and_values_holding_html_render_as_text(server, browser):
    from selenium.common.exceptions import NoAlertPresentException

    _open(browser, server + "/train")
    link = browser.find_element("link text", XSS_KEY)
    link.click()
    assert browser.current_url == server + "/train/" + quote(XSS_KEY, safe="")
    assert browser.find_element("id", "key").text == XSS_KEY
    assert XSS_JSON["note"] in browser.find_element("css selector", "pre.json").text
    assert browser.find_element("css selector", "pre.text").text == XSS_TEXT
    counts = browser.execute_script(
        "return [document.scripts.length, document.querySelectorAll('img[src=x], b').length]"
    )
    assert counts == [0, 0]
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - reading it is the check


def _run_sql(browser, server: str, sql: str) -> None:
    _open(browser, server + "/-/sql")
    box = browser.find_element("id", "sql")
    box.clear()
    box.send_keys(sql)
    browser.find_element("id", "run").click()
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 20).until(lambda d: "sql=" in d.current_url)
    _open(browser, browser.current_url)  # (the answer is complete)


def test_sql_box_returns_rows(server, browser):
    _run_sql(browser, server, "SELECT label, count(*) AS n FROM train GROUP BY label ORDER BY 1")
    assert _table(browser, "result") == [["0", "4"], ["1", "4"], ["2", "4"], ["7", "1"]]
    assert browser.find_element("id", "sql").get_attribute("value").startswith("SELECT label")


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("DELETE FROM shardcat_shards", "only SELECT statements are allowed"),
        ("DROP VIEW train", "only SELECT statements are allowed"),
        ("ATTACH DATABASE 'x.db' AS x", "only SELECT statements are allowed"),
        ("SELECT load_extension('x')", "function load_extension() is not allowed"),
    ],
)
def test_sql_box_refuses_writes(server, browser, sample, sql, message):
    found, _ = sample
    before = _digest([found.catalog])
    _run_sql(browser, server, sql)
    assert message in browser.find_element("id", "error").text
    assert browser.find_elements("id", "result") == []
    assert _digest([found.catalog]) == before


def test_a_slow_query_is_cut_off(server, browser):
    _run_sql(browser, server, SLOW_SQL)
    assert "query exceeded its time limit of 1 s" in browser.find_element("id", "error").text


def test_facets_filters_paging_and_histogram(server):
    status, _, body = get(server + "/train?_facet=label")
    assert status == 200
    for value, n in (("0", 4), ("1", 4), ("2", 4), ("7", 1)):
        assert f'>{value}</a> <span class="meta">{n}</span>' in body.decode()
    status, _, body = get(server + "/train?label=1")
    keys = re.findall(r">(rec_\d+)</a>", body.decode())
    assert status == 200 and keys == ["rec_000001", "rec_000004", "rec_000007", "rec_000010"]
    status, _, body = get(server + "/train?_after=rec_000010")
    assert re.findall(r">(rec_\d+)</a>", body.decode()) == ["rec_000011"]
    status, _, body = get(server + "/-/histogram/train/label")
    counts = [int(n) for n in re.findall(r'<td class="num">(\d+)</td>\n<td style', body.decode())]
    assert status == 200 and counts == [4, 4, 4, 0, 0, 0, 0, 1]
    assert get(server + "/-/histogram/train/caption")[0] == 400


def test_listens_on_loopback_only_by_default(server):
    """The server's listening sockets (the kernel's table) are all on 127.0.0.1."""
    port = f"{int(server.rsplit(':', 1)[1]):04X}"
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and local.endswith(":" + port):  # LISTEN
                listening.append(local.rsplit(":", 1)[0])
    assert listening == ["0100007F"]  # 127.0.0.1, little-endian


def test_parquet_and_recordio_record_pages(server):
    status, _, body = get(server + "/table/row3")
    page = body.decode()
    assert status == 200 and '<pre class="text">text 3</pre>' in page
    assert '<dt>label</dt>\n<dd>\n<span class="number">1</span>' in page
    status, _, body = get(server + "/faces/2")
    page = body.decode()
    assert status == 200 and '<dt>label</dt>\n<dd>\n<span class="number">2.0</span>' in page


def test_urls_never_reach_the_filesystem(server):
    for path in (
        "/..%2F..%2Fetc%2Fpasswd",
        "/-/bytes?dataset=..%2F..%2Fetc&key=passwd&feature=x",
        "/-/bytes?dataset=train&key=..%2F..%2Fetc%2Fpasswd&feature=image",
        "/train/..%2Fc.sqlite",
        "/-/bytes?dataset=train&key=rec_000001&feature=..%2F..%2Fc.sqlite",
        "/-/histogram/train/..%2Fx",
    ):
        status, _, body = get(server + path)
        assert status in (400, 404), path
        assert b"root:" not in body and b"SQLite format" not in body


def test_answers_carry_safe_headers(server):
    _, headers, _ = get(server + "/train")
    assert "script-src" not in headers["content-security-policy"]
    assert headers["content-security-policy"].startswith("default-src 'none'")
    _, headers, _ = get(server + "/-/bytes?dataset=train&key=rec_000001&feature=meta")
    assert headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff"


def test_serving_never_writes_the_catalog_shards_or_tensor_stores(sample, tmp_path):
    found, tensors = sample
    watched = [found.catalog, *found.shards, *tensors.values()]
    before = _digest(watched)
    with serving(found.catalog, "--tensors", f"emb={tensors['emb']}", log=tmp_path / "log") as base:
        for path in (
            "/",
            "/train",
            "/train/rec_000001",
            "/photos/s000",
            "/faces/0",
            "/table/row1",
            "/-/sql?sql=SELECT+1",
            "/-/histogram/train/score",
            "/-/bytes?dataset=photos&key=s000&feature=jpg",
        ):
            assert get(base + path)[0] == 200, path
    assert _digest(watched) == before


class _Call:
    """One GET through the app in this process (its ASGI interface, as uvicorn calls
    it): the status, the sizes of the body's pieces and their sha256, the body kept
    only up to ``keep`` bytes."""

    def __init__(self, app, path: str, query: str = "", keep: int = 1 << 20) -> None:
        self.status, self.pieces, self.body = 0, [], b""
        self.digest = hashlib.sha256()
        scope = {
            "type": "http", "method": "GET", "path": path, "query_string": query.encode(),
            "headers": [], "http_version": "1.1", "scheme": "http", "root_path": "",
            "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
        }  # fmt: skip

        async def receive():
            await asyncio.sleep(60)
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif message.get("body"):
                self.pieces.append(len(message["body"]))
                self.digest.update(message["body"])
                if len(self.body) < keep:
                    self.body += message["body"]

        asyncio.run(app(scope, receive, send))


def test_a_large_tar_member_is_streamed_never_held(tmp_path):
    """A 48 MiB member goes out in 1 MiB pieces as it is read and checked, and its
    record page does not read it: the app never holds it whole."""
    from shardcat import Catalog
    from shardcat.web import Site, create_app

    big = os.urandom(1 << 20) * 48
    png = image("PNG", (8, 8), (1, 2, 3))
    with tarfile.open(tmp_path / "big.tar", "w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in (("x.bin", big), ("x.png", png)):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(tmp_path / "big.tar", "big", workers=1).close()
    with Catalog(tmp_path / "c.sqlite", readonly=True) as cat:
        site = Site(cat)
        app = create_app(site)
        tracemalloc.start()
        try:
            sent = _Call(app, "/-/bytes", "dataset=big&key=x&feature=bin", keep=0)
            streamed_peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.reset_peak()
            page = _Call(app, "/big/x")
            page_peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            site.close()
    assert sent.status == 200 and sent.digest.hexdigest() == hashlib.sha256(big).hexdigest()
    assert len(sent.pieces) == 48 and max(sent.pieces) == 1 << 20
    assert streamed_peak < 16 << 20  # one piece at a time (the member is 48 MiB)
    assert page.status == 200 and page_peak < 16 << 20
    text = page.body.decode()
    assert "50,331,648 bytes</a>" in text and "dataset=big&amp;key=x&amp;feature=png" in text


def test_command_line_errors_are_one_line(sample, tmp_path):
    from typer.testing import CliRunner

    from shardcat.cli import app

    found, _ = sample
    runner = CliRunner()
    for args, message in (
        (["--tensors", "emb"], "error: --tensors takes NAME=DIR, not 'emb'\n"),
        (
            ["--tensors", f"emb={tmp_path / 'none'}"],
            f"error: tensor store 'emb': no TensorBlob or TensorDB at {tmp_path / 'none'}\n",
        ),
    ):
        done = runner.invoke(app, ["serve", "-c", str(found.catalog), *args])
        assert (done.exit_code, done.output) == (1, message)
    done = runner.invoke(app, ["serve", "-c", str(tmp_path / "none.sqlite")])
    assert done.exit_code == 1 and done.output.startswith("error: no catalog at ")
    assert "Traceback" not in done.output
