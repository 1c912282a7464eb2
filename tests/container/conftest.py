"""Fixtures of the container tests: podman set up for this machine, and the image, built once
per session by ``make image`` on a Debian base made here with debootstrap (no registry is
reachable to pull one). The base stays in podman's storage under ``var/container/``, so a
second session builds only the image, from podman's layer cache.

The figures the tests record (image size, seconds to start, to stop...) are printed at the end
of the session."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from tests.container.podman import (
    BASE_IMAGE,
    DEBIAN_MIRROR,
    IMAGE,
    REPO,
    STATE,
    Podman,
)

BASE_TIMEOUT_S = 900
"""debootstrap takes about a minute here, more on a busy mirror."""
BUILD_TIMEOUT_S = 1800
"""``make image``: the wheels (PySpark's is hundreds of MB) and two Debian stages, about seven
minutes on a busy two-core machine. The session's first container test waits for it and the
base, so each module's timeout allows for both."""


@pytest.fixture(scope="session")
def podman() -> Podman:
    if shutil.which("podman") is None or shutil.which("debootstrap") is None:
        pytest.fail("the container tests need podman and debootstrap (.ci/run installs them)")
    return Podman.configured()


@dataclass(frozen=True)
class Built:
    image: str
    base_s: float | None
    """Seconds to make the base, None when podman's storage had it."""
    image_s: float
    """Seconds of ``make image``."""


@pytest.fixture(scope="session")
def built(podman: Podman) -> Built:
    """The image ``make image`` builds, on :data:`BASE_IMAGE`, and how long that took."""
    base_s = None
    if podman("image", "exists", BASE_IMAGE).returncode != 0:
        started = time.monotonic()
        build_base(podman)
        base_s = time.monotonic() - started
    started = time.monotonic()
    log = STATE / "build.log"
    with log.open("w") as out:
        done = subprocess.run(  # noqa: S603 - our own argv
            [  # noqa: S607 - make from PATH, as a developer runs it
                "make",
                "-C",
                str(REPO),
                "image",
                f"BASE_IMAGE={BASE_IMAGE}",
                f"IMAGE={IMAGE}",
                "CONTAINER=podman",
                f"PYTHON={sys.executable}",
            ],
            env=podman.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    assert done.returncode == 0, f"make image failed; its last lines:\n{tail(log.read_text())}"
    return Built(IMAGE, base_s, time.monotonic() - started)


@pytest.fixture(scope="session")
def triggerer_image(built: Built) -> str:
    """The name of the image ``make image`` builds, on :data:`BASE_IMAGE`."""
    return built.image


def build_base(podman: Podman) -> None:
    """Debian bookworm's minimal base, as ``debian:bookworm-slim`` is, imported into podman."""
    rootfs = STATE / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    done = subprocess.run(  # noqa: S603 - our own argv
        [  # noqa: S607 - debootstrap from PATH
            "debootstrap",
            "--variant=minbase",
            "bookworm",
            str(rootfs),
            DEBIAN_MIRROR,
        ],
        capture_output=True,
        text=True,
        timeout=BASE_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"debootstrap failed:\n{tail(done.stdout + done.stderr)}"
    # What apt downloaded to install it: no part of an image (the slim image has none either).
    for junk in ("var/cache/apt/*.bin", "var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_*"):
        for path in rootfs.glob(junk):
            path.unlink()
    tarball = STATE / "base.tar"
    try:
        subprocess.run(  # noqa: S603 - our own argv
            ["tar", "-C", str(rootfs), "-cf", str(tarball), "."],  # noqa: S607 - tar from PATH
            check=True,
            timeout=BASE_TIMEOUT_S,
        )
        podman.ok("import", str(tarball), BASE_IMAGE, timeout_s=BASE_TIMEOUT_S)
    finally:
        tarball.unlink(missing_ok=True)
        shutil.rmtree(rootfs, ignore_errors=True)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures the container tests recorded with ``record_property``."""
    figures = [
        (name, value, report.nodeid)
        for report in terminalreporter.getreports("passed")
        for name, value in report.user_properties
    ]
    if figures:
        terminalreporter.write_sep("-", "container figures")
        for name, value, nodeid in figures:
            terminalreporter.write_line(f"{name} = {value}  ({nodeid})")
