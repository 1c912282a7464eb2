"""The messages a Pub/Sub puller holds, until each is acked, nacked or left to its deadline.

A message is acknowledged once every reader is done with it, in batched ``Acknowledge`` calls.
Until then its ack deadline is extended (``ModifyAckDeadline``) every third of the deadline, so a
slow commit does not let Pub/Sub hand it to another consumer. A message a reader could not
process is nacked (deadline 0: Pub/Sub delivers it again at once, or, where the subscription has
a dead-letter policy, forwards it to the dead-letter topic after its ``max_delivery_attempts``).
A message that a watcher of the daemon missed (not running at the moment) is left to its
deadline, and comes back then.

Without a dead-letter policy, deliveries are counted here, in memory and by message id, so a
restart of the daemon starts the count again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from watchers import shared_readers

#: Ack ids in one Acknowledge or ModifyAckDeadline call (Pub/Sub takes up to 2,500).
ACK_IDS_PER_CALL = 1000
#: Delivery counts kept (without a dead-letter policy) before the oldest are forgotten.
MAX_COUNTED = 100_000

#: A call of the subscriber by method name, with the request's fields as keyword arguments.
SubscriberCall = Callable[..., Awaitable[Any]]


@dataclasses.dataclass(eq=False)
class Held(shared_readers.Held):
    """A received message not yet settled. One to redeliver is nacked."""

    ack_id: str
    message_id: str
    #: A watcher of the daemon was not running when it came: not extended, and left to its
    #: deadline (unless some reader must see it again: then it is nacked).
    missed: bool = False


class HeldMessages:
    """The messages one subscription's puller holds, by ack id; the acks and nacks due, sent in
    batches; the extension of the deadlines of those held meanwhile."""

    def __init__(self, subscription: str, call: SubscriberCall) -> None:
        self._subscription = subscription
        self._call = call
        self._held: dict[str, Held] = {}
        self._acks: list[str] = []
        self._nacks: list[str] = []
        self._settling = asyncio.Event()
        self._deliveries: dict[str, int] = {}
        #: The deadline each extension sets, and the subscription's own: set when the puller
        #: opens.
        self.ack_deadline_s = self.subscription_deadline_s = 10
        #: Whether deliveries are counted here: not under a dead-letter policy (Pub/Sub counts).
        self.count_deliveries = True

    def __len__(self) -> int:
        return len(self._held)

    @property
    def acks_due(self) -> int:
        return len(self._acks)

    def hold(self, received: Any) -> Held:
        """Hold ``received`` (a raw ``ReceivedMessage`` protobuf), and count its delivery."""
        message_id = received.message.message_id
        entry = self._held[received.ack_id] = Held(received.ack_id, message_id)
        if self.count_deliveries:
            self._deliveries[message_id] = self._deliveries.pop(message_id, 0) + 1
            if len(self._deliveries) > MAX_COUNTED:
                del self._deliveries[next(iter(self._deliveries))]
        return entry

    def deliveries(self, message_id: str) -> int:
        """The deliveries of the message to this process (0 when not counted)."""
        return self._deliveries.get(message_id, 0)

    def settle(self, entry: Held) -> bool:
        """Once every reader is done with the message: ack it, nack it, or let it lapse.
        Whether it was settled now (and is held no more)."""
        if not entry.settleable:
            return False
        entry.settled = True
        if self._held.pop(entry.ack_id, None) is None:
            return False  # nacked at close already
        if entry.redeliver:
            self._nacks.append(entry.ack_id)
        elif entry.missed:
            pass  # not extended any more: Pub/Sub delivers it again after its deadline
        else:
            self._acks.append(entry.ack_id)
            self._deliveries.pop(entry.message_id, None)
        self._settling.set()
        return True

    async def send_when_settled(self) -> None:
        """Send the acks and nacks due each time messages are settled."""
        while True:
            await self._settling.wait()
            self._settling.clear()
            await self.send_settled()

    async def send_settled(self) -> None:
        """Send the acks and nacks due. Each leaves its list once sent: a send cancelled at
        close is sent again (an ack id acked twice is no error)."""
        while self._acks:
            chunk = self._acks[:ACK_IDS_PER_CALL]
            await self._call("acknowledge", subscription=self._subscription, ack_ids=chunk)
            del self._acks[: len(chunk)]
        while self._nacks:
            chunk = self._nacks[:ACK_IDS_PER_CALL]
            await self._call(
                "modify_ack_deadline",
                subscription=self._subscription,
                ack_ids=chunk,
                ack_deadline_seconds=0,
            )
            del self._nacks[: len(chunk)]

    def nack_all(self) -> None:
        """Nack every message still held (at close); a reader done with one later changes
        nothing."""
        self._nacks += [held.ack_id for held in self._held.values()]
        self._held.clear()

    async def extend_deadlines(self) -> None:
        """Every third of the deadline (the shorter of the subscription's and ours), extend the
        deadline of every message held."""
        while True:
            await asyncio.sleep(min(self.ack_deadline_s, self.subscription_deadline_s) / 3)
            held = [held.ack_id for held in self._held.values() if not held.missed]
            for chunk in _chunks(held):
                await self._call(
                    "modify_ack_deadline",
                    subscription=self._subscription,
                    ack_ids=chunk,
                    ack_deadline_seconds=self.ack_deadline_s,
                )


def _chunks(ack_ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ack_ids), ACK_IDS_PER_CALL):
        yield ack_ids[start : start + ACK_IDS_PER_CALL]
