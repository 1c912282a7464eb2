"""When a watcher first started: the moment from which its source's messages are new.

Every message added to a source after its watcher was deployed must become an event, though the
source may not exist yet when the watcher first starts (a stream made by its first message) and
the daemon may be down when it appears. So a trigger that reads "new messages" (a Redis group at
``$``, Kinesis ``LATEST``, a RabbitMQ stream queue's ``next``) keeps the time of its first start
as a checkpoint of its own (``<prefix>@started``, epoch milliseconds, stored by the daemon and
never moved back), and a reader it makes later (a consumer group, a shard iterator, a stream
consumer) starts from that time rather than from the source's end.

Between yielding that checkpoint and its commit, a trigger restarted in the same process (its
source was missing) must not take a later time for its first start: the times yielded are also
kept here, for the life of the process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Awaitable, Callable

from triggerer import checkpoints
from triggerer.triggers import CHECKPOINT_KEY_MAX_CHARS, TriggerEvent

STARTED = "@started"
"""The last part of a first start's checkpoint key."""

# First starts yielded by this process, by key: their checkpoints may not be committed yet.
_yielded: dict[str, int] = {}


@dataclasses.dataclass(frozen=True)
class FirstStart:
    """When the watcher whose checkpoint key is ``key`` first started."""

    key: str
    #: Epoch milliseconds.
    at_ms: int
    #: Whether this start is the first: the trigger yields :meth:`checkpoint` to store it.
    now: bool

    def checkpoint(self) -> TriggerEvent:
        """The checkpoint that stores this first start; remembered in this process too."""
        _yielded[self.key] = self.at_ms
        return TriggerEvent.checkpoint_only(self.key, str(self.at_ms))


def started_key(prefix: str) -> str:
    """The checkpoint key of a first start: ``<prefix>@started``, or, past the store's longest
    key, a digest of ``prefix`` in its place."""
    key = prefix + STARTED
    if len(key) <= CHECKPOINT_KEY_MAX_CHARS:
        return key
    return f"started/{hashlib.sha256(prefix.encode()).hexdigest()}/{STARTED}"


async def first_start(key: str, clock_ms: Callable[[], Awaitable[int]] | None = None) -> FirstStart:
    """The first start stored (or yielded by this process) under ``key``; else this start, at
    ``clock_ms()`` (by default the daemon's clock): pass the source's own clock where it has
    one, as its messages' times are of that clock."""
    stored = await checkpoints.stored_position(key)
    if stored is not None:
        return FirstStart(key, int(stored), now=False)
    if key in _yielded:
        return FirstStart(key, _yielded[key], now=False)
    at_ms = await clock_ms() if clock_ms is not None else time.time_ns() // 1_000_000
    return FirstStart(key, at_ms, now=True)
