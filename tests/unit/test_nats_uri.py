"""nats:// URIs and NatsTrigger's options: parsing and the errors that name the value."""

from __future__ import annotations

import dataclasses
import re

import pytest

from triggerer.triggers import UnusableTrigger, load_trigger
from watchers import MessageQueueTrigger, NatsTrigger
from watchers.nats.client import NatsAddress, connect_options, parse_created_ns, parse_nats_uri
from watchers.nats.trigger import _DEPLOYMENT, PROVIDER, dedup_key, message_payload, watcher_durable


@dataclasses.dataclass(frozen=True)
class Asset:
    name: str
    uri: str


@pytest.mark.parametrize(
    ("uri", "address"),
    [
        ("nats://broker/ORDERS/orders.new", NatsAddress("broker:4222", "ORDERS", "orders.new")),
        ("nats://h:5000/S/a.*.c", NatsAddress("h:5000", "S", "a.*.c")),
        ("nats://a,b:1/S/a.%3E", NatsAddress("a:4222,b:1", "S", "a.>")),
        ("NATS://h/S/>", NatsAddress("h:4222", "S", ">")),
        ("nats://h/my%20stream%2Fx/a", None),
    ],
)
def test_uris_name_servers_stream_and_subject(uri: str, address: NatsAddress | None) -> None:
    if address is None:
        with pytest.raises(ValueError, match="stream 'my stream/x'"):
            parse_nats_uri(uri)
    else:
        assert parse_nats_uri(uri) == address


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("nats://user:secret@h/S/a", "connection="),
        ("nats://h/S/a#", "%23"),
        ("nats://h/S/a?x=1", "must not have a query"),
        ("nats://h/S", "nats://HOST[:4222]"),
        ("nats://h/S/", "nats://HOST[:4222]"),
        ("nats:///S/a", "server ''"),
        ("nats://h:99999/S/a", "server 'h:99999'"),
        ("nats://h:x/S/a", "server 'h:x'"),
        ("nats://h/S.x/a", "stream 'S.x'"),
        ("nats://h/S/a..b", "subject 'a..b'"),
        ("nats://h/S/a.>.b", "subject 'a.>.b'"),
        ("nats://h/S/a*", "subject 'a*'"),
        ("nats://h/S/a%20b", "subject 'a b'"),
    ],
)
def test_a_bad_uri_names_the_value(uri: str, says: str) -> None:
    with pytest.raises(ValueError, match="NATS URI") as raised:
        parse_nats_uri(uri)
    assert says in str(raised.value)
    assert re.sub(r"//[^/]*@", "//***@", uri) in str(raised.value)  # credentials masked
    assert "secret" not in str(raised.value)


def test_message_queue_trigger_picks_nats_and_round_trips() -> None:
    trigger = MessageQueueTrigger("nats://h/S/a.>", max_deliveries=3, ack_wait_s=10)
    assert isinstance(trigger, NatsTrigger)
    assert (trigger.servers, trigger.stream, trigger.subject) == ("h:4222", "S", "a.>")
    rebuilt = load_trigger(*trigger.serialize())
    assert rebuilt.serialize() == trigger.serialize()
    assert trigger.reads_as == trigger.durable_name
    assert trigger.reads_as.startswith("triggerer-S-")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"max_deliveries": 0}, "max_deliveries=0"),
        ({"ack_wait_s": 0.5}, "ack_wait_s=0.5"),
        ({"fetch_batch": True}, "fetch_batch=True"),
        ({"max_in_flight": "9"}, "max_in_flight='9'"),
        ({"deliver_policy": "last"}, "deliver_policy='last'"),
        ({"durable": "a.b"}, "durable='a.b'"),
        ({"filter": {"path": "body"}}, "filter="),
        ({"partition_key_path": "body"}, "'body'"),
        ({"apply_function": "nodots"}, "apply_function='nodots'"),
    ],
)
def test_a_bad_option_names_the_value(options: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        PROVIDER.trigger("nats://h/S/a", **options)
    unusable = MessageQueueTrigger("nats://h/S/a", **options)
    assert isinstance(unusable, UnusableTrigger)
    assert says in unusable.error


def test_an_unknown_option_is_refused() -> None:
    with pytest.raises(TypeError, match="nope"):
        PROVIDER.trigger("nats://h/S/a", nope=1)


def test_the_watchers_durable_is_derived_from_the_watcher_and_the_deployment() -> None:
    trigger = NatsTrigger(servers="h", stream="S", subject="a")
    asset = Asset("orders", "s3://b/orders")
    alone = trigger.for_watcher(asset, "new orders")
    token = _DEPLOYMENT.set("d1")
    try:
        first = trigger.for_watcher(asset, "new orders")
    finally:
        _DEPLOYMENT.reset(token)
    assert first.durable == watcher_durable(asset, "new orders", "d1")
    assert first.durable != alone.durable
    assert first.durable is not None
    assert first.durable.startswith("triggerer-new_orders-")
    assert first.reads_as == first.durable
    assert watcher_durable(asset, "w", "d1") != watcher_durable(Asset("x", "s3://b/x"), "w", "d1")
    mine = dataclasses.replace(trigger, durable="mine")
    assert mine.for_watcher(asset, "w") is mine
    assert first.exclusive_sources() == (
        f"NATS durable consumer {first.durable!r} of stream 'S' at h:4222",
    )


def test_payload_and_dedup_key() -> None:
    payload = message_payload("S", "a.b", 7, None, b'{"x": 1}', {"k": "v"})
    assert payload == {
        "body": {"x": 1},
        "subject": "a.b",
        "stream": "S",
        "sequence": 7,
        "published_at": None,
        "headers": {"k": "v"},
    }
    assert message_payload("S", "a", 1, None, b"\xff", None)["body"] == {"base64": "/w=="}
    assert dedup_key("S", 7, 1735732800123456789) == "S/7@1735732800123456789"


def test_stream_created_times_keep_their_nanoseconds() -> None:
    assert parse_created_ns("2025-01-01T12:00:00.123456789Z") == 1735732800123456789
    assert parse_created_ns("2025-01-01T12:00:00.1234567Z") == 1735732800123456700
    assert parse_created_ns("2025-01-01T12:00:00Z") == 1735732800000000000
    assert parse_created_ns("2025-01-01T13:00:00.5+01:00") == 1735732800500000000
    with pytest.raises(ValueError, match="'yesterday' is not an RFC 3339 time"):
        parse_created_ns("yesterday")


def test_connection_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from triggerer import connections

    sections = {"n": {"user": "u", "password": "p", "creds_file": "/c"}, "bad": {"pass": "x"}}
    monkeypatch.setattr(connections, "_source", lambda: sections)
    assert connect_options("n") == {"user": "u", "password": "p", "user_credentials": "/c"}
    with pytest.raises(ValueError, match=r"'bad' has settings .* pass"):
        connect_options("bad")
    assert connect_options(None) == {}
