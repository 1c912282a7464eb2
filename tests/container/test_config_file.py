"""The image's daemon with a config file of its own mounted over the image's: read-only and
without capabilities, it takes the file's database, port and token, and its healthcheck
(``triggerer check``, run in the container) reads the same file."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.container.conftest import BUILD_TIMEOUT_S
from tests.container.podman import (
    CONFIG_FILE,
    STATE_DIR,
    Container,
    Podman,
    RecordProperty,
    shared_folder,
)

pytestmark = [pytest.mark.container, pytest.mark.timeout(BUILD_TIMEOUT_S + 300)]

TOKEN = "token-from-the-file"  # noqa: S105 - the token this test configures
PORT = 9090
DATABASE = f"{STATE_DIR}/from-file.db"
# "classic" Spark starts no JVM until a run: this test runs none.
CONFIG = f"""\
[database]
url = "sqlite:///{DATABASE}"

[api]
host = "0.0.0.0"
port = {PORT}
tokens = ["{TOKEN}"]

[spark]
mode = "classic"
logs_dir = "{STATE_DIR}/logs"
"""


@pytest.fixture(scope="module")
async def daemon(
    podman: Podman, triggerer_image: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Container]:
    config = tmp_path_factory.mktemp("config")
    (config / "triggerer.toml").write_text(CONFIG)
    shared_folder(config)
    container = Container(podman, triggerer_image, api_port=PORT)
    try:
        container.start(f"--volume={config / 'triggerer.toml'}:{CONFIG_FILE}:ro")
        await container.wait_healthz()
        yield container
    finally:
        container.remove()


async def test_a_mounted_config_file_sets_the_database_port_and_tokens(
    daemon: Container, record_property: RecordProperty
) -> None:
    record_property("seconds_to_healthz", round(await daemon.wait_healthz(), 1))
    await daemon.wait_ready(TOKEN)
    async with httpx.AsyncClient() as anonymous:
        assert (await anonymous.get(f"{daemon.url}/readyz")).status_code == 401
    checked = daemon.exec("triggerer", "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr + daemon.logs()
    assert checked.stdout.startswith("healthy")
    assert daemon.exec("test", "-f", DATABASE).returncode == 0, "[database] url ignored"
