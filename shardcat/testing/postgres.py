"""A private PostgreSQL server for tests and benchmarks: started in a temporary
directory on a free loopback port, used, stopped and deleted.

PostgreSQL refuses to run as root, so as root the cluster belongs to an
unprivileged user (``nobody``) and its commands run through ``runuser``. The
server binaries are found with ``pg_config``, on ``PATH``, or in Debian's
``/usr/lib/postgresql/<version>/bin``; ``$SHARDCAT_PG_BIN`` names another
directory.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["find_binaries", "postgres_server", "restart"]

# url -> what restarts that running server (see restart)
_restarts: dict[str, Callable[[], None]] = {}


def find_binaries() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres`` (None: not installed)."""
    candidates = [os.environ.get("SHARDCAT_PG_BIN", "")]
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(out.stdout.strip())
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(os.path.dirname(initdb))
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for directory in candidates:
        if directory and all(
            os.access(os.path.join(directory, name), os.X_OK)
            for name in ("initdb", "pg_ctl", "postgres")
        ):
            return Path(directory)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def postgres_server(user: str = "shardcat") -> Iterator[str]:
    """Run a throwaway server; yields the URL of its ``postgres`` database
    (``postgresql://<user>@127.0.0.1:<port>/postgres``, trust authentication)."""
    binaries = find_binaries()
    if binaries is None:
        raise RuntimeError(
            "PostgreSQL server binaries not found (initdb, pg_ctl, postgres): install "
            "them (Debian: apt-get install postgresql) or set $SHARDCAT_PG_BIN"
        )
    as_root = os.geteuid() == 0
    run_as = ["runuser", "-u", "nobody", "--"] if as_root else []
    base = Path(tempfile.mkdtemp(prefix="shardcat-pg-"))
    data = base / "data"
    if as_root:
        os.chmod(base, 0o755)
        shutil.chown(base, "nobody")
    port = _free_port()
    env = {**os.environ, "LC_ALL": "C"}

    def run(*args: str) -> None:
        done = subprocess.run([*run_as, *args], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")

    started = False
    try:
        run(str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", user, "-E", "UTF8",
            "--no-sync")  # fmt: skip
        options = (
            f"-k {base} -p {port} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=100"
        )
        start = (str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l",
                 str(base / "log"), "-w", "start")  # fmt: skip
        run(*start)
        started = True
        url = f"postgresql://{user}@127.0.0.1:{port}/postgres"

        def again() -> None:  # (the server's output goes to the log, never to our pipes)
            run(str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
            run(*start)

        _restarts[url] = again
        yield url
    finally:
        _restarts.pop(f"postgresql://{user}@127.0.0.1:{port}/postgres", None)
        if started:
            subprocess.run(
                [*run_as, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                 "stop"],
                capture_output=True,
                env=env,
            )  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)


def restart(url: str) -> None:
    """Restart the server :func:`postgres_server` yielded ``url`` for (an immediate
    stop, as a crash or failover: every connection is cut), and wait until it is up.

    What was committed survives it, as on a server with ``synchronous_commit=on``:
    this test server runs with it off (for speed), so a ``CHECKPOINT`` first writes
    out the last commits, which an immediate stop would otherwise lose."""
    import psycopg  # (the postgres extra: only where a server is used)

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CHECKPOINT")
    _restarts[url]()


@contextmanager
def fresh_database(server: str) -> Iterator[str]:
    """A new, empty database on ``server`` (a URL :func:`postgres_server` yields): its
    URL, dropped afterwards (with any connection still open to it)."""
    import psycopg  # (the postgres extra: only where a server is used)

    name = f"db{os.getpid()}_{time.monotonic_ns()}"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    try:
        yield server.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(server, autocommit=True) as c:
            c.execute(f"DROP DATABASE {name} WITH (FORCE)")
