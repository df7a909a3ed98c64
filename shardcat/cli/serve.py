"""serve: a read-only web view of the catalog (the ``web`` extra)."""

from __future__ import annotations

from typing import Annotated

import typer

from shardcat.cli.common import handle_errors, open_to_read
from shardcat.cli.options import CatalogOpt, ReadModeOpt
from shardcat.errors import CatalogError

__all__ = ["register", "serve"]

INSTALL_HINT = "pip install 'shardcat[web]'"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@handle_errors
def serve(
    catalog: CatalogOpt = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on (another than 127.0.0.1 shares it).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8001,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", metavar="SECONDS", min=0.001, help="Stop a SQL statement after this long."
        ),
    ] = 10.0,
    memory: Annotated[
        float,
        typer.Option(
            "--memory", metavar="MB", min=0.001, help="Stop a query whose rows hold more."
        ),
    ] = 64.0,
    tensors: Annotated[
        list[str] | None,
        typer.Option(
            "--tensors",
            metavar="NAME=DIR",
            help="Also list a TensorBlob or TensorDB directory (read-only; repeatable).",
        ),
    ] = None,
    readonly: ReadModeOpt = True,
) -> None:
    """Serve a read-only web view: datasets, records, images, SQL.

    Pages: / the datasets; /DATASET its records (filters, facets, paging,
    thumbnails); /DATASET/KEY one record, every feature shown for what it is;
    /-/sql the SQL box (the guard of `catalog query`: SELECT only, --timeout,
    --memory). Nothing is ever written, to the catalog or a shard.

    Example: catalog serve -c shardcat.sqlite --port 8001
    """
    named: dict[str, str] = {}
    for item in tensors or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise CatalogError(f"--tensors takes NAME=DIR, not {item!r}")
        named[name] = path
    try:
        from shardcat.web import Limits, Site
        from shardcat.web import serve as run
    except ImportError as exc:
        raise CatalogError(f"catalog serve needs {exc.name}: {INSTALL_HINT}") from None
    limits = Limits(timeout=timeout, memory=int(memory * 2**20))
    with open_to_read(catalog, readonly) as cat:
        site = Site(cat, limits=limits, tensors=named)
        try:
            typer.echo(f"serving {cat.path} at http://{host}:{port}/ (Ctrl-C stops)", err=True)
            if host not in LOOPBACK:
                typer.echo(
                    f"warning: listening on {host}: whoever reaches it reads every record", err=True
                )
            run(site, host=host, port=port)
        finally:
            site.close()


def register(app: typer.Typer) -> None:
    app.command()(serve)
