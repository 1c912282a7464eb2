"""The packages: ``python -m build`` makes a wheel and an sdist, both carrying the web UI's
graph libraries (committed in ``static/vendor/``, copied there by ``make ui``); each, installed
into a new virtualenv, gives a ``triggerer run`` that serves the UI and its lineage graph, run
from outside the checkout.

A full install of the dependencies (PySpark is hundreds of MB) takes minutes, so the new
virtualenv gets them from this one's site-packages through a ``.pth`` line, added after the
package is installed: the ``triggerer`` imported is the new virtualenv's, never the checkout's
(the editable install's own ``.pth`` in that folder is not read that way).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).parents[3]
VENDOR = REPO / "triggerer" / "service" / "api" / "static" / "vendor"
VENDOR_FILES = ("cytoscape.js", "dagre.js")
WAIT_S = 90.0
"""How long the daemon may take to listen, and to stop after SIGTERM, on a busy machine."""
STEP_TIMEOUT_S = 300
"""A build or an install, on a busy machine (each fetches setuptools for its build)."""

# Two builds, two installs and two daemons: over two minutes on a busy machine. The builds are
# made in the first test to run, so each test may take all the steps.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.packages,
    pytest.mark.timeout(3 * STEP_TIMEOUT_S + 2 * WAIT_S),
]

PIPELINES = """
    from triggerer import Asset, pipeline

    @pipeline(schedule=Asset("orders"), outlets=[Asset("order_totals")])
    def total_orders(spark, context):
        pass
"""


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path


def run(*argv: str | Path, cwd: Path) -> None:
    done = subprocess.run(  # noqa: S603 - our own argv
        [str(part) for part in argv],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"


def clean_env() -> dict[str, str]:
    """This environment without what would point a process at the checkout or its settings."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("TRIGGERER_") and key not in ("PYTHONPATH", "VIRTUAL_ENV")
    }


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """The sdist of the checkout, and the wheel built from that sdist (as ``python -m build``
    does by default)."""
    missing = [name for name in VENDOR_FILES if not (VENDOR / name).is_file()]
    assert not missing, f"{VENDOR} lacks {missing}: run `make ui` first (`make test` does)"
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, REPO, cwd=out)
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return Dist(wheel, sdist)


def test_both_carry_the_ui_and_its_libraries(dist: Dist) -> None:
    ui = [f"triggerer/service/api/static/{name}" for name in ("index.html", "app.js")]
    ui += [f"triggerer/service/api/static/vendor/{name}" for name in VENDOR_FILES]
    with zipfile.ZipFile(dist.wheel) as wheel:
        assert set(ui) <= set(wheel.namelist())
    with tarfile.open(dist.sdist) as sdist:
        root = dist.sdist.name.removesuffix(".tar.gz")
        assert {f"{root}/{name}" for name in ui} <= set(sdist.getnames())


def installed(package: Path, folder: Path) -> Path:
    """A new virtualenv in ``folder`` with ``package`` installed; its ``bin`` folder."""
    run(sys.executable, "-m", "venv", "--without-pip", folder, cwd=folder.parent)
    python = folder / "bin" / "python"
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-deps",
        "-q",
        package,
        cwd=folder.parent,
    )
    # Only now: pip would otherwise see the checkout's editable triggerer as installed.
    purelib = Path(sysconfig.get_path("purelib"))
    site_packages = subprocess.check_output(  # noqa: S603 - our own argv
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
    ).strip()
    (Path(site_packages) / "_test_dependencies.pth").write_text(f"{purelib}\n")
    imported = subprocess.check_output(  # noqa: S603 - our own argv
        [python, "-c", "import triggerer, watchers; print(triggerer.__file__, watchers.__file__)"],
        text=True,
        cwd=folder.parent,
        env=clean_env(),
    ).split()
    assert all(Path(path).is_relative_to(site_packages) for path in imported), imported
    return folder / "bin"


def config_file(folder: Path) -> Path:
    """A daemon on SQLite in ``folder``, its API on a free loopback port, and a Spark Connect
    address where nothing listens: no run starts, the UI and the graph are what is checked."""
    pipelines = folder / "pipelines"
    pipelines.mkdir()
    (pipelines / "orders.py").write_text(textwrap.dedent(PIPELINES))
    settings: dict[str, dict[str, Any]] = {
        "database": {"url": f"sqlite:///{folder / 'triggerer.db'}"},
        "pipelines": {"dir": str(pipelines)},
        "api": {"enabled": True, "host": "127.0.0.1", "port": 0, "tokens": []},
        "spark": {"mode": "connect", "remote": "sc://127.0.0.1:1", "logs_dir": str(folder)},
        "logging": {"format": "json"},
    }
    lines = []
    for section, values in settings.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in values.items())
    path = folder / "triggerer.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def api_url(log: Path, daemon: subprocess.Popen[bytes]) -> str:
    """The API's address, once the daemon logs ``api_listening``."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if '"event": "api_listening"' in line:
                url: str = json.loads(line)["url"]
                return url
        assert daemon.poll() is None, f"triggerer exited:\n{log.read_text()}"
        time.sleep(0.2)
    raise AssertionError(f"no api_listening after {WAIT_S} s:\n{log.read_text()}")


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_the_installed_package_serves_the_ui_and_the_graph(
    dist: Dist, kind: str, tmp_path: Path
) -> None:
    package = dist.wheel if kind == "wheel" else dist.sdist
    bin_dir = installed(package, tmp_path / "venv")
    work = tmp_path / "work"  # the daemon's working folder, far from the checkout
    work.mkdir()
    config = config_file(work)
    log = work / "daemon.log"
    with log.open("wb") as output:
        daemon = subprocess.Popen(  # noqa: S603 - the installed program
            [bin_dir / "triggerer", "run", "--config", config],
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=work,
            env=clean_env(),
        )
    try:
        api = api_url(log, daemon)
        with httpx.Client(base_url=api.removesuffix("/api/v1"), timeout=WAIT_S) as client:
            health = client.get("/api/v1/healthz")
            assert (health.status_code, health.json()["status"]) == (200, "ok")
            home = client.get("/")
            assert home.status_code == 200
            assert 'src="/ui/app.js"' in home.text
            for path in ("/ui/app.js", *(f"/ui/vendor/{name}" for name in VENDOR_FILES)):
                served = client.get(path)
                assert served.status_code == 200, path
                assert served.content == (VENDOR.parent / path.removeprefix("/ui/")).read_bytes()
            # The API starts once the pipelines folder is loaded: the graph is there.
            graph = client.get("/api/v1/lineage").json()
        names = {node["id"]: node["name"] for node in graph["nodes"]}
        edges = {(names[e["source"]], e["kind"], names[e["target"]]) for e in graph["edges"]}
        assert edges == {
            ("orders", "schedules", "total_orders"),
            ("total_orders", "produces", "order_totals"),
        }
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(WAIT_S) == 0, log.read_text()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
