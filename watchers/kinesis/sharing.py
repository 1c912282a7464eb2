"""A stream's shards shared by the daemons that run its trigger: each shard read by one of them.

Every daemon on one store runs the Kinesis trigger (it is ``shareable``); each holds a lease on
the shards it reads (:mod:`triggerer.part_leases`, the group being the trigger's checkpoint
prefix ``kinesis/<stream>/<application>/``) and reads only those. At the start of a round of
reads, once per lease interval (the daemon's heartbeat), :meth:`ShardSharing.round` reads the
stored positions, offers the shards to be read now (:meth:`ShardReader.to_share`) to the leases,
and tells the reader what it holds: a shard newly held reads on from its stored position,
written with the events of whoever read it before. Events carry their shard's fence, so those
of a shard taken over meanwhile are not stored.

Resharding across daemons: a parent's children are read only once it is finished, and the
reader that holds a parent may not be the one that gets its children, so the end of a shard is
stored too, as a checkpoint of its own (``<prefix><shard id>/@ended``, written after its last
records): a shard stored as ended is finished for every reader, and its lease is given up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import structlog

from triggerer import checkpoints
from triggerer.part_leases import part_leases
from watchers.first_start import STARTED

if TYPE_CHECKING:
    from triggerer.part_leases import Fence
    from watchers.kinesis.reader import ShardReader

log = structlog.get_logger(__name__)

ENDED = "/@ended"
"""What the checkpoint key of a shard read to its end adds to the shard's own key."""
ENDED_MARK = "1"
"""The position of that checkpoint: it only says the shard is ended."""


async def stored_state(prefix: str) -> tuple[dict[str, str], set[str]]:
    """The stored positions under ``prefix`` by shard id, and the shards stored as ended."""
    positions: dict[str, str] = {}
    ended: set[str] = set()
    for key, position in (await checkpoints.stored_positions(prefix)).items():
        shard_id = key.removeprefix(prefix)
        if shard_id.endswith(ENDED) and "/" not in shard_id.removesuffix(ENDED):
            ended.add(shard_id.removesuffix(ENDED))
        elif "/" not in shard_id and shard_id != STARTED:  # "/": another application's
            positions[shard_id] = position
    return positions, ended


class ShardSharing:
    """The shards ``reader`` holds, balanced with the other daemons under ``group``; the
    trigger's first start was at ``started_at_ms``."""

    def __init__(self, reader: ShardReader, group: str, stream: str, *, started_at_ms: int) -> None:
        self._reader = reader
        self._group = group
        self._stream = stream
        self._started_at_ms = started_at_ms
        self._leases = part_leases()
        self._next_at = 0.0
        #: By shard held, the fence its events carry.
        self.fences: dict[str, Fence | None] = {}
        reader.held = set()  # nothing is read before the first round
        reader.on_round = self.round

    async def round(self) -> None:
        """Balance the shards with the other daemons, once the lease interval has passed."""
        if anyio.current_time() < self._next_at:
            return
        positions, ended = await stored_state(self._group)
        held = await self._leases.balance(self._group, self._reader.to_share(ended))
        if held.keys() - self.fences.keys():
            # Their positions as stored once they were taken: the last holder's last commit.
            positions, ended = await stored_state(self._group)
        if held.keys() != self.fences.keys():
            log.info(
                "kinesis_shards_held",
                stream=self._stream,
                shards=sorted(held),
                taken=sorted(held.keys() - self.fences.keys()),
                given_up=sorted(self.fences.keys() - held.keys()),
            )
        self._reader.share(held.keys(), positions, ended, started_at_ms=self._started_at_ms)
        self.fences = held
        self._next_at = anyio.current_time() + self._leases.interval_s

    async def release(self) -> None:
        """Give every shard up (the trigger stopped): the other daemons take them at once."""
        self.fences = {}
        await self._leases.release(self._group)
