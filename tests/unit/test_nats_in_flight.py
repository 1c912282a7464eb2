"""InFlight: which deliveries a NATS trigger holds, and where each event's ack goes."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import anyio

from watchers.nats.in_flight import ACK, NAK, InFlight

if TYPE_CHECKING:
    from nats.aio.client import Client


class Connection:
    """A connected client that keeps what is published to it."""

    is_connected = True
    is_closed = False

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        self.published.append((subject, payload))


async def connected(in_flight: InFlight) -> Connection:
    connection = Connection()
    in_flight.connected(cast("Client", connection), name="test-in-progress")
    return connection


async def test_an_earlier_deliverys_ack_leaves_the_redelivery_held() -> None:
    """Delivered again on a new connection while its event was committed: the earlier
    delivery's ack does not stop the later one being held (and marked in progress)."""
    in_flight = InFlight(ack_wait_s=30, limit=10)
    earlier = in_flight.received(7, "$JS.ACK.S.d.1.7.7.0.0")
    later = in_flight.received(7, "$JS.ACK.S.d.2.7.9.0.0")
    connection = await connected(in_flight)
    await earlier()
    assert len(in_flight) == 1
    await later()
    await later()  # once only
    assert len(in_flight) == 0
    assert connection.published == [
        ("$JS.ACK.S.d.1.7.7.0.0", ACK),
        ("$JS.ACK.S.d.2.7.9.0.0", ACK),
    ]
    assert in_flight.acked == 2
    await in_flight.disconnected()


async def test_an_ack_while_disconnected_is_dropped_and_counted() -> None:
    in_flight = InFlight(ack_wait_s=30, limit=10)
    ack = in_flight.received(1, "r1")
    await ack()
    assert len(in_flight) == 0
    assert in_flight.acked == 1


async def test_the_acks_of_a_forgotten_streams_messages_are_not_sent() -> None:
    """A stream deleted and made again: the old messages' acks would ack the new stream's
    messages of the same sequences before their events are stored."""
    in_flight = InFlight(ack_wait_s=30, limit=10)
    old = in_flight.received(1, "old")
    in_flight.forget()
    assert len(in_flight) == 0
    connection = await connected(in_flight)
    new = in_flight.received(1, "new")
    await old()
    assert len(in_flight) == 1
    await new.nak()
    assert connection.published == [("new", NAK)]
    assert in_flight.acked == 1  # its event was stored; the message comes again, deduplicated
    await in_flight.disconnected()


async def test_room_waits_for_an_answer() -> None:
    in_flight = InFlight(ack_wait_s=30, limit=2)
    await connected(in_flight)
    first = in_flight.received(1, "r1")
    in_flight.received(2, "r2")
    async with anyio.create_task_group() as group:
        group.start_soon(in_flight.room)
        await anyio.sleep(0.05)
        await first()
    assert len(in_flight) == 1
    await in_flight.disconnected()
