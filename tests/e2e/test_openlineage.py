"""OpenLineage run events through ``triggerer run --config``: a chain of two pipelines started
by an event posted to the REST API sends START and COMPLETE for each run, with its inputs, its
outputs (through an alias too) and, for the second, the first as its parent; a failing run
sends FAIL. The file, HTTP and Kafka transports carry the same events; an HTTP backend that is away
holds up no run: the runs go on and the daemon logs each failed send. A file that cannot be
written stops the start with one line naming the setting."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from aiokafka import AIOKafkaConsumer

from tests.e2e.daemon import Deployment, runs, sqlite_url
from tests.fixtures.http_server import serving
from triggerer.service.runs.openlineage import run_uuid

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.daemon import DaemonProcess
    from tests.fixtures.brokers import MakeTopic
    from triggerer.service.store import models

PIPELINES = """
    from triggerer import Asset, AssetAlias, Metadata, pipeline

    raw = Asset("raw", "s3://lake/raw/orders")
    clean = Asset("clean", "postgres://db:5432/shop/public/orders")
    reports = AssetAlias("reports")
    broken = Asset("broken")

    @pipeline(schedule=raw, outlets=[clean, reports])
    def refine(spark, context):
        assert spark.range(3).count() == 3
        yield Metadata(clean, dict(rows=3))
        context.outlet_events[reports].add(Asset("report", "file:///out/report.csv"))

    @pipeline(schedule=clean)
    def publish(spark, context):
        assert spark.range(1).count() == 1

    @pipeline(schedule=broken, retries=0)
    def failing(spark, context):
        raise RuntimeError("the data is bad")
"""

SEND_RETRIES_S = 8.0
"""Less than a send to a closed port takes: requests' retries back off 0.3 s doubling, 9.3 s."""
RUNS_TIMEOUT_S = 300.0
"""How long a chain's runs may take: a run's first Spark job took 110 s on a loaded machine."""


@pytest.fixture
def deployment(tmp_path: Path, spark_remote: str) -> Deployment:
    """A deployment on a new SQLite file; events come from the REST API, not Kafka."""
    return Deployment(tmp_path, sqlite_url(tmp_path), spark_remote, "unused:9092", "unused")


class Receiver:
    """A local OpenLineage HTTP backend: what was posted to it, path, headers and body."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append(
                    {
                        "path": self.path,
                        "authorization": self.headers.get("Authorization"),
                        "event": json.loads(body),
                    }
                )
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:  # quiet in the test's output
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def events(self) -> list[dict[str, Any]]:
        return [request["event"] for request in self.received]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    with serving(receiver.server):
        yield receiver


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def start(
    deployment: Deployment, openlineage: dict[str, object]
) -> tuple[DaemonProcess, str]:
    """``triggerer run --config`` with ``openlineage`` and the REST API on a free port; the
    daemon and its API's URL."""
    deployment.write_pipelines(PIPELINES)
    config = deployment.config_file(
        api={"enabled": True, "port": 0}, openlineage={"enabled": True, **openlineage}
    )
    daemon = deployment.process_with_config(config)
    daemon.start()
    [listening] = await daemon.wait_logged("api_listening")
    await daemon.wait_logged("pipelines_loaded")
    return daemon, str(listening["url"])


async def post_event(api: str, uri: str) -> None:
    async with httpx.AsyncClient(base_url=api) as client:
        response = await client.post("/assets/events", json={"uri": uri})
        assert response.status_code == 201, response.text


def ended(*pipelines: str) -> Any:
    """``done`` of :meth:`Deployment.wait_for` over runs: one run of each pipeline has ended."""
    return lambda rows: (
        {r.pipeline_id for r in rows if r.state in ("success", "failed")} >= set(pipelines)
    )


