"""The messages a NATS trigger has received and not answered yet (acked or nakked): each one's
latest delivery, marked in progress every third of the ack wait so that the server does not
deliver it again while its event is committed; the room left under the trigger's limit; and the
``ack`` of each event.

Answers go out on the trigger's current connection: an event's ack made after a reconnect is
sent on the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import structlog

from watchers.clients import require

if TYPE_CHECKING:
    from nats.aio.client import Client

log = structlog.get_logger(__name__)

ACK = b"+ACK"
NAK = b"-NAK"
IN_PROGRESS = b"+WPI"


class InFlight:
    """Messages received and not answered, by stream sequence: at most ``limit`` before
    :meth:`room` waits; each marked in progress every ``ack_wait_s / 3`` while connected."""

    def __init__(self, *, ack_wait_s: float, limit: int) -> None:
        self._ack_wait_s = ack_wait_s
        self._limit = limit
        # Stream sequence -> the reply subject of its latest delivery, where answers go.
        self._replies: dict[int, str] = {}
        self._room = asyncio.Event()
        self._client: Client | None = None
        self._keepalive: asyncio.Task[None] | None = None
        # Bumped by forget(): the acks of deliveries held before are not sent.
        self._generation = 0
        #: Events acked: acks sent, or dropped while disconnected (the message is delivered
        #: again, and its dedup key absorbs it).
        self.acked = 0

    def __len__(self) -> int:
        return len(self._replies)

    def received(self, sequence: int, reply: str) -> MessageAck:
        """Hold a delivery (it replaces an earlier delivery of the message): its ack."""
        self._replies[sequence] = reply
        return MessageAck(self, sequence, reply, self._generation)

    async def room(self) -> None:
        """Wait until fewer than ``limit`` are held; nats-py's ``ConnectionClosedError`` when the
        connection closes meanwhile."""
        errors = require("nats.errors", "nats")
        while len(self._replies) >= self._limit:
            self._room.clear()
            await self._room.wait()
            if self._client is None or self._client.is_closed:
                raise errors.ConnectionClosedError

    def wake(self) -> None:
        """Wake a :meth:`room` waiting (the connection closed)."""
        self._room.set()

    def connected(self, client: Client, name: str) -> None:
        """Send answers on ``client`` from now on, and mark the messages held in progress."""
        self._client = client
        self._keepalive = asyncio.create_task(self._mark_in_progress(client), name=name)

    async def disconnected(self) -> None:
        """Stop marking messages in progress; answers wait for the next connection."""
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None:
            keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keepalive
        self._client = None

    def clear(self) -> None:
        """Forget the messages held (the server delivers them again after the ack wait)."""
        self._replies.clear()
        self._room.set()

    def forget(self) -> None:
        """Forget the messages held, and never send their events' answers: they came from a
        stream since deleted, and would answer its successor's messages of the same sequences."""
        self.clear()
        self._generation += 1

    async def answer(self, sequence: int, reply: str, answer: bytes, generation: int) -> bool:
        """Send ``answer`` to the delivery of ``reply``; ``False`` when not connected (the
        message is delivered again after the ack wait) or forgotten. Only that delivery stops
        being held: a later one, made on a new connection, stays marked in progress until its
        own answer."""
        if generation != self._generation:
            return False
        if self._replies.get(sequence) == reply:
            del self._replies[sequence]
            self._room.set()
        client = self._client
        if client is None or not client.is_connected:
            return False
        await client.publish(reply, answer)
        return True

    async def _mark_in_progress(self, client: Client) -> None:
        """Every third of the ack wait, tell the server each held message is in progress, until
        the connection closes (the trigger connects again and starts another)."""
        errors = require("nats.errors", "nats")
        while True:
            await asyncio.sleep(self._ack_wait_s / 3)
            if not client.is_connected:
                return
            failed: list[Exception] = []
            for reply in list(self._replies.values()):
                try:
                    await client.publish(reply, IN_PROGRESS)
                except errors.Error as error:
                    failed.append(error)
            if failed:
                # The messages not marked may be delivered again (their dedup keys absorb
                # that); the next round tries again.
                log.warning(
                    "nats_in_progress_failed",
                    messages=len(failed),
                    error=f"{type(failed[-1]).__name__}: {failed[-1]}",
                )


class MessageAck:
    """The ``ack`` of one event: acks its message's delivery, once, on the trigger's current
    connection; :meth:`nak` asks for the message again instead."""

    __slots__ = ("_done", "_generation", "_in_flight", "_reply", "_sequence")

    def __init__(self, in_flight: InFlight, sequence: int, reply: str, generation: int) -> None:
        self._in_flight = in_flight
        self._sequence = sequence
        self._reply = reply
        self._generation = generation
        self._done = False

    async def __call__(self) -> None:
        if await self._send(ACK):
            self._in_flight.acked += 1

    async def nak(self) -> None:
        """Have the message delivered again at once."""
        await self._send(NAK)

    async def _send(self, answer: bytes) -> bool:
        if self._done:
            return False
        self._done = True
        sent = await self._in_flight.answer(self._sequence, self._reply, answer, self._generation)
        if not sent:
            log.info("nats_ack_deferred", reply=self._reply)
        return True
