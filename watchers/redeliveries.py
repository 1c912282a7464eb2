"""Which messages of a source this daemon process has had delivered, kept across the restarts
of its watchers (a watcher that failed is made again: a new trigger).

NATS JetStream and Redis Streams count each message's deliveries, and their triggers take one
delivered more than ``max_deliveries`` times for a message that killed the daemon during each
delivery: a dead letter, not processed again. A watcher that fails while the process lives also
leaves its messages to be delivered again, counted once more: a schema registry that does not
answer fails it at each restart until it answers, and every message the watcher held comes back
each time. A message delivered to this process before is one it lived through: its count says
nothing of it. A trigger notes the messages of each batch delivered before handling any (a
watcher failing on the first leaves the others unhandled, to be delivered again too), and learns
of each whether this process had it before.

Kept per event loop and source, the latest ``limit`` messages delivered: as many as a watcher
may hold (in flight, and a batch taken), so that those it held when it failed are still known
when they come back, each delivery making one the latest again. One that is not known falls back
to its count, as after a restart of the daemon.
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from collections.abc import Hashable, Iterable


class DeliveredHere:
    """The latest ``limit`` messages of one source (by key) delivered to this process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._keys: collections.OrderedDict[Hashable, None] = collections.OrderedDict()

    def note(self, keys: Iterable[Hashable]) -> list[bool]:
        """Note a delivery of each message of ``keys``, the latest now: whether this process
        had one before, for each."""
        before = []
        for key in keys:
            before.append(key in self._keys)
            self._keys[key] = None
            self._keys.move_to_end(key)
        while len(self._keys) > self.limit:
            self._keys.popitem(last=False)
        return before


_SOURCES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, DeliveredHere]] = (
    weakref.WeakKeyDictionary()
)


def delivered_here(source: str, limit: int) -> DeliveredHere:
    """The messages of ``source`` (what names it to its broker: server, stream, consumer)
    delivered to this process, shared by every trigger of this event loop reading it."""
    per_loop = _SOURCES.setdefault(asyncio.get_running_loop(), {})
    found = per_loop.get(source)
    if found is None:
        found = per_loop[source] = DeliveredHere(limit)
    found.limit = limit
    return found


def redelivered_too_often(delivered: int, max_deliveries: int, *, had_here: bool) -> str | None:
    """Why a message delivered ``delivered`` times is a dead letter without being processed:
    more than ``max_deliveries`` deliveries, and none to this process (``had_here``: see
    :class:`DeliveredHere`), so the daemon stopped during each, killed by this very message
    maybe. ``None``: it is processed."""
    if delivered <= max_deliveries or had_here:
        return None
    return (
        f"delivered {delivered} times, more than max_deliveries={max_deliveries}, without its "
        "event being stored"
    )
