"""NATS addressing and connections: ``nats://`` URIs, a named connection's settings, a stream's
creation time, and the producer (``triggerer post nats``).

nats-py is an optional extra (``triggerer[nats]``): it is imported through
:func:`watchers.clients.require` inside the functions that use it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import ssl
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from triggerer.connections import get_connection
from watchers.clients import check_settings, require
from watchers.uris import masked_uri, split_uri

if TYPE_CHECKING:
    from nats.aio.client import Client

DEFAULT_PORT = 4222
URI_FORM = "nats://HOST[:4222][,HOST[:PORT]]/STREAM/SUBJECT"
CONNECT_TIMEOUT_S = 5.0

#: Settings a named connection may hold.
CONNECTION_KEYS = frozenset(
    {
        "user",
        "password",
        "token",
        "creds_file",
        "nkeys_seed",
        "tls_ca_file",
        "tls_cert_file",
        "tls_key_file",
        "tls_hostname",
        "name",
    }
)
_TLS_FILES = ("tls_ca_file", "tls_cert_file", "tls_key_file")
_STREAM_BAD = frozenset(" \t\r\n.*>/\\")
# RFC 3339 as the server writes times (Go's RFC3339Nano): up to nine fraction digits.
_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclasses.dataclass(frozen=True)
class NatsAddress:
    """What a ``nats://`` URI names: the servers, the stream and the subject read from it."""

    servers: str
    """``host:port[,host:port]``."""
    stream: str
    subject: str

    def server_urls(self) -> list[str]:
        return [f"nats://{server}" for server in self.servers.split(",")]


def parse_nats_uri(uri: str) -> NatsAddress:
    """The servers, stream and subject of ``nats://HOST[:PORT]/STREAM/SUBJECT``; a ``ValueError``
    naming ``uri`` and the expected form otherwise. Stream and subject are percent-decoded."""
    if "#" in uri:
        raise ValueError(
            f"NATS URI {masked_uri(uri)!r} has a '#': write it as %23 (the form is {URI_FORM})"
        )
    parts, _ = split_uri(uri, kind="NATS", form=URI_FORM, schemes=("nats",))
    servers = check_servers(parts.netloc, f"NATS URI {uri!r}")
    stream_part, slash, subject_part = parts.path.removeprefix("/").partition("/")
    stream = urllib.parse.unquote(stream_part)
    subject = urllib.parse.unquote(subject_part)
    if not slash or not stream or not subject:
        raise ValueError(f"NATS URI {uri!r} must have the form {URI_FORM}")
    check_stream(stream, f"NATS URI {uri!r}")
    check_subject(subject, f"NATS URI {uri!r}", wildcards=True)
    return NatsAddress(servers, stream, subject)


def check_servers(servers: str, where: str) -> str:
    """``HOST[:PORT][,HOST[:PORT]]`` with each port given (4222 where it is not)."""
    checked = []
    for server in servers.split(","):
        host, colon, port = server.rpartition(":") if ":" in server else (server, "", "")
        if not host or (colon and not (port.isdigit() and 0 < int(port) < 65536)):
            raise ValueError(
                f"{where}: server {server!r} must be HOST or HOST:PORT (form {URI_FORM})"
            )
        checked.append(f"{host}:{port or DEFAULT_PORT}")
    return ",".join(checked)


def check_stream(stream: str, where: str) -> None:
    """A JetStream stream name has no whitespace, ``.``, ``*``, ``>`` or path separators."""
    bad = sorted(set(stream) & _STREAM_BAD)
    if bad or not stream:
        raise ValueError(
            f"{where}: stream {stream!r} must be a name without "
            f"{' '.join(map(repr, sorted(_STREAM_BAD)))}"
        )


def check_subject(subject: str, where: str, *, wildcards: bool) -> None:
    """Tokens separated by ``.``, none empty or holding whitespace; ``*`` as a whole token and
    ``>`` as the whole last token, where ``wildcards`` allows them."""
    tokens = subject.split(".")
    for place, part in enumerate(tokens):
        wildcard = part == "*" or (part == ">" and place == len(tokens) - 1)
        valid = (
            bool(part)
            and not any(character.isspace() for character in part)
            and (wildcard or ("*" not in part and ">" not in part))
        )
        if not valid or (wildcard and not wildcards):
            what = "a wildcard subject ('*', '>')" if valid else f"subject {subject!r}"
            raise ValueError(
                f"{where}: {what} is not valid here: a subject is tokens separated by "
                "'.', none empty or with spaces; '*' stands for one whole token and '>' for "
                "the rest as the last token"
                + ("" if wildcards else "; a message is sent to a subject without wildcards")
            )


