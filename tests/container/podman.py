"""Podman for the container tests: its settings for this machine, images, and a running
container of the image with its API published on a loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

REPO = Path(__file__).resolve().parents[2]
STATE = REPO / "var" / "container"
"""Podman's settings and storage (images, volumes), kept between sessions: git-ignored."""
BASE_IMAGE = "localhost/triggerer-base:bookworm"
"""Debian bookworm made by debootstrap: no registry is reachable here to pull one."""
IMAGE = "localhost/triggerer:dev"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
"""The mirror of this machine's own apt sources, which the image's build uses too."""
STATE_DIR = "/var/lib/triggerer"
PIPELINES_DIR = "/opt/triggerer/pipelines"
CONFIG_FILE = "/etc/triggerer/triggerer.toml"
API_PORT = 8080
"""Where the image's API listens."""
START_TIMEOUT_S = 120.0
"""From ``podman run`` to a healthy daemon on a busy two-core machine."""
COMMAND_TIMEOUT_S = 120.0
"""Any podman command but a build."""

RecordProperty = Callable[[str, object], None]
"""pytest's ``record_property`` fixture: a figure of the test, printed at the end of the
session (``conftest.pytest_terminal_summary``)."""

# runc: crun fails on this machine's hybrid cgroups. Its ulimits: the VM cannot raise the
# rlimits podman sets by default.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[engine]
runtime = "runc"
"""


@dataclass(frozen=True)
class Podman:
    """Runs ``podman`` with the settings and the storage of :data:`STATE`."""

    env: dict[str, str]

    @classmethod
    def configured(cls) -> Podman:
        STATE.mkdir(parents=True, exist_ok=True)
        containers_conf = STATE / "containers.conf"
        containers_conf.write_text(CONTAINERS_CONF)
        storage_conf = STATE / "storage.conf"
        storage_conf.write_text(
            textwrap.dedent(f"""\
                [storage]
                driver = "overlay"
                graphroot = "{STATE / "storage"}"
                runroot = "{STATE / "run"}"
            """)
        )
        env = {key: value for key, value in os.environ.items() if not key.startswith("TRIGGERER_")}
        env["CONTAINERS_CONF"] = str(containers_conf)
        env["CONTAINERS_STORAGE_CONF"] = str(storage_conf)
        return cls(env)

    def __call__(
        self, *argv: str, timeout_s: float = COMMAND_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """``podman ARGV``, its output captured; whether it failed is the caller's to check."""
        return subprocess.run(  # noqa: S603 - our own argv
            ["podman", *argv],  # noqa: S607 - podman from PATH, as a user runs it
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def ok(self, *argv: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        """The output of ``podman ARGV``, which must succeed."""
        done = self(*argv, timeout_s=timeout_s)
        assert done.returncode == 0, f"podman {argv} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def shared_folder(path: Path) -> Path:
    """``path`` made readable by the image's user (uid 10001) when mounted: the folder and
    its files, not its parents (a mount does not go through them)."""
    path.chmod(0o755)
    for file in path.iterdir():
        file.chmod(0o644)
    return path


class Container:
    """A container of the image, started with ``podman run -d``: its API on a loopback port of
    this machine (``--publish``), the state on a volume of its own."""

    def __init__(self, podman: Podman, image: str, *, api_port: int = API_PORT) -> None:
        self.podman = podman
        self.image = image
        self.api_port = api_port
        self.host_port = free_port()
        self.name = f"triggerer-test-{self.host_port}"
        self.volume = podman.ok("volume", "create").strip()
        self.started_at: float | None = None
        """When ``podman run`` was called (``time.monotonic``)."""
        self.healthz_s: float | None = None
        """Seconds from ``podman run`` until ``/healthz`` first answered 200."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.host_port}/api/v1"

    def start(self, *options: str) -> None:
        """``podman run`` read-only, with no capabilities, /tmp on a tmpfs, the state on the
        volume, and ``options``."""
        self.started_at = time.monotonic()
        self.podman.ok(
            "run",
            "--detach",
            f"--name={self.name}",
            "--read-only",
            "--cap-drop=ALL",
            "--tmpfs=/tmp",
            f"--volume={self.volume}:{STATE_DIR}",
            f"--publish=127.0.0.1:{self.host_port}:{self.api_port}",
            *options,
            self.image,
        )

    def logs(self) -> str:
        done = self.podman("logs", self.name)
        return f"\n--- container log ---\n{done.stdout}{done.stderr}"

    def exec(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.podman("exec", self.name, *argv)

    def seconds_since_start(self) -> float:
        assert self.started_at is not None, "start() first"
        return time.monotonic() - self.started_at

    async def wait_healthz(self) -> float:
        """Seconds from ``podman run`` until ``/healthz`` first answered 200, once it does."""
        if self.healthz_s is not None:
            return self.healthz_s
        async with httpx.AsyncClient(timeout=5) as client:
            try:
                with anyio.fail_after(START_TIMEOUT_S):
                    while True:
                        try:
                            if (await client.get(f"{self.url}/healthz")).status_code == 200:
                                self.healthz_s = self.seconds_since_start()
                                return self.healthz_s
                        except httpx.TransportError:
                            pass  # not listening yet
                        await anyio.sleep(0.2)
            except TimeoutError:
                raise AssertionError(f"no /healthz in {START_TIMEOUT_S} s{self.logs()}") from None

    async def wait_ready(self, token: str) -> float:
        """Seconds from ``podman run`` until ``/readyz`` answers 200 (the store answers and
        the daemon's heartbeat is fresh), once it does."""
        await self.wait_healthz()
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(timeout=5, headers=headers) as client:
            try:
                with anyio.fail_after(START_TIMEOUT_S):
                    while True:
                        if (await client.get(f"{self.url}/readyz")).status_code == 200:
                            break
                        await anyio.sleep(0.2)
            except TimeoutError:
                raise AssertionError(f"no /readyz in {START_TIMEOUT_S} s{self.logs()}") from None
        return self.seconds_since_start()

    def remove(self) -> None:
        self.podman("rm", "--force", "--time=0", self.name)
        self.podman("volume", "rm", "--force", self.volume)
