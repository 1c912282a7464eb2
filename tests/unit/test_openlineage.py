"""OpenLineage's view of a run: dataset names from asset URIs (every scheme), run ids, the run
events' content, and the ``[openlineage]`` settings."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from openlineage.client.serde import Serde
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from triggerer.service.config import CONFIG_ENV, ConfigError, OpenLineageSettings, load_settings
from triggerer.service.runs.lineage_emitter import LineageEmitter, make_transport
from triggerer.service.runs.openlineage import (
    DatasetId,
    EventType,
    ParentRun,
    RunLineage,
    dataset_id,
    run_event,
    run_uuid,
)
from triggerer.uri import normalize_uri

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("uri", "namespace", "name"),
    [
        # S3 and GCS: the bucket is the data source, the object key (no leading /) the name.
        ("s3://lake/orders/2026/01", "s3://lake", "orders/2026/01"),
        ("s3://lake/", "s3://lake", "/"),
        ("gs://lake/orders", "gs://lake", "orders"),
        ("gs://lake/", "gs://lake", "/"),
        ("s3://lake/a?versionId=3", "s3://lake", "a"),
        # PostgreSQL: host and port; database.schema.table; the user is no part of it.
        (
            "postgres://db.example:5432/shop/public/orders",
            "postgres://db.example:5432",
            "shop.public.orders",
        ),
        ("postgres://etl@db:6543/shop/sales/orders", "postgres://db:6543", "shop.sales.orders"),
        ("postgres://[::1]:5432/d/s/t", "postgres://[::1]:5432", "d.s.t"),
        # Local files: the namespace "file", the absolute path as the name.
        ("file:///data/in/orders.csv", "file", "/data/in/orders.csv"),
        ("file:///", "file", "/"),
        # Kafka: the first bootstrap server (port 9092 unless given); the topic.
        ("kafka://broker:9092/orders", "kafka://broker:9092", "orders"),
        ("kafka://b1:9093,b2:9093/orders", "kafka://b1:9093", "orders"),
        ("kafka://broker/orders", "kafka://broker:9092", "orders"),
        ("kafka://[::1]:19092/orders", "kafka://[::1]:19092", "orders"),
        ("kafka://[::1]/orders", "kafka://[::1]:9092", "orders"),
        ("kafka://user@broker:9092/orders", "kafka://broker:9092", "orders"),
        ("kafka://broker:9092/a,b", "kafka://broker:9092", "a,b"),
        ("kafka://broker:9092", "kafka://broker:9092", "/"),
        # Any other scheme: scheme://authority, and the path (with its query) as the name.
        ("https://api.example/v1/orders", "https://api.example", "/v1/orders"),
        ("http://api.example:8080/", "http://api.example:8080", "/"),
        ("http://api.example/x?a=1&b=2", "http://api.example", "/x?a=1&b=2"),
        ("sqs://orders?region=eu-west-1", "sqs://orders", "/?region=eu-west-1"),
        ("hdfs://namenode:8020/warehouse/t", "hdfs://namenode:8020", "/warehouse/t"),
        ("x-team://catalog/orders", "x-team://catalog", "/orders"),
        ("bigquery:project.dataset.table", "bigquery", "project.dataset.table"),
        ("urn:li:dataset", "urn", "li:dataset"),
        ("x-mine:", "x-mine", "/"),
        # No scheme: an identifier of this triggerer, in the job namespace.
        ("orders", "jobs", "orders"),
        ("//example/asset", "jobs", "//example/asset"),
        ("1orders:x", "jobs", "1orders:x"),
        # Not a URL (an unclosed IPv6 host), as an x- URI may be: the URI as given.
        ("x-db://[bad/t", "jobs", "x-db://[bad/t"),
    ],
)
def test_dataset_of_each_scheme(uri: str, namespace: str, name: str) -> None:
    assert dataset_id(uri, "jobs") == DatasetId(namespace, name)


@pytest.mark.parametrize(
    ("written", "namespace", "name"),
    [
        ("S3://lake/orders/", "s3://lake", "orders"),
        ("postgresql://etl@db/shop/public/orders", "postgres://db:5432", "shop.public.orders"),
        ("file://localhost/data/in/", "file", "/data/in"),
        ("file:/data/in", "file", "/data/in"),
        ("HTTPS://api.example:443/v1#frag", "https://api.example", "/v1"),
        ("Kafka://broker:9092/orders", "kafka://broker:9092", "orders"),
    ],
)
def test_every_spelling_of_a_uri_is_one_dataset(written: str, namespace: str, name: str) -> None:
    assert dataset_id(normalize_uri(written), "jobs") == DatasetId(namespace, name)


def test_a_run_id_is_a_stable_uuid_per_namespace_and_run() -> None:
    first = run_uuid("triggerer", "orders__asset__1")
    assert uuid.UUID(first).version == 5
    assert run_uuid("triggerer", "orders__asset__2") != first
    assert run_uuid("staging", "orders__asset__1") != first
    # Pinned: a changed derivation would split new runs from the parents already sent.
    assert first == "6956554e-53a0-55d3-9864-be32d9f95c87"


LINEAGE = RunLineage(
    run_id="report__asset__7",
    pipeline_id="report",
    inputs=("s3://lake/orders", "orders", "s3://lake/orders"),
    outputs=("postgres://db:5432/shop/public/report", "file:///out/report.csv"),
    parent=ParentRun("orders__asset__3", "load_orders"),
)


def _json(lineage: RunLineage, state: EventType, error: str | None = None) -> Any:
    """The event as its transport sends it."""
    return json.loads(Serde.to_json(run_event(lineage, state, AT, "triggerer", error=error)))


def test_start_names_the_job_the_run_its_inputs_and_its_parent() -> None:
    event = _json(LINEAGE, "START")
    assert event["eventType"] == "START"
    assert event["eventTime"] == AT.isoformat()
    assert event["producer"].startswith("urn:triggerer")
    assert event["job"]["namespace"] == "triggerer"
    assert event["job"]["name"] == "report"
    run = event["run"]
    assert run["runId"] == run_uuid("triggerer", "report__asset__7")
    assert run["facets"]["parent"]["run"]["runId"] == run_uuid("triggerer", "orders__asset__3")
    assert run["facets"]["parent"]["job"] == {
        "namespace": "triggerer",
        "name": "load_orders",
        "facets": {},
    }
    # Each dataset once, in order; no outputs before the run has emitted any.
    assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [
        ("s3://lake", "orders"),
        ("triggerer", "orders"),
    ]
    assert event["outputs"] == []


def test_complete_names_the_outputs_and_fail_the_error() -> None:
    complete = _json(LINEAGE, "COMPLETE")
    assert [(d["namespace"], d["name"]) for d in complete["outputs"]] == [
        ("postgres://db:5432", "shop.public.report"),
        ("file", "/out/report.csv"),
    ]
    assert "errorMessage" not in complete["run"]["facets"]
    failed = _json(LINEAGE, "FAIL", error="exit code 1, see try-1.log")
    assert failed["outputs"] == []
    assert failed["run"]["facets"]["errorMessage"]["message"] == "exit code 1, see try-1.log"
    assert _json(LINEAGE, "ABORT")["eventType"] == "ABORT"


def test_a_run_without_a_parent_has_no_parent_facet() -> None:
    orphan = RunLineage("a__manual__1", "a")
    event = _json(orphan, "START")
    assert "parent" not in event["run"]["facets"]
    assert event["inputs"] == []


def test_an_x_uri_that_is_no_url_still_makes_an_event() -> None:
    uri = normalize_uri("x-db://[bad/t")  # x- URIs are stored as given
    lineage = RunLineage("load__asset__1", "load", inputs=(uri,), outputs=(uri,))
    complete = _json(lineage, "COMPLETE")
    for side in ("inputs", "outputs"):
        assert [(d["namespace"], d["name"]) for d in complete[side]] == [
            ("triggerer", "x-db://[bad/t")
        ]


def test_openlineage_is_off_unless_enabled_and_needs_its_transports_keys() -> None:
    assert OpenLineageSettings().enabled is False
    assert OpenLineageSettings(transport="file").path is None  # not enabled: nothing needed
    http = OpenLineageSettings(enabled=True, url="http://marquez:5000")
    assert (http.transport, http.endpoint, http.namespace) == (
        "http",
        "api/v1/lineage",
        "triggerer",
    )
    OpenLineageSettings(enabled=True, transport="console")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("enabled = true", "openlineage.url = None: transport 'http' needs the backend's URL"),
        ('enabled = true\nurl = "ftp://x"', "must be an http(s) URL with a host"),
        ('enabled = true\ntransport = "file"', "transport 'file' needs the file"),
        ('enabled = true\ntransport = "kafka"', "transport 'kafka' needs the brokers"),
        ('transport = "carrier-pigeon"', "openlineage.transport = 'carrier-pigeon'"),
        ('namespace = ""', "openlineage.namespace"),
        ("timeout_s = 0", "openlineage.timeout_s = 0"),
    ],
)
def test_a_bad_openlineage_setting_names_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toml: str, message: str
) -> None:
    monkeypatch.setenv(CONFIG_ENV, "")  # undoes what load_settings(path) sets
    config = tmp_path / "triggerer.toml"
    config.write_text(f"[openlineage]\n{toml}\n")
    with pytest.raises(ConfigError, match="invalid configuration") as raised:
        load_settings(config)
    assert message in str(raised.value)


def test_the_api_key_is_never_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV, "")
    config = tmp_path / "triggerer.toml"
    config.write_text('[openlineage]\napi_key = ["s3cr3t-key"]\n')
    with pytest.raises(ConfigError, match=r"openlineage\.api_key") as raised:
        load_settings(config)
    assert "s3cr3t" not in str(raised.value)


def _dropped() -> float:
    sample = REGISTRY.get_sample_value("triggerer_openlineage_events_total", {"outcome": "dropped"})
    return sample or 0.0


def test_the_emitter_queues_a_start_and_an_end_per_run_and_drops_past_its_bound() -> None:
    settings = OpenLineageSettings(enabled=True, transport="console", max_pending_events=3)
    emitter = LineageEmitter(settings, sessions=None)  # type: ignore[arg-type]  # never read here
    dropped = _dropped()
    emitter.run_started(1, try_number=1)
    emitter.run_started(1, try_number=2)  # a retry: the OpenLineage run has started already
    emitter.run_ended(1, "up_for_retry")  # the run goes on
    emitter.run_ended(1, "queued")  # interrupted by shutdown: it runs again
    emitter.run_ended(1, "success")
    assert [(c.run_pk, c.event_type) for c in emitter._queued] == [(1, "START"), (1, "COMPLETE")]
    with capture_logs() as logs:
        emitter.run_started(2, try_number=1)
        emitter.run_ended(2, "failed")  # past max_pending_events
        emitter.run_ended(3, "cancelled")
    assert [c.event_type for c in emitter._queued] == ["START", "COMPLETE", "START"]
    assert _dropped() == dropped + 2
    assert [(log["event"], log["events"]) for log in logs] == [("openlineage_events_dropped", 1)]


def test_a_disabled_emitter_queues_nothing() -> None:
    emitter = LineageEmitter(OpenLineageSettings(), sessions=None)  # type: ignore[arg-type]
    emitter.run_started(1, try_number=1)
    emitter.run_ended(1, "failed")
    assert not emitter._queued


def test_a_kafka_setting_the_producer_refuses_names_the_key_not_the_password() -> None:
    settings = OpenLineageSettings(
        enabled=True,
        transport="kafka",
        bootstrap_servers="broker:9092",
        kafka_config={"acks": "maybe", "sasl.password": "s3cr3t"},
    )
    with pytest.raises(ConfigError, match=r"\[openlineage\] kafka_config") as raised:
        make_transport(settings)  # no connection: librdkafka checks its settings first
    message = str(raised.value)
    assert "'acks': 'maybe'" in message
    assert "configuration property" in message  # librdkafka's reason
    assert "s3cr3t" not in message
