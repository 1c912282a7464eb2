"""The API over real TCP: the server the daemon runs, ``events emit --api`` against it, and a
store that does not answer."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import httpx
import pytest
import structlog

from tests.integration.api.conftest import TOKEN, Calls, make_context
from triggerer.service.api import create_app
from triggerer.service.api.server import ApiServer
from triggerer.service.cli import main
from triggerer.service.config import ApiSettings, ConfigError, current_settings
from triggerer.service.store import create_engine, session_factory

if TYPE_CHECKING:
    from tests.integration.api.conftest import Api


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """main() configures logging onto pytest's captured stderr: undo it for later tests."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


@asynccontextmanager
async def serving(api: Api) -> AsyncIterator[str]:
    """``api``'s app served on a free loopback port; its base URL."""
    server = ApiServer(ApiSettings(port=0, tokens=(TOKEN,)), api.app)
    with structlog.testing.capture_logs() as logged:
        async with anyio.create_task_group() as group:
            server.listen()
            group.start_soon(server.run)
            [listening] = [e for e in logged if e["event"] == "api_listening"]
            yield f"http://127.0.0.1:{listening['port']}"
            server.stop()


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_the_server_listens_on_a_free_port_and_stops(api: Api) -> None:
    async with serving(api) as served, httpx.AsyncClient() as client:
        assert (await client.get(f"{served}/api/v1/healthz")).json()["status"] == "ok"
        assert (await client.get(f"{served}/api/v1/pipelines")).status_code == 401


async def emit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    current_settings.cache_clear()
    code = await anyio.to_thread.run_sync(main, ["events", "emit", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_emit_over_the_api_posts_to_the_daemon_and_errors_in_one_line(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serving(api) as served:
        await _emit_over_the_api(api, capsys, served)


async def _emit_over_the_api(api: Api, capsys: pytest.CaptureFixture[str], served: str) -> None:
    code, out, err = await emit(
        capsys, "orders", "--extra", '{"n": 1}', "--api", served, "--token", TOKEN
    )
    assert (code, err) == (0, "")
    assert out.endswith("on orders; queued for count_orders, matched\n")
    [recorded] = api.calls.recorded
    assert len(recorded.events) == 1

    for argv, message in (
        (("orders", "--api", served, "--token", "wrong"), "refused the event (401): missing"),
        (("s3://nope/x", "--api", f"{served}/api/v1/", "--token", TOKEN), "(404): no asset"),
        (("orders", "--api", "http://127.0.0.1:1", "--token", TOKEN), "cannot reach the API"),
    ):
        code, out, err = await emit(capsys, *argv)
        assert (code, out) == (1, ""), argv
        assert message in err
        assert len(err.splitlines()) == 1


def test_a_busy_port_is_a_config_error_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = ApiServer(ApiSettings(port=port), create_app(None))  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            server.listen()


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_a_store_that_does_not_answer_is_503(api: Api) -> None:
    engine = create_engine("postgresql://triggerer:pw@127.0.0.1:1/x")
    try:
        context = make_context(api.context.settings, session_factory(engine), api.registry, Calls())
        transport = httpx.ASGITransport(app=create_app(context))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            response = await client.get(
                "/api/v1/pipelines", headers={"Authorization": f"Bearer {TOKEN}"}
            )
    finally:
        await engine.dispose()
    assert response.status_code == 503
    assert response.json()["detail"].startswith("the store does not answer")
    assert "pw" not in response.text


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_events_posted_while_the_store_does_not_answer_are_each_503(api: Api) -> None:
    engine = create_engine("postgresql://triggerer:pw@127.0.0.1:1/x")
    calls = Calls()
    answers: list[httpx.Response] = []
    try:
        context = make_context(api.context.settings, session_factory(engine), api.registry, calls)
        transport = httpx.ASGITransport(app=create_app(context))
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:

            async def post(n: int) -> None:
                body = {"uri": "orders", "extra": {"n": n}}
                answers.append(
                    await client.post("/api/v1/assets/events", json=body, headers=headers)
                )

            async with anyio.create_task_group() as clients:
                for n in range(5):
                    clients.start_soon(post, n)
    finally:
        await engine.dispose()
    assert [answer.status_code for answer in answers] == [503] * 5
    assert all("the store does not answer" in answer.json()["detail"] for answer in answers)
    assert calls.recorded == []  # nothing committed, so nothing told to the scheduler
