"""A run's log shipped into the store while the run runs (``run_log_chunk``).

The run's process writes its log to a file of the daemon running it, ``[spark]
logs_dir/<pipeline_id>/<run_id>/try-<n>.log``, as it always did. While the process runs, a
:class:`LogShipper` reads what the file gained every :data:`SHIP_EVERY_S` (in a worker thread)
and stores it as one chunk, one insert; once the process has ended it ships the rest. So any
daemon's API, the CLI and the UI read the log from the store
(:mod:`triggerer.service.runs.stored_logs`), and a daemon killed in the middle of a run leaves
all but its last second.

The store keeps at most ``[runs] log_max_bytes`` of a try (:class:`Kept`): its first quarter,
then the last three quarters, older chunks of which are deleted as newer ones come; the bytes in
between are skipped, never read. A try that printed nothing gets one empty chunk, which tells
"printed nothing" from "never shipped". When a try starts, the chunks of the run's earlier
tries are deleted; a try started again after a shutdown or a crash (the same try number) goes
on after what the first attempt shipped.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import anyio
import structlog
from sqlalchemy import ColumnElement, delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.service.store import models
from triggerer.service.store.failures import STORE_ERRORS, is_outage
from triggerer.service.store.outages import until_stored

log = structlog.get_logger(__name__)

SHIP_EVERY_S = 1.0
"""How often what a running run's log gained is stored."""
CHUNK_MAX_BYTES = 256 * 1024
"""The largest chunk, and at most a sixteenth of the tail's share of the cap: the tail is
trimmed a chunk at a time, so it keeps at least fifteen sixteenths of its share."""

_CHUNK = models.RunLogChunk


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A chunk to store: ``length`` bytes from ``start`` in what the log gained, which are at
    ``position`` in the try's log."""

    seq: int
    position: int
    start: int
    length: int


@dataclasses.dataclass(frozen=True)
class Shipment:
    """What to write: new chunks, the seqs of old tail chunks to delete (``first, last``), and
    what the store keeps once it is written."""

    chunks: tuple[Chunk, ...]
    drop: tuple[int, int] | None
    kept: Kept


