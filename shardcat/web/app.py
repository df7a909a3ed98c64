"""The ASGI app of ``catalog serve`` (Starlette, Jinja2 with autoescaping): routes,
the readers it keeps open, the bytes it streams and the headers of every answer.

Nothing from a URL reaches the filesystem: a dataset name must be one the
catalog lists, a key and feature are looked up in the catalog, tensor stores
are addressed by the names given on the command line. Every page is written by
templates that escape every value; the Content-Security-Policy allows no
script at all."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote as url_quote
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route

from shardcat.catalog import DatasetInfo
from shardcat.errors import CatalogError, KeyNotFoundError, NoSuchFeatureError, ShardcatError
from shardcat.facade.catalog import Catalog
from shardcat.facade.records import feature_chunks, feature_value, features_of
from shardcat.formats.registry import get_format
from shardcat.readers.reader import Reader
from shardcat.web import pages, values

__all__ = ["Site", "create_app"]

PAGE_SIZE = 50  # records per page
INLINE_MEMBER = 1 << 20  # tar members up to this size are read for the record page
STREAM_PIECE = 1 << 20  # bytes per piece of a value held whole, as it is sent
IMAGES = frozenset(values.IMAGE_TYPES.values())
THUMBNAIL_PROBES = 5  # records of a page read to find which features hold images

HTML_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
BYTES_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "X-Content-Type-Options": "nosniff",
}


def record_url(dataset: str, key: str) -> str:
    """The shareable link of a record: ``/train/rec_000042``."""
    return f"/{url_quote(dataset, safe='')}/{url_quote(key, safe='')}"


def bytes_url(dataset: str, key: str, feature: str, index: int = 0) -> str:
    query = {"dataset": dataset, "key": key, "feature": feature, "index": index}
    return "/-/bytes?" + urlencode(query)


def page_url(path: str, params: list[tuple[str, str]]) -> str:
    return path + ("?" + urlencode(params) if params else "")


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (bytes, memoryview)):
        return f"<{len(value):,} bytes>"
    return str(value)


class Site:
    """What the app serves: one catalog opened read-only (or immutable), a reader per
    dataset (opened on first use, shared by the request threads), the limits of
    every statement and the tensor stores named on the command line."""

    def __init__(
        self,
        cat: Catalog,
        *,
        limits: pages.Limits | None = None,
        tensors: dict[str, str] | None = None,
    ) -> None:
        self.cat = cat
        self.limits = limits or pages.Limits()
        self.tensors = dict(tensors or {})
        for name, path in self.tensors.items():  # (each must open now: a typo fails here)
            pages.tensor_store(name, path)
        self._readers: dict[str, Reader] = {}
        self._lock = threading.Lock()
        env = jinja2.Environment(
            loader=jinja2.PackageLoader("shardcat.web", "templates"),
            autoescape=True,  # every {{ value }} is HTML-escaped
            undefined=jinja2.StrictUndefined,
        )
        env.globals.update(record_url=record_url, bytes_url=bytes_url, page_url=page_url)
        env.filters["cell"] = _cell
        self.env = env
        #: what the header names: a file's name (not where it lies), a server's URL
        file = cat.store.backend.local_file
        self.title = str(cat.path) if file is None else file.name

    def info(self, name: str) -> DatasetInfo:
        """The dataset ``name`` (404 unless the catalog lists it)."""
        for info in self.cat.datasets():
            if info.name == name:
                return info
        raise HTTPException(404, f"no dataset {name!r} in this catalog")

    def reader(self, name: str) -> Reader:
        """The reader of the dataset ``name`` (404 unless the catalog lists it)."""
        if not self.cat.store.has_dataset(name):
            raise HTTPException(404, f"no dataset {name!r} in this catalog")
        with self._lock:
            if name not in self._readers:
                self._readers[name] = self.cat.dataset(name)
            return self._readers[name]

    def page(self, template: str, code: int = 200, **context: Any) -> HTMLResponse:
        text = self.env.get_template(template).render(catalog=self.title, **context)
        return HTMLResponse(text, code, headers=HTML_HEADERS)

    def close(self) -> None:
        with self._lock:
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()


def _parts(reader: Reader) -> bool:
    """Records made of members read one by one (tar samples keyed by name)."""
    return get_format(reader.format).PARTS and reader.key_rule != "position"


def _record_features(reader: Reader, key: str) -> list[dict[str, Any]]:
    """The features of record ``key`` as the record page lists them; tar members
    over :data:`INLINE_MEMBER` bytes are not read (an image is linked, streamed)."""
    items: list[dict[str, Any]] = []
    if _parts(reader):
        located = reader.index.get(key)
        if located is None:
            raise KeyNotFoundError(f"key {key!r} not in dataset {reader.dataset!r}")
        for name, where in sorted(located.items()):
            size = int(where["size"])
            if size > INLINE_MEMBER:
                kind = "image" if values.image_member(name) else "large"
                shown = [values.Shown(kind, size=size)]
            else:
                shown = values.show([feature_value(reader, key, name)])
            items.append({"name": name, "values": shown})
        return items
    for name, found in sorted(features_of(reader, key).items()):
        items.append({"name": name, "values": values.show(list(found))})
    return items


def _image_features(reader: Reader, key: str) -> list[str]:
    """The features of ``key`` that hold an image (their first value): the records
    page shows them as thumbnails for every record."""
    if _parts(reader):
        return sorted(name for name in reader.index.get(key) or {} if values.image_member(name))
    return [
        name
        for name, found in sorted(features_of(reader, key).items())
        if found and isinstance(found[0], bytes) and values.content_type(found[0]) in IMAGES
    ]


def _datasets(request: Request) -> Response:
    site: Site = request.app.state.site
    stores = [pages.tensor_store(name, path) for name, path in site.tensors.items()]
    return site.page("datasets.html", datasets=pages.summaries(site.cat), tensors=stores)


def _records(request: Request) -> Response:
    site: Site = request.app.state.site
    info = site.info(request.path_params["dataset"])
    query = request.query_params
    facets = query.getlist("_facet")
    filters = {k: v for k, v in query.multi_items() if not k.startswith("_")}
    page = pages.records_page(
        site.cat,
        info,
        filters=filters,
        facets=facets,
        after=query.get("_after"),
        size=PAGE_SIZE,
        limits=site.limits,
    )
    reader = site.reader(info.name)
    images = sorted(
        {f for row in page.rows[:THUMBNAIL_PROBES] for f in _image_features(reader, str(row[0]))}
    )
    kept = [(k, v) for k, v in query.multi_items() if k != "_after"]
    return site.page(
        "records.html", info=info, page=page, images=images, kept=kept, filters=filters
    )


def _record(request: Request) -> Response:
    site: Site = request.app.state.site
    name, key = request.path_params["dataset"], request.path_params["key"]
    reader = site.reader(name)
    features = _record_features(reader, key)
    return site.page("record.html", dataset=name, key=key, features=features)


def _pieces(data: bytes) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), STREAM_PIECE):
        yield bytes(view[start : start + STREAM_PIECE])


def _bytes(request: Request) -> Response:
    """One value of one feature, streamed: a tar member as it is read and checked,
    any other value (decoded whole by its format) in pieces."""
    site: Site = request.app.state.site
    query = request.query_params
    try:
        name, key, feature = query["dataset"], query["key"], query["feature"]
        index = int(query.get("index", "0"))
    except (KeyError, ValueError):
        raise HTTPException(400, "give dataset, key, feature and index (a number)") from None
    reader = site.reader(name)
    chunks = feature_chunks(reader, key, feature, index)
    headers = dict(BYTES_HEADERS)
    if chunks is None:
        value = feature_value(reader, key, feature, index)
        data = value if isinstance(value, bytes) else str(value).encode()
        headers["Content-Length"] = str(len(data))
        chunks = _pieces(data)
    else:
        size = (reader.index.get(key) or {}).get(feature, {}).get("size")
        if size is not None:
            headers["Content-Length"] = str(size)
    first = next(chunks, b"")
    return StreamingResponse(
        itertools.chain([first], chunks),
        headers=headers,
        media_type=values.content_type(first),
    )


def _histogram(request: Request) -> Response:
    site: Site = request.app.state.site
    info = site.info(request.path_params["dataset"])
    found = pages.histogram(site.cat, info, request.path_params["field"], site.limits)
    peak = max((n for _, _, n in found.bars), default=0)
    return site.page("histogram.html", info=info, histogram=found, peak=peak)


def _sql(request: Request) -> Response:
    site: Site = request.app.state.site
    sql = request.query_params.get("sql", "").strip()
    if not sql:
        names = [info.name for info in site.cat.datasets()]
        example = f"SELECT * FROM {names[0]} LIMIT 10" if names else "SELECT 1"
        return site.page("sql.html", sql=example, result=None, error=None)
    try:
        result = pages.run_sql(site.cat, sql, site.limits)
    except CatalogError as exc:
        return site.page("sql.html", 400, sql=sql, result=None, error=str(exc))
    return site.page("sql.html", sql=sql, result=result, error=None)


def _error(request: Request, exc: Exception) -> Response:
    site: Site = request.app.state.site
    if isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    elif isinstance(exc, (KeyNotFoundError, NoSuchFeatureError)):
        status, message = 404, str(exc)
    elif isinstance(exc, OSError):
        status, message = 503, str(exc)  # a shard or tensor store that cannot be read now
    else:
        status, message = 400, str(exc)
    return site.page("error.html", status, status=status, message=message)


def create_app(site: Site) -> Starlette:
    """The app serving ``site``: ``/`` the datasets, ``/-/sql`` the SQL box,
    ``/-/histogram/<dataset>/<field>``, ``/-/bytes?dataset=&key=&feature=&index=``
    one value, ``/<dataset>`` its records, ``/<dataset>/<key>`` one record."""
    app = Starlette(
        routes=[
            Route("/", _datasets),
            Route("/-/sql", _sql),
            Route("/-/bytes", _bytes),
            Route("/-/histogram/{dataset}/{field}", _histogram),
            Route("/{dataset}", _records),
            Route("/{dataset}/{key:path}", _record),
        ],
        exception_handlers={HTTPException: _error, ShardcatError: _error, OSError: _error},
    )
    app.state.site = site
    return app
