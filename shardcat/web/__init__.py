"""``catalog serve``: a read-only web view of a catalog (the ``web`` extra).

A small ASGI app (Starlette, served by uvicorn, pages written by Jinja2 with
autoescaping) over the public :class:`~shardcat.Catalog` API: the datasets
(:mod:`.pages`), a dataset's records with facets and paging, a record page
showing every feature for what it is (:mod:`.values`), a histogram of a numeric
field, the SQL box through the guard of ``catalog query``, and TensorBlob /
TensorDB directories with their shapes. Routes and headers: :mod:`.app`.

Why not Datasette: it serves SQLite files, so it would show the catalog's own
tables, could not open a PostgreSQL catalog, and would run SQL through its own
checks instead of shardcat's guard; record pages and image bytes must come
through the :class:`~shardcat.Reader` (checked reads, remote shards, tar
members streamed) anyway, which would have been most of a plugin.
"""

from __future__ import annotations

from shardcat.web.app import Site, create_app
from shardcat.web.pages import Limits

__all__ = ["Limits", "Site", "create_app", "serve"]


def serve(site: Site, *, host: str = "127.0.0.1", port: int = 8001) -> None:
    """Serve ``site`` on ``host:port`` until Ctrl-C (or SIGTERM)."""
    import uvicorn

    config = uvicorn.Config(
        create_app(site), host=host, port=port, log_level="warning", access_log=False
    )
    uvicorn.Server(config).run()
