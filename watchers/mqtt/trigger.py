"""MQTT watcher: ``MqttTrigger`` reads one topic filter at QoS 1 in a persistent MQTT 5 session
and sends a message's PUBACK only after its event is committed; ``send`` publishes. The URIs
are parsed in ``watchers.mqtt.address``.

aiomqtt (over paho-mqtt 2) acknowledges a QoS 1 message as soon as it is received, which would
lose the messages held when the daemon dies. aiomqtt 2.5 has no option for it yet (its pull
request 346 is open), so the trigger switches on paho's own manual acknowledgements
(``manual_ack_set`` and ``ack(mid, qos)``) on the paho client aiomqtt wraps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from triggerer.backoff import Backoff
from triggerer.connections import get_connection
from triggerer.providers import Provider
from triggerer.triggers import TriggerEvent, WatchedAsset
from watchers import cloudevents
from watchers.clients import check_settings, require
from watchers.mqtt.address import MqttAddress, parse_mqtt_uri
from watchers.payloads import decode_body
from watchers.processing import ADDED_LATER, UNREADABLE, CountingTrigger, Processing, check_range

if TYPE_CHECKING:
    import aiomqtt
    import paho.mqtt.client as paho

log = structlog.get_logger(__name__)

#: The MQTT 5 user property whose value names a message for the dedup key; ``send`` sets it.
MESSAGE_ID_PROPERTY = "message-id"
#: The largest session expiry interval MQTT 5 has (0xFFFFFFFF: the session never expires).
MAX_SESSION_EXPIRY_S = 2**32 - 1
#: The largest Receive Maximum (unacknowledged QoS 1 messages the broker may send at once).
MAX_IN_FLIGHT = 65_535
BACKOFF_MAX_S = 30.0
_CONNECT_TIMEOUT_S = 10.0
#: Messages ``send`` publishes before it waits for their PUBACKs.
_SEND_WINDOW = 100
#: Settings a named connection may hold.
CONNECTION_KEYS = frozenset({"username", "password", "tls", "ca_certs", "certfile", "keyfile"})
#: CONNACK reason codes that no retry will change: the watcher's error instead.
_REFUSALS = frozenset(
    {
        2,  # MQTT 3: identifier rejected
        4,  # MQTT 3: bad user name or password
        5,  # MQTT 3: not authorised
        0x85,  # client identifier not valid
        0x86,  # bad user name or password
        0x87,  # not authorized
        0x8C,  # bad authentication method
    }
)
_CLIENT_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def watcher_client_id(asset: WatchedAsset, watcher_name: str, uri: str) -> str:
    """The default client id of a watcher reading ``uri``: ``triggerer-<watcher name>-<digest>``.

    The digest of the asset's name and URI, the watcher's name, and the broker and topic
    filter keeps watchers of the same name on different assets apart. Of the trigger's
    options only the broker and topic take part: editing the others keeps the session (and
    the messages the broker queued for it); a new topic is a new session, as the broker would
    keep the old topic's subscription in the old one.
    """
    address = parse_mqtt_uri(uri)
    source = f"{address.host}:{address.port}/{address.topic}"
    identity = json.dumps([asset.name, asset.uri, watcher_name, source]).encode()
    name = _CLIENT_ID_UNSAFE.sub("-", watcher_name)[:40]
    return f"triggerer-{name}-{hashlib.sha256(identity).hexdigest()[:12]}"


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class MqttTrigger(CountingTrigger):
    """Yield one event per message on the topic filter of ``uri`` (``mqtt://HOST[:1883]/TOPIC``).

    The trigger subscribes at QoS 1 in a persistent MQTT 5 session (clean start off, the
    session kept ``session_expiry_s`` by the broker while the trigger is away) under
    ``client_id``, by default derived from the watcher (:meth:`for_watcher`). A message's
    PUBACK is sent only once its event is committed, in the order the messages came; what is
    not acknowledged when the daemon dies or the connection drops, the broker sends again.
    At most ``max_in_flight`` messages are unacknowledged at once (the Receive Maximum).

    The payload is ``{"topic", "body", "qos", "retain", "user_properties", "content_type"}``.
    The dedup key is ``<topic>/<value>`` of the user property ``dedup_property`` (by default
    ``message-id``, which :func:`send` sets) when the publisher set one; without it a message
    delivered again makes a second event (at least once). ``filter`` is checked on the
    payload, then ``apply_function`` (dotted path) may replace it; a message either drops is
    acknowledged. A message whose processing raises ``max_deliveries`` times in a row becomes a
    dead letter (the broker keeps no delivery count to go by). ``connection`` names the
    ``[connections.NAME]`` with ``username``, ``password``, ``tls`` and TLS files.
    """

    uri: str
    client_id: str | None = None
    session_expiry_s: int = 86_400
    dedup_property: str | None = MESSAGE_ID_PROPERTY
    apply_function: str | None = None
    filter: dict[str, Any] | None = None
    partition_key_path: str | None = None
    max_deliveries: int = 5
    max_in_flight: int = 1_000
    keepalive_s: int = 60
    connection: str | None = None
    value_format: str = dataclasses.field(default="json", metadata=ADDED_LATER)
    schema_registry: str | None = dataclasses.field(default=None, metadata=ADDED_LATER)

    #: Its own counters: dead letters yielded, acknowledgements sent and connections made.
    dead_lettered: int = dataclasses.field(default=0, init=False)
    acked: int = dataclasses.field(default=0, init=False)
    connections: int = dataclasses.field(default=0, init=False)

    _address: MqttAddress = dataclasses.field(init=False)
    _processing: Processing = dataclasses.field(init=False)
    _client: aiomqtt.Client | None = dataclasses.field(default=None, init=False)

    def __post_init__(self) -> None:
        self._address = parse_mqtt_uri(self.uri)
        if self.client_id is not None and not (
            isinstance(self.client_id, str) and 0 < len(self.client_id.encode()) <= 65_535
        ):
            raise ValueError(
                f"MqttTrigger client_id={self.client_id!r} must be non-empty text; leave it out "
                "for one derived from the watcher"
            )
        check_range("session_expiry_s", self.session_expiry_s, 1, MAX_SESSION_EXPIRY_S)
        check_range("max_deliveries", self.max_deliveries, 1, 1_000)
        check_range("max_in_flight", self.max_in_flight, 1, MAX_IN_FLIGHT)
        check_range("keepalive_s", self.keepalive_s, 5, 65_535)
        if self.dedup_property is not None and not (
            isinstance(self.dedup_property, str) and self.dedup_property
        ):
            raise ValueError(
                f"MqttTrigger dedup_property={self.dedup_property!r} must be the name of a user "
                "property, or None for no dedup key"
            )
        self._processing = Processing.of_trigger(self)

    @property
    def session_client_id(self) -> str:
        """The client id the session is kept under: ``client_id``, else
        ``triggerer-<digest of the broker and topic>``."""
        if self.client_id is not None:
            return self.client_id
        address = self._address
        identity = f"{address.host}:{address.port}/{address.topic}".encode()
        return f"triggerer-{hashlib.sha256(identity).hexdigest()[:12]}"

    @property
    def reads_as(self) -> str | None:
        """The MQTT client id whose persistent session the broker keeps for this trigger."""
        return self.session_client_id

    def for_watcher(self, asset: WatchedAsset, watcher_name: str) -> MqttTrigger:
        """This trigger with a client id derived from the watcher, unless ``client_id`` is set."""
        if self.client_id is not None:
            return self
        client_id = watcher_client_id(asset, watcher_name, self.uri)
        return dataclasses.replace(self, client_id=client_id)

    def exclusive_sources(self) -> tuple[str, ...]:
        """The session: a second client of the same id would take it over (MQTT closes the
        first connection), and the two would take it from each other in turn."""
        address = self._address
        return (f"MQTT session {self.session_client_id!r} at {address.host}:{address.port}",)

    def same_message(self, stored: Any, received: Any) -> bool:
        """Equal payloads, but for ``retain``: a retained message sent on subscribing has it
        set, the same message delivered live does not."""
        return bool(_without_retain(stored) == _without_retain(received))

    async def run(self) -> AsyncGenerator[TriggerEvent, None]:
        await self.cleanup()  # a previous run's connection, when the daemon restarts this trigger
        client_lib = require("aiomqtt", "mqtt")
        self._processing.load()
        settings = _connection_settings(self.connection, self._address)
        backoff = Backoff(max_s=BACKOFF_MAX_S)
        while True:
            acks: _Acks | None = None
            lost: BaseException | None = None
            try:
                client = self._client = _client(
                    client_lib,
                    self._address,
                    settings,
                    client_id=self.session_client_id,
                    session_expiry_s=self.session_expiry_s,
                    max_in_flight=self.max_in_flight,
                    keepalive_s=self.keepalive_s,
                )
                await _connect(client, self._address, self.session_client_id)
                acks = _Acks(self, client._client)  # paho's client, for its manual acks
                await self._subscribe(client)
                self.connections += 1
                log.info(
                    "mqtt_connected",
                    host=self._address.host,
                    port=self._address.port,
                    topic=self._address.topic,
                    client_id=self.session_client_id,
                )
                self.polled()
                backoff.attempt = 0
                async for message in client.messages:
                    self.polled()
                    ack = acks.received(message)
                    if not message.topic.matches(self._address.topic):
                        self._stray(message)
                        await ack()
                        continue
                    event = await self._handle(message, ack)
                    if event is None:
                        await ack()
                    else:
                        yield event
            except client_lib.MqttError as error:
                lost = error
            finally:
                if acks is not None:
                    acks.close()  # the broker sends what is unacknowledged again on reconnect
                await self.cleanup()
            if lost is not None:  # closed first: the old client is not kept through the wait
                delay_s = backoff.next_s()
                log.warning(
                    "mqtt_disconnected",
                    host=self._address.host,
                    port=self._address.port,
                    client_id=self.session_client_id,
                    error=str(lost),
                    retry_in_s=round(delay_s, 2),
                )
                await asyncio.sleep(delay_s)

    async def cleanup(self) -> None:
        """Disconnect (the broker keeps the session); idempotent."""
        client, self._client = self._client, None
        if client is not None:
            with anyio.move_on_after(_CONNECT_TIMEOUT_S, shield=True):
                await _disconnect(client)

    async def _subscribe(self, client: aiomqtt.Client) -> None:
        from paho.mqtt.subscribeoptions import SubscribeOptions

        # Retained messages only for a new subscription, not on every reconnect.
        options = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
        granted = await client.subscribe(self._address.topic, options=options)
        code = granted[0]
        value = code if isinstance(code, int) else code.value
        if value >= 0x80:
            raise PermissionError(
                f"MQTT broker {self._address.host}:{self._address.port} refused the "
                f"subscription to {self._address.topic!r}: {code}"
            )
        if value == 0:
            raise ValueError(
                f"MQTT broker {self._address.host}:{self._address.port} granted QoS 0 for "
                f"{self._address.topic!r}: its messages would be lost on a crash; allow QoS 1"
            )

    # -- handling one message

    def _stray(self, message: aiomqtt.Message) -> None:
        """A message of another subscription of the session (a ``client_id`` that read
        another topic before): acknowledged and dropped."""
        self.filtered += 1
        log.warning(
            "mqtt_message_of_another_subscription",
            topic=message.topic.value,
            subscribed=self._address.topic,
            client_id=self.session_client_id,
        )

    async def _handle(self, message: aiomqtt.Message, ack: _Ack) -> TriggerEvent | None:
        """The event of ``message``; ``None`` when it is filtered out."""
        self.messages += 1
        payload, properties = message_payload(message)
        dedup_key = None
        if self.dedup_property is not None:
            value = properties.get(self.dedup_property)
            if value is not None:
                dedup_key = f"{payload['topic']}/{value}"
        try:
            payload, cloudevent = await self._processing.decoded(
                payload,
                message.payload,
                cloudevents.MQTT,
                properties.items(),
                payload["content_type"],
            )
        except UNREADABLE as error:
            return self._gave_up(payload, dedup_key, ack, str(error))
        failures = 0
        while True:
            try:
                prepared = self._processing.prepare(payload)
            # Processing runs user code (apply_function) that may raise anything: tried again,
            # then a dead letter, and the watcher carries on.
            except Exception as error:  # noqa: BLE001
                failures += 1
                if failures < self.max_deliveries:
                    continue
                reason = f"{type(error).__name__}: {error} (failed {failures} times)"
                return self._gave_up(payload, dedup_key, ack, reason)
            if prepared is None:
                self.filtered += 1
                return None
            self.events += 1
            result, partition_key = prepared
            # prepare() checked what an apply_function returned: the rest is decoded JSON.
            event = TriggerEvent.of_decoded_json(
                result, dedup_key=dedup_key, ack=ack, partition_key=partition_key
            )
            return cloudevents.with_cloudevent(event, cloudevent)

    def _gave_up(
        self, payload: dict[str, Any], dedup_key: str | None, ack: _Ack, reason: str
    ) -> TriggerEvent:
        """The dead letter of a message."""
        log.warning(
            "mqtt_message_dead_lettered", topic=payload["topic"], dedup_key=dedup_key, error=reason
        )
        self.dead_lettered += 1
        return TriggerEvent.of_decoded_json(
            payload, dedup_key=dedup_key, ack=ack, dead_letter=reason
        )


def message_payload(message: aiomqtt.Message) -> tuple[dict[str, Any], dict[str, str]]:
    """The event payload of a received message, and its user properties (the last value of a
    repeated name wins)."""
    properties = getattr(message.properties, "UserProperty", None) or []
    user_properties = {str(name): str(value) for name, value in properties}
    content_type = getattr(message.properties, "ContentType", None)
    payload = {
        "topic": message.topic.value,
        "body": decode_body(message.payload),
        "qos": message.qos,
        "retain": bool(message.retain),
        "user_properties": user_properties,
        "content_type": content_type,
    }
    return payload, user_properties


class _Acks:
    """The PUBACKs of one connection, sent in the order their messages came (MQTT 5 section
    4.6 asks it of a client) as each is done. Once the connection is closed they are not sent:
    packet ids belong to a connection, and the broker sends those messages again."""

    def __init__(self, trigger: MqttTrigger, client: paho.Client) -> None:
        self._trigger = trigger
        self._client = client
        self._waiting: deque[_Ack] = deque()
        self._open = True

    def received(self, message: aiomqtt.Message) -> _Ack:
        ack = _Ack(self, message.mid if message.qos > 0 else None)
        if ack.mid is not None:
            self._waiting.append(ack)
        return ack

    def done(self) -> None:
        waiting = self._waiting
        while waiting and waiting[0].done:
            ack = waiting.popleft()
            if self._open and ack.mid is not None:
                self._client.ack(ack.mid, 1)
                self._trigger.acked += 1

    def close(self) -> None:
        self._open = False
        self._waiting.clear()


class _Ack:
    """The ``ack`` of one event: its message is done; its PUBACK goes once those before it's
    have gone."""

    __slots__ = ("_acks", "done", "mid")

    def __init__(self, acks: _Acks, mid: int | None) -> None:
        self._acks = acks
        self.mid = mid
        self.done = False

    async def __call__(self) -> None:
        if not self.done:
            self.done = True
            self._acks.done()


def _without_retain(payload: Any) -> Any:
    if isinstance(payload, dict) and "retain" in payload:
        return {name: value for name, value in payload.items() if name != "retain"}
    return payload


# -- connecting


def _connection_settings(name: str | None, address: MqttAddress) -> dict[str, Any]:
    """The named connection's settings, checked; ``tls`` set by an ``mqtts://`` URI too."""
    settings = {} if name is None else get_connection(name)
    check_settings(name, settings, CONNECTION_KEYS, "MQTT")
    if address.tls:
        settings["tls"] = True
    return settings


def _client(
    client_lib: Any,
    address: MqttAddress,
    settings: dict[str, Any],
    *,
    client_id: str,
    session_expiry_s: int,
    max_in_flight: int,
    keepalive_s: int,
) -> aiomqtt.Client:
    """An MQTT 5 client of a persistent session whose QoS 1 messages wait for ``ack``."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]  # paho: no annotations
    properties.SessionExpiryInterval = session_expiry_s
    properties.ReceiveMaximum = max_in_flight
    client: aiomqtt.Client = client_lib.Client(
        address.host,
        address.port,
        identifier=client_id,
        protocol=client_lib.ProtocolVersion.V5,
        clean_start=False,
        properties=properties,
        keepalive=keepalive_s,
        timeout=_CONNECT_TIMEOUT_S,
        **_credentials(client_lib, settings),
    )
    # Set before connecting: a resumed session's messages arrive right after the CONNACK.
    client._client.manual_ack_set(True)  # aiomqtt 2.5 has no option for it
    return client


def _credentials(client_lib: Any, settings: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if settings.get("username") is not None:
        options["username"] = str(settings["username"])
        if settings.get("password") is not None:
            options["password"] = str(settings["password"])
    if settings.get("tls"):
        options["tls_params"] = client_lib.TLSParameters(
            ca_certs=settings.get("ca_certs"),
            certfile=settings.get("certfile"),
            keyfile=settings.get("keyfile"),
        )
    return options


async def _connect(client: aiomqtt.Client, address: MqttAddress, client_id: str) -> None:
    """Connect; a refusal no retry changes (credentials, authorisation) is a ``PermissionError``
    naming the broker and client id."""
    from aiomqtt.exceptions import MqttConnectError

    try:
        await client.__aenter__()
    except MqttConnectError as error:
        code = error.rc if isinstance(error.rc, int) or error.rc is None else error.rc.value
        if code in _REFUSALS:
            raise PermissionError(
                f"MQTT broker {address.host}:{address.port} refused client {client_id!r}: "
                f"{error}; check the connection's username and password"
            ) from None
        raise


async def _disconnect(client: aiomqtt.Client) -> None:
    """Send DISCONNECT (the session stays: its expiry interval was set at connect)."""
    from aiomqtt import MqttError

    try:
        await client.__aexit__(None, None, None)
    except (MqttError, OSError) as error:
        log.info("mqtt_disconnect_unclean", error=str(error))
    lost = client._disconnected  # the connection's end, which aiomqtt leaves unread
    if lost.done() and not lost.cancelled():
        lost.exception()


# -- posting: triggerer post mqtt URI MESSAGE...


async def send(uri: str, bodies: Sequence[str], connection: str | None = None) -> list[str]:
    """Publish each of ``bodies`` at QoS 1 to the topic of ``uri``, each with the user property
    ``message-id`` set to a new UUID (the trigger's dedup key); those ids, in order. Returns once
    the broker has acknowledged every message."""
    client_lib = require("aiomqtt", "mqtt")
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    address = parse_mqtt_uri(uri)
    if "+" in address.topic.split("/") or address.topic.endswith("#"):
        raise ValueError(f"MQTT URI {uri!r}: a message is sent to a topic, not a wildcard filter")
    settings = _connection_settings(connection, address)
    ids = [uuid.uuid4().hex for _ in bodies]
    async with client_lib.Client(
        address.host,
        address.port,
        protocol=client_lib.ProtocolVersion.V5,
        timeout=_CONNECT_TIMEOUT_S,
        **_credentials(client_lib, settings),
    ) as client:
        client.pending_calls_threshold = _SEND_WINDOW  # that many wait at once, by design

        async def publish(body: str, message_id: str) -> None:
            properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]  # paho: no annotations
            properties.UserProperty = (MESSAGE_ID_PROPERTY, message_id)
            await client.publish(address.topic, body.encode(), qos=1, properties=properties)

        # paho sends them in this order; a window of them waits for its PUBACKs at once
        # (aiomqtt's bookkeeping of waiting calls grows with their square).
        pairs = list(zip(bodies, ids, strict=True))
        for start in range(0, len(pairs), _SEND_WINDOW):
            window = pairs[start : start + _SEND_WINDOW]
            await asyncio.gather(*(publish(body, message_id) for body, message_id in window))
    return ids


def _trigger_of_uri(uri: str, **options: Any) -> MqttTrigger:
    return MqttTrigger(uri=uri, **options)


PROVIDER = Provider(name="mqtt", schemes=("mqtt", "mqtts"), trigger=_trigger_of_uri, send=send)

# A stored trigger keeps its key: serialize() writes the classpath a store holds from before the
# package, ``watchers.mqtt.MqttTrigger``. Set once the class is made, as the dataclass decorator
# reads the annotations in the module that defines the class.
MqttTrigger.__module__ = "watchers.mqtt"
