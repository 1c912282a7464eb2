"""A JetStream durable's messages pulled through a subscription of the trigger's own: pull requests
published to ``$JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>``, the messages they bring gathered
in a deque, and the server's status messages read as the JetStream protocol documents them.

nats-py's ``PullSubscription.fetch`` makes a task, a uuid and a ``wait_for`` for each message it
waits for; here the messages are taken as they come, a batch at a time.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import TYPE_CHECKING

import structlog

from watchers.clients import require

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

log = structlog.get_logger(__name__)

#: How long past a pull's expiry the server's word that it ended is waited for, before the pull
#: is taken as lost (and the durable looked up: a deleted one ends the pull).
LOST_AFTER_S = 2.0
_HEARTBEAT = "100"
_NO_MESSAGES = "404"
_REQUEST_TIMEOUT = "408"
_CONFLICT = "409"
_NO_RESPONDERS = "503"


class PullEnded(Exception):
    """The durable cannot be pulled from any more (deleted, with its stream or by hand; or the
    server ended the pull for a reason to connect again for): the trigger connects again."""


class Pull:
    """Pulls of the durable ``durable`` of ``stream``, ``batch`` messages at most each, each
    waiting ``expires_s`` for messages at most; one pull open at a time."""

    def __init__(
        self, client: Client, stream: str, durable: str, *, batch: int, expires_s: float
    ) -> None:
        self._client = client
        self._stream = stream
        self._durable = durable
        self._batch = batch
        self._expires_s = expires_s
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        # Each pull answers to an inbox of its own, so an older pull's end is told apart.
        self._inbox = f"{client.new_inbox()}."
        self._messages: deque[Msg] = deque()
        self._arrived = asyncio.Event()
        self._subscription: Subscription | None = None
        self._pulls = 0
        #: A pull is open (asked for and not ended); messages it may still bring.
        self._open = False
        self._owed = 0
        self._deadline = 0.0
        self._ended: str | None = None

    async def start(self) -> None:
        """Subscribe to the pulls' inboxes."""
        self._subscription = await self._client.subscribe(f"{self._inbox}*", cb=self._received)

    async def stop(self) -> None:
        """Unsubscribe; messages received and not taken are delivered again after the ack wait."""
        subscription, self._subscription = self._subscription, None
        if subscription is not None and self._client.is_connected:
            await subscription.unsubscribe()
        self._messages.clear()

    def untaken(self) -> list[Msg]:
        """The messages received and not taken (yet)."""
        return list(self._messages)

    def wake(self) -> None:
        """Wake a :meth:`take` waiting (the connection closed)."""
        self._arrived.set()

    async def take(self, most: int) -> list[Msg]:
        """Up to ``most`` messages (pulled when none are waiting); ``[]`` when a pull ends
        without any. Raises :class:`PullEnded` when the durable is gone, and nats-py's
        ``ConnectionClosedError`` when the connection is."""
        errors = require("nats.errors", "nats")
        waited = False
        while not self._messages:
            if self._client.is_closed:
                raise errors.ConnectionClosedError
            if self._ended is not None:
                raise PullEnded(self._ended)
            if not self._open:
                if waited:
                    return []  # the pull ended without messages
                await self._pull(most)
            try:
                async with asyncio.timeout_at(self._deadline):
                    await self._arrived.wait()
            except TimeoutError:
                await self._lost()
            self._arrived.clear()
            waited = True
        return [self._messages.popleft() for _ in range(min(most, len(self._messages)))]

    async def _pull(self, most: int) -> None:
        self._pulls += 1
        self._owed = min(self._batch, most)
        self._open = True
        self._deadline = asyncio.get_running_loop().time() + self._expires_s + LOST_AFTER_S
        request = {"batch": self._owed, "expires": int(self._expires_s * 1_000_000_000)}
        await self._client.publish(
            self._next_subject, json.dumps(request).encode(), reply=f"{self._inbox}{self._pulls}"
        )

    async def _lost(self) -> None:
        """No word on the open pull past its expiry: a durable deleted between two pulls is the
        usual cause (a pull to no durable is not answered); another pull is made otherwise."""
        errors = require("nats.js.errors", "nats")
        self._open = False
        try:
            await self._client.jetstream().consumer_info(self._stream, self._durable)
        except errors.NotFoundError:
            raise PullEnded(
                f"the durable {self._durable!r} of stream {self._stream!r} no longer exists"
            ) from None
        log.info("nats_pull_unanswered", stream=self._stream, durable=self._durable)

    async def _received(self, message: Msg) -> None:
        # Messages of the stream come with their own subject; the server's status messages
        # with the pull's inbox, a "Status" header and no data.
        if not message.subject.startswith(self._inbox):
            self._messages.append(message)
            self._owed -= 1
            if self._owed <= 0:
                self._open = False
            self._arrived.set()
            return
        headers = message.headers or {}
        status = headers.get("Status")
        if status == _HEARTBEAT:
            return
        description = headers.get("Description", "")
        if status in (_CONFLICT, _NO_RESPONDERS):
            # 409: the durable deleted, a leader or server changing, or a limit of the durable
            # exceeded (max waiting pulls, batch, expiry): connect again, with backoff.
            self._ended = f"the server ended the pull: {status} {description}".rstrip()
        elif message.subject != f"{self._inbox}{self._pulls}":
            return  # an older pull's end, given up on
        elif status not in (_NO_MESSAGES, _REQUEST_TIMEOUT):
            log.warning(
                "nats_pull_status", durable=self._durable, status=status, description=description
            )
        self._open = False
        self._arrived.set()