def connect_options(connection: str | None) -> dict[str, Any]:
    """nats-py ``connect`` options from the named connection's settings (read now)."""
    if connection is None:
        return {}
    settings = get_connection(connection)
    check_settings(connection, settings, CONNECTION_KEYS, "the NATS provider")
    options: dict[str, Any] = {}
    for key in ("user", "password", "token", "name", "tls_hostname"):
        if key in settings:
            options[key] = str(settings[key])
    if "creds_file" in settings:
        options["user_credentials"] = str(settings["creds_file"])
    if "nkeys_seed" in settings:
        options["nkeys_seed"] = str(settings["nkeys_seed"])
    if any(key in settings for key in _TLS_FILES):
        context = ssl.create_default_context(cafile=settings.get("tls_ca_file"))
        if "tls_cert_file" in settings:
            context.load_cert_chain(settings["tls_cert_file"], settings.get("tls_key_file"))
        options["tls"] = context
    return options


async def connect(
    address: NatsAddress,
    connection: str | None,
    *,
    on_closed: Callable[[], Awaitable[None]] | None = None,
) -> Client:
    """A client connected to one of ``address``'s servers, that does not reconnect by itself:
    the trigger reconnects with its own backoff (and re-binds its consumer)."""
    nats = require("nats", "nats")

    async def on_error(error: Exception) -> None:
        # nats-py reports socket errors here as well as raising them; the caller logs them.
        del error

    async def closed() -> None:
        if on_closed is not None:
            await on_closed()

    client: Client = await nats.connect(
        servers=address.server_urls(),
        allow_reconnect=False,
        # Without these, nats-py tries each server 60 times, 2 s apart, before it gives up.
        max_reconnect_attempts=1,
        reconnect_time_wait=0,
        connect_timeout=CONNECT_TIMEOUT_S,
        error_cb=on_error,
        closed_cb=closed,
        **connect_options(connection),
    )
    return client


async def stream_created_ns(client: Client, stream: str) -> int:
    """When ``stream`` was created, in nanoseconds since the epoch: it tells a stream deleted and
    created again under its name apart. nats-py's ``NotFoundError`` when there is no such
    stream.

    Read from the server's answer itself: nats-py's ``StreamInfo.created`` keeps microseconds.
    """
    errors = require("nats.js.errors", "nats")
    answer = await client.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=CONNECT_TIMEOUT_S)
    info = json.loads(answer.data)
    if "error" in info:
        errors.APIError.from_error(info["error"])  # raises the error's own class
    return parse_created_ns(info["created"])


def parse_created_ns(created: str) -> int:
    """Nanoseconds since the epoch of a time as the server writes it (RFC 3339 with up to nine
    fraction digits, e.g. ``2025-01-01T12:00:00.123456789Z``)."""
    match = _RFC3339.fullmatch(created)
    if match is None:
        raise ValueError(f"NATS time {created!r} is not an RFC 3339 time")
    whole, fraction, zone = match.groups()
    at = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    seconds = (at - _EPOCH) // timedelta(seconds=1)
    return seconds * 1_000_000_000 + int((fraction or "").ljust(9, "0"))


async def send(uri: str, bodies: Sequence[str], connection: str | None = None) -> list[str]:
    """Publish each of ``bodies`` to the URI's subject through JetStream, each with a new
    ``Nats-Msg-Id`` header (the stream's duplicate window drops a message published twice),
    expecting the URI's stream to take it; its ``stream/sequence`` ids, in order."""
    address = parse_nats_uri(uri)
    check_subject(address.subject, f"NATS URI {uri!r}", wildcards=False)
    errors = require("nats.errors", "nats")
    try:
        client = await connect(address, connection)
    except (OSError, errors.Error) as error:
        raise ConnectionError(f"NATS at {address.servers} cannot be reached: {error}") from None
    try:
        stream = client.jetstream()
        sent = []
        for body in bodies:
            ack = await stream.publish(
                address.subject,
                body.encode(),
                stream=address.stream,
                headers={"Nats-Msg-Id": uuid.uuid4().hex},
            )
            sent.append(f"{ack.stream}/{ack.seq}")
        return sent
    except errors.Error as error:
        raise ConnectionError(
            f"NATS did not store the message in stream {address.stream!r} "
            f"(subject {address.subject!r}): {error}"
        ) from None
    finally:
        await client.close()
