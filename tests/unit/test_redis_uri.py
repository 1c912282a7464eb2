"""The Redis URIs (``redis+stream://``, ``redis+pubsub://``) and the triggers' options, without
a server."""

from __future__ import annotations

import pytest

from watchers import MessageQueueTrigger, RedisPubSubTrigger, RedisStreamTrigger
from watchers.redis.address import RedisAddress
from watchers.redis.pubsub import AT_MOST_ONCE, parse_channel_uri
from watchers.redis.streams import PROVIDER, parse_stream_uri


@pytest.mark.parametrize(
    ("uri", "address"),
    [
        ("redis+stream://cache/0/orders", RedisAddress("cache", 6379, 0, "orders")),
        ("redis+stream://10.0.0.5:6380/3/orders", RedisAddress("10.0.0.5", 6380, 3, "orders")),
        ("redis+stream://[::1]:7000/1/a:b", RedisAddress("::1", 7000, 1, "a:b")),
        ("redis+stream://h/0/a/b", RedisAddress("h", 6379, 0, "a/b")),
        ("redis+stream://h/0/a%2Fb%20c", RedisAddress("h", 6379, 0, "a/b c")),
        ("REDIS+STREAM://h/0/x", RedisAddress("h", 6379, 0, "x")),
    ],
)
def test_stream_uris(uri: str, address: RedisAddress) -> None:
    assert parse_stream_uri(uri) == address


def test_channel_uri() -> None:
    assert parse_channel_uri("redis+pubsub://h:1/2/news") == RedisAddress("h", 1, 2, "news")


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("redis+stream://h/0", "must have the form redis\\+stream://HOST\\[:6379\\]/DB/STREAM"),
        ("redis+stream://h", "must have the form"),
        ("redis+stream:///0/orders", "must have the form"),
        ("redis+stream://h//orders", "must have the form"),
        ("redis+stream://h/zero/orders", "database 'zero' must be a number"),
        ("redis+stream://h:port/0/orders", "the port must be a number"),
        ("redis+stream://user:pw@h/0/orders", "give connection='NAME'"),
        ("redis+stream://:pw@h/0/orders", "holds credentials"),
        ("redis+stream://h/0/orders?count=5", "must not have a query"),
        ("redis+stream://h/0/orders#x", "must not have a query or fragment"),
    ],
)
def test_bad_stream_uris_name_the_value(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        PROVIDER.trigger(uri)
    shown = uri.replace("user:pw@", "***@").replace(":pw@", "***@")  # credentials hidden
    assert repr(shown) in str(caught.value)
    unusable = MessageQueueTrigger(uri)  # what the daemon shows as the watcher's error
    assert repr(shown) in unusable.serialize()[1]["error"]


def test_bad_channel_uri_names_its_form() -> None:
    with pytest.raises(ValueError, match=r"redis\+pubsub://HOST\[:6379\]/DB/CHANNEL"):
        parse_channel_uri("redis+pubsub://h/0")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"start_id": "latest"}, "start_id='latest' must be '\\$'"),
        ({"start_id": "12-x"}, "start_id='12-x'"),
        ({"group": ""}, "group='' must be a non-empty name"),
        ({"max_deliveries": 0}, "max_deliveries=0 must be an integer >= 1"),
        ({"min_idle_ms": True}, "min_idle_ms=True"),
        ({"batch_size": "10"}, "batch_size='10'"),
        ({"filter": {"path": "value"}}, "filter="),
        ({"partition_key_path": "region"}, "JSON path 'region' must start with"),
        ({"apply_function": "nodots"}, "apply_function='nodots' must be a dotted path"),
        ({"body_field": ""}, "body_field='' must be a name"),
    ],
)
def test_bad_stream_options_name_the_value(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PROVIDER.trigger("redis+stream://h/0/orders", **options)


@pytest.mark.parametrize("start_id", ["$", "0", "1700000000000", "1700000000000-3"])
def test_start_ids(start_id: str) -> None:
    made = MessageQueueTrigger("redis+stream://h/0/orders", start_id=start_id)
    assert isinstance(made, RedisStreamTrigger)
    assert made.start_id == start_id


def test_unknown_option_is_an_error() -> None:
    with pytest.raises(TypeError, match="count"):
        PROVIDER.trigger("redis+stream://h/0/orders", count=5)


def test_the_pubsub_trigger_says_at_most_once() -> None:
    made = MessageQueueTrigger("redis+pubsub://h/0/news")
    assert isinstance(made, RedisPubSubTrigger)
    assert made.reads_as == AT_MOST_ONCE
    assert not made.shareable
    assert made.exclusive_sources() == ()

    class Asset:
        name = "news"
        uri = "news://x"

    assert made.for_watcher(Asset(), "news_channel").watcher == "news_channel"