def by_run(events: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Events by (job name, event type); each pair only once."""
    keyed = {(e["job"]["name"], e["eventType"]): e for e in events}
    assert len(keyed) == len(events), [(e["job"]["name"], e["eventType"]) for e in events]
    return keyed


def datasets(event: dict[str, Any], side: str) -> set[tuple[str, str]]:
    return {(d["namespace"], d["name"]) for d in event[side]}


def check_chain(events: list[dict[str, Any]], all_runs: list[models.Run]) -> None:
    """START and COMPLETE of ``refine`` then ``publish``, each naming its datasets, ids and
    parent."""
    run_ids = {run.pipeline_id: run.run_id for run in all_runs}
    keyed = by_run(events)
    for job in ("refine", "publish"):
        start, complete = keyed[job, "START"], keyed[job, "COMPLETE"]
        assert start["job"]["namespace"] == complete["job"]["namespace"] == "lineage-test"
        expected_id = run_uuid("lineage-test", run_ids[job])
        assert start["run"]["runId"] == complete["run"]["runId"] == expected_id
        assert start["eventTime"] <= complete["eventTime"]
        assert start["outputs"] == []
    assert datasets(keyed["refine", "START"], "inputs") == {("s3://lake", "raw/orders")}
    assert datasets(keyed["refine", "COMPLETE"], "outputs") == {
        ("postgres://db:5432", "shop.public.orders"),
        ("file", "/out/report.csv"),  # added through the alias
    }
    assert "parent" not in keyed["refine", "START"]["run"]["facets"]  # posted, not run-made
    publish = keyed["publish", "COMPLETE"]
    assert datasets(publish, "inputs") == {("postgres://db:5432", "shop.public.orders")}
    assert publish["outputs"] == []
    for event_type in ("START", "COMPLETE"):
        parent = keyed["publish", event_type]["run"]["facets"]["parent"]
        assert parent["run"]["runId"] == run_uuid("lineage-test", run_ids["refine"])
        assert parent["job"]["name"] == "refine"
        assert parent["job"]["namespace"] == "lineage-test"


@pytest.mark.timeout(420)
async def test_file_transport_has_start_and_end_of_every_run(
    tmp_path: Path, spark_remote: str, database_url: str
) -> None:
    # SQLite and PostgreSQL: the emitter reads each run's datasets from the store.
    deployment = Deployment(tmp_path, database_url, spark_remote, "unused:9092", "unused")
    path = tmp_path / "lineage" / "events.jsonl"
    daemon, api = await start(
        deployment, {"transport": "file", "path": str(path), "namespace": "lineage-test"}
    )
    with daemon:
        await post_event(api, "s3://lake/raw/orders")
        await post_event(api, "broken")
        all_runs = await deployment.wait_for(
            runs, ended("refine", "publish", "failing"), timeout_s=RUNS_TIMEOUT_S
        )
        # The runs' ends are recorded before their events are sent: wait for the six.
        with anyio.fail_after(60):
            while len(lines := _lines(path)) < 6:  # noqa: ASYNC110 - a file the daemon writes
                await anyio.sleep(0.1)

    events = [json.loads(line) for line in lines]
    assert len(events) == 6, events
    assert {run.pipeline_id: run.state for run in all_runs} == {
        "refine": "success",
        "publish": "success",
        "failing": "failed",
    }
    check_chain([e for e in events if e["job"]["name"] != "failing"], all_runs)
    keyed = by_run(events)
    failed = keyed["failing", "FAIL"]
    assert datasets(keyed["failing", "START"], "inputs") == {("lineage-test", "broken")}
    assert failed["outputs"] == []
    assert failed["run"]["facets"]["errorMessage"]["message"].startswith("exit code")
    assert failed["producer"].startswith("urn:triggerer")


async def test_a_file_that_cannot_be_written_stops_the_start(tmp_path: Path) -> None:
    # Nothing runs: no Spark server, no broker.
    deployment = Deployment(
        tmp_path, sqlite_url(tmp_path), "sc://127.0.0.1:1", "unused:9092", "unused"
    )
    deployment.write_pipelines(PIPELINES)
    config = deployment.config_file(
        openlineage={"enabled": True, "transport": "file", "path": "/proc/nope/events.jsonl"}
    )
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        code = await daemon.wait(60)
    output = (tmp_path / "daemon.log").read_text()
    assert code != 0, output
    [error] = output.splitlines()
    assert error.startswith("triggerer: [openlineage] path '/proc/nope/events.jsonl': "), error


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.timeout(420)
async def test_http_transport_posts_the_same_events(
    deployment: Deployment, receiver: Receiver
) -> None:
    daemon, api = await start(
        deployment,
        {"url": receiver.url, "api_key": "k-123", "namespace": "lineage-test", "timeout_s": 2},
    )
    with daemon:
        await post_event(api, "s3://lake/raw/orders")
        all_runs = await deployment.wait_for(
            runs, ended("refine", "publish"), timeout_s=RUNS_TIMEOUT_S
        )
        with anyio.fail_after(60):
            while len(receiver.received) < 4:  # noqa: ASYNC110 - a server thread appends
                await anyio.sleep(0.1)

    assert {request["path"] for request in receiver.received} == {"/api/v1/lineage"}
    assert {request["authorization"] for request in receiver.received} == {"Bearer k-123"}
    check_chain(receiver.events(), all_runs)


@pytest.mark.timeout(420)
async def test_an_unreachable_backend_holds_up_no_run(deployment: Deployment) -> None:
    daemon, api = await start(
        deployment,
        {"url": f"http://127.0.0.1:{closed_port()}", "namespace": "lineage-test", "timeout_s": 1},
    )
    with daemon:
        await post_event(api, "s3://lake/raw/orders")
        all_runs = await deployment.wait_for(
            runs, ended("refine", "publish"), timeout_s=RUNS_TIMEOUT_S
        )
        [first_failure] = await daemon.wait_logged("openlineage_send_failed")

    refine, publish = sorted(all_runs, key=lambda run: run.id)
    assert (refine.pipeline_id, refine.state) == ("refine", "success")
    assert (publish.pipeline_id, publish.state) == ("publish", "success")
    assert (first_failure["event_type"], first_failure["transport"]) == ("START", "http")
    # A send to the closed port fails only after the client's retries, about 9 s ...
    failed_at = datetime.fromisoformat(first_failure["timestamp"])
    send_s = (failed_at - refine.start_date).total_seconds()
    assert send_s >= SEND_RETRIES_S, first_failure
    # ... yet publish starts as soon as refine has ended: the launcher waited for no send (it
    # would have waited for refine's COMPLETE there).
    gap_s = (publish.start_date - refine.end_date).total_seconds()
    assert gap_s < SEND_RETRIES_S, gap_s


@pytest.mark.timeout(420)
async def test_kafka_transport_produces_the_same_events(
    deployment: Deployment, kafka_broker: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic()
    daemon, api = await start(
        deployment,
        {
            "transport": "kafka",
            "bootstrap_servers": kafka_broker,
            "topic": topic,
            "namespace": "lineage-test",
        },
    )
    with daemon:
        await post_event(api, "s3://lake/raw/orders")
        all_runs = await deployment.wait_for(
            runs, ended("refine", "publish"), timeout_s=RUNS_TIMEOUT_S
        )
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=kafka_broker, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            records: list[Any] = []
            with anyio.fail_after(60):
                while len(records) < 4:
                    batch = await consumer.getmany(timeout_ms=500)
                    records.extend(record for part in batch.values() for record in part)
        finally:
            await consumer.stop()

    # Keyed by the job, so a job's events keep their order in one partition.
    assert {record.key for record in records} >= {b"run:lineage-test/refine"}
    check_chain([json.loads(record.value) for record in records], all_runs)


SLOW = """
    import time

    from triggerer import Asset, pipeline

    stalled = Asset("stalled")

    @pipeline(schedule=stalled)
    def stuck(spark, context):
        time.sleep(300)
"""


@pytest.mark.timeout(420)
async def test_a_run_cancelled_while_it_runs_sends_abort(
    deployment: Deployment, tmp_path: Path
) -> None:
    path = tmp_path / "lineage" / "events.jsonl"
    deployment.write_pipelines(SLOW, "slow.py")
    daemon, api = await start(
        deployment, {"transport": "file", "path": str(path), "namespace": "lineage-test"}
    )
    with daemon:
        await post_event(api, "stalled")
        with anyio.fail_after(120):
            while not _lines(path):  # noqa: ASYNC110 - a file the daemon writes: the START
                await anyio.sleep(0.1)
        [run] = await deployment.query(runs)
        async with httpx.AsyncClient(base_url=api) as client:
            response = await client.post(f"/runs/{run.run_id}/cancel")
            assert response.status_code == 200, response.text
        await deployment.wait_for(
            runs, lambda rows: rows[0].state == "cancelled", timeout_s=RUNS_TIMEOUT_S
        )
        with anyio.fail_after(60):
            while len(lines := _lines(path)) < 2:  # noqa: ASYNC110 - a file the daemon writes
                await anyio.sleep(0.1)

    start_event, abort = (json.loads(line) for line in lines)
    assert (start_event["eventType"], abort["eventType"]) == ("START", "ABORT")
    assert abort["run"]["runId"] == start_event["run"]["runId"]
    assert abort["run"]["runId"] == run_uuid("lineage-test", run.run_id)
    assert datasets(abort, "inputs") == {("lineage-test", "stalled")}
    assert abort["outputs"] == []