@dataclasses.dataclass(frozen=True)
class Kept:
    """What the store keeps of a try's log: its first ``head`` bytes (up to ``head_max``), and
    ``tail`` chunks ``(seq, length)`` of at most ``tail_max`` bytes in all, oldest first.
    ``written`` is the length of the whole log so far (the position of its next byte)."""

    head_max: int
    tail_max: int
    written: int = 0
    head: int = 0
    tail: tuple[tuple[int, int], ...] = ()
    next_seq: int = 0

    @classmethod
    def within(cls, max_bytes: int, chunks: Iterable[tuple[int, int, int]] = ()) -> Kept:
        """What the store keeps of a log capped at ``max_bytes``, holding ``chunks`` already,
        each ``(seq, position, length)`` in order (those of an earlier attempt of the try)."""
        head_max = max_bytes // 4
        kept = cls(head_max=head_max, tail_max=max_bytes - head_max)
        for seq, position, length in chunks:
            end = position + length
            if position == kept.head == kept.written and end <= head_max:
                kept = dataclasses.replace(kept, head=end)
            else:
                kept = dataclasses.replace(kept, tail=(*kept.tail, (seq, length)))
            kept = dataclasses.replace(kept, written=max(kept.written, end), next_seq=seq + 1)
        return kept

    @property
    def chunk_max(self) -> int:
        """The largest chunk (:data:`CHUNK_MAX_BYTES`)."""
        return max(1, min(CHUNK_MAX_BYTES, self.tail_max // 16))

    def ship(self, added: int, *, final: bool = False) -> Shipment:
        """The shipment that keeps ``added`` more bytes of the log within the cap. ``final``:
        the try has ended; a try that shipped no chunk gets an empty one."""
        # The head grows while nothing has been cut or sent to the tail.
        head = min(added, self.head_max - self.head) if self.written == self.head else 0
        rest = added - head
        skipped = max(0, rest - self.tail_max)
        pieces = [(0, head, False), (head + skipped, rest - skipped, True)]
        chunks: list[Chunk] = []
        tail = list(self.tail)
        seq = self.next_seq
        for start, length, in_tail in pieces:
            for offset in range(start, start + length, self.chunk_max):
                size = min(self.chunk_max, start + length - offset)
                chunks.append(Chunk(seq, self.written + offset, offset, size))
                if in_tail:
                    tail.append((seq, size))
                seq += 1
        if final and not chunks and self.next_seq == 0:
            chunks.append(Chunk(seq, self.written, 0, 0))
            seq += 1
        dropped = []
        tail_bytes = sum(length for _, length in tail)
        while tail_bytes > self.tail_max:
            oldest, length = tail.pop(0)
            dropped.append(oldest)
            tail_bytes -= length
        kept = dataclasses.replace(
            self,
            written=self.written + added,
            head=self.head + head,
            tail=tuple(tail),
            next_seq=seq,
        )
        drop = (dropped[0], dropped[-1]) if dropped else None
        return Shipment(tuple(chunks), drop, kept)


class LogShipper:
    """Ships the log of one try of a run from its file into the store.

    :meth:`begin` before the run's process starts; :meth:`while_waiting` ships every
    :data:`SHIP_EVERY_S` while the process runs; :meth:`finish` ships the rest once the try is
    over, however it ended.
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        run_pk: int,
        try_number: int,
        path: Path,
        max_bytes: int,
    ) -> None:
        self._sessions = sessions
        self._run_pk = run_pk
        self._try_number = try_number
        self.path = path
        self._max_bytes = max_bytes
        self._file: int | None = None
        # Where the shipping started: a byte of the file, and its position in the try's log.
        # The file gains what a try started again here appends to it; the log goes on after
        # what its first attempt shipped.
        self._anchor: tuple[int, int] | None = None
        self._file_start = 0
        # None until read from the store, and after a write that may or may not have landed.
        self._kept: Kept | None = None
        # The chunks of the run's earlier tries go with this try's first write.
        self._earlier_tries = True
        self._waiting_for_store = False
        self._given_up = False

    async def begin(self) -> None:
        """Note where the file ends before the try's process adds to it."""
        self._file_start = await anyio.to_thread.run_sync(_size, self.path)

    async def while_waiting(self, wait: Callable[[], Awaitable[int]]) -> int:
        """``await wait()`` (the process's end), shipping meanwhile."""
        async with anyio.create_task_group() as shipping:
            shipping.start_soon(self._ship_every)
            returncode = await wait()
            shipping.cancel_scope.cancel()
        return returncode

    async def finish(self) -> None:
        """Ship the rest of the log, waiting out a store outage (as the try's end does); then
        close the file."""
        try:
            await until_stored(lambda: self._ship(final=True), during="run log")
        except STORE_ERRORS as error:  # refused, not an outage: see _give_up
            self._give_up(error)
        except OSError as error:
            self._unreadable(error)
        finally:
            if self._file is not None:
                os.close(self._file)
                self._file = None

    async def _ship_every(self) -> None:
        while True:
            await anyio.sleep(SHIP_EVERY_S)
            try:
                await self._ship()
            except STORE_ERRORS as error:
                if not is_outage(error):
                    self._give_up(error)
                elif not self._waiting_for_store:  # once an outage: the run goes on
                    self._waiting_for_store = True
                    log.warning("run_log_waiting_for_store", error=str(error).splitlines()[0])
                continue
            except OSError as error:
                self._unreadable(error)
            self._waiting_for_store = False

    async def _ship(self, *, final: bool = False) -> None:
        if self._given_up:
            return
        if self._kept is None:
            self._kept = await self._read_back()
        kept = self._kept
        shipment, pieces = await anyio.to_thread.run_sync(self._take, kept, final)
        if not shipment.chunks:
            return
        self._kept = None  # until the write is known to have landed
        async with self._sessions.begin() as session:
            if self._earlier_tries:
                await session.execute(
                    delete(_CHUNK).where(
                        _CHUNK.run_pk == self._run_pk, _CHUNK.try_number != self._try_number
                    )
                )
            await session.execute(
                insert(_CHUNK),
                [
                    {
                        "run_pk": self._run_pk,
                        "try_number": self._try_number,
                        "seq": chunk.seq,
                        "position": chunk.position,
                        "data": data,
                    }
                    for chunk, data in zip(shipment.chunks, pieces, strict=True)
                ],
            )
            if shipment.drop is not None:
                first, last = shipment.drop
                await session.execute(
                    delete(_CHUNK).where(*self._own(), _CHUNK.seq.between(first, last))
                )
        self._kept = shipment.kept
        self._earlier_tries = False

    async def _read_back(self) -> Kept:
        """What the store keeps of this try: an earlier attempt's chunks, or those of a write
        whose outcome was not known (a read: a short try writes once)."""
        async with self._sessions() as session:
            rows = await session.execute(
                select(_CHUNK.seq, _CHUNK.position, func.length(_CHUNK.data))
                .where(*self._own())
                .order_by(_CHUNK.seq)
            )
            kept = Kept.within(self._max_bytes, [tuple(row) for row in rows.all()])
        if self._anchor is None:
            self._anchor = (self._file_start, kept.written)
        return kept

    def _own(self) -> tuple[ColumnElement[bool], ...]:
        return (_CHUNK.run_pk == self._run_pk, _CHUNK.try_number == self._try_number)

    def _take(self, kept: Kept, final: bool) -> tuple[Shipment, list[bytes]]:
        """What the file gained since ``kept``, as a shipment and the bytes of its chunks (in a
        worker thread)."""
        assert self._anchor is not None  # noqa: S101  # set by the first _read_back
        file_start, logged = self._anchor
        read_to = file_start + kept.written - logged
        if self._file is None:
            try:
                self._file = os.open(self.path, os.O_RDONLY)
            except (FileNotFoundError, NotADirectoryError):  # not made (yet), or cannot be
                shipment = kept.ship(0, final=final)
                return shipment, [b""] * len(shipment.chunks)
        # Held open: the log is read on after its folder is deleted.
        added = max(0, os.fstat(self._file).st_size - read_to)
        shipment = kept.ship(added, final=final)
        return shipment, [
            os.pread(self._file, chunk.length, read_to + chunk.start) for chunk in shipment.chunks
        ]

    def _give_up(self, error: BaseException) -> None:
        """The store refused a chunk (another instance writes this try's log: it took the run
        for dead): this try's log is that instance's to ship."""
        self._given_up = True
        log.error("run_log_refused", error=str(error).splitlines()[0])

    def _unreadable(self, error: OSError) -> None:
        self._given_up = True
        log.error("run_log_unreadable", path=str(self.path), error=str(error))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # none, or none to be had (its folder is a file...): the try fails on it
        return 0
