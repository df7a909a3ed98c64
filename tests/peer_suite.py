"""Running a peer package's own test suite against shardcat (tfd-utils, tensorblob).

The peer's tests are never copied into this repository: ``make test`` downloads
the peer's sdist into the git-ignored ``.peer/``; :func:`sdist` finds it (and
checks its sha256), :func:`unpack_tests` writes its ``tests/`` into a temporary
directory, and :func:`run_suite` runs them with pytest in a subprocess whose
``PYTHONPATH`` starts with a shim, returning each test's outcome.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from shardcat.testing.required import missing

PEER_DIR = Path(__file__).resolve().parents[1] / ".peer"


def sdist(filename: str, sha256: str, make_target: str) -> Path:
    """The peer's sdist in ``.peer/``, checked against its pinned sha256."""
    path = PEER_DIR / filename
    if not path.is_file():
        missing(f"{filename} is not in .peer/: run `make {make_target}`")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == sha256, f"{filename}: unexpected sha256 {digest}"
    return path


def unpack_tests(archive: Path, top: str, dest: Path) -> Path:
    """Write the sdist's ``<top>/tests/`` files under ``dest``; returns ``dest``."""
    prefix = PurePosixPath(top, "tests")
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = PurePosixPath(member.name)
            if not member.isfile() or prefix not in name.parents:
                continue
            parts = name.relative_to(prefix.parent).parts
            assert ".." not in parts and not name.is_absolute(), member.name
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
    assert (dest / "tests" / "conftest.py").is_file()
    return dest


def peer_env(shim_dir: Path, tmp: Path | None = None) -> dict[str, str]:
    """The environment of the peer's run: the shim first on ``PYTHONPATH``, no
    plugins of ours, no catalog of ours; ``tmp`` as ``TMPDIR`` when given."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTEST_") and k != "SHARDCAT_CATALOG"
    }
    env["PYTHONPATH"] = os.pathsep.join(
        [str(shim_dir), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    return env


def imported(code: str, cwd: Path, env: dict[str, str]) -> list[str]:
    """What ``code`` prints in the peer's environment (to check that the shim wins)."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.split()


@dataclass
class SuiteRun:
    summary: str  # pytest's last line
    outcomes: dict[str, str]  # node id -> passed | failure | error | skipped
    output: str

    @property
    def bad(self) -> dict[str, str]:
        return {node: kind for node, kind in self.outcomes.items() if kind != "passed"}


def run_suite(
    peer: Path,
    env: dict[str, str],
    work: Path,
    targets: Sequence[str],
    deselect: Sequence[str],
    plugins: Sequence[str] = (),
) -> SuiteRun:
    """Run the peer's tests ``targets`` with pytest (``deselect``: node ids left out,
    ``plugins``: modules loaded first); every deselected node must exist."""
    (work / "pytest.ini").write_text("[pytest]\n")
    report = work / "report.xml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *[arg for plugin in plugins for arg in ("-p", plugin)],
            "-c",
            str(work / "pytest.ini"),
            "--rootdir",
            str(peer),
            "--basetemp",
            str(work / "basetemp"),
            "--junitxml",
            str(report),
            *[f"--deselect={node}" for node in deselect],
            *targets,
        ],
        cwd=peer,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    output = f"{summary}\n{result.stdout[-20_000:]}{result.stderr[-5_000:]}"
    assert report.is_file(), output
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        node = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[node] = kinds[0] if kinds else "passed"
    run = SuiteRun(summary, outcomes, output)
    assert not run.bad, f"{run.bad}\n{output}"
    assert result.returncode == 0, output
    deselected = re.search(r"(\d+) deselected", summary) if deselect else None
    # a --deselect that matches no test is ignored by pytest: the count proves each one exists
    assert not deselect or (deselected and int(deselected.group(1)) == len(deselect)), summary
    return run
