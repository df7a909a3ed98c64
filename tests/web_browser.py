"""Running ``catalog serve`` and headless Chromium for the serve tests, each bounded
in time and stopped in teardown: the server as a real subprocess on a free loopback
port, Chromium (Debian's ``chromium`` and ``chromium-driver``) through Selenium."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardcat.testing.required import missing, need
from shardcat.testing.servers import free_port

STEP = 20  # seconds any one browser or server step may take


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one GET (an error status is returned too)."""
    try:
        with urllib.request.urlopen(url, timeout=STEP) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL what is left after :data:`STEP` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STEP)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(STEP)


@contextlib.contextmanager
def serving(catalog: str | Path, *args: str, log: Path) -> Iterator[str]:
    """``catalog serve -c catalog ARGS`` on a free port until it answers ``/``; yields
    its base URL; stopped (and its process group with it) afterwards."""
    port = free_port()
    command = [sys.executable, "-m", "shardcat", "serve", "-c", str(catalog), "--port", str(port)]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*command, *args], stdout=out, stderr=out, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STEP
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"catalog serve exited: {log.read_text()}")
            try:
                with urllib.request.urlopen(base + "/", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"catalog serve did not answer: {log.read_text()}") from None
                time.sleep(0.1)
        yield base
    finally:
        _stop(process)


CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1100,900",
)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A Selenium driver of headless Chromium with a new empty profile; every page
    load and script bounded by :data:`STEP` seconds; quit (and its process group
    killed) afterwards."""
    browser, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver_path is None:
        missing("Debian's chromium and chromium-driver (make test installs them)")
    webdriver = need("selenium.webdriver", why="the serve tests drive Chromium with Selenium")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="shardcat-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    service = Service(driver_path, popen_kw={"start_new_session": True})
    driver = None
    try:
        driver = webdriver.Chrome(service=service, options=options)
        driver.set_page_load_timeout(STEP)
        driver.set_script_timeout(STEP)
        yield driver
    finally:
        if driver is not None:
            with contextlib.suppress(Exception):  # (it may be gone already)
                driver.quit()
        process = getattr(service, "process", None)
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(profile, ignore_errors=True)
