"""A run's log as the store holds it, for the API, the CLI and the UI; or why it has none.

The daemon running a try ships its log into ``run_log_chunk`` as it runs
(:mod:`triggerer.service.runs.log_shipping`), so any daemon reads it, after the daemon that
ran it and its ``[spark] logs_dir`` are gone. What the size cap cut shows as a gap between two
chunks, and here as one line saying how much was cut. A run from before the store kept logs
(revision 0015) has no chunk: its log is read from its file, where this daemon has it.

An empty log comes with the reason (:class:`Empty`): the run has not started, was cancelled
before it started, has printed nothing yet, printed nothing, or its log was never shipped.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable

import anyio
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.service.errors import NotFound
from triggerer.service.store import models
from triggerer.service.store.states import RunState

_CHUNK = models.RunLogChunk


class Empty(enum.StrEnum):
    """Why a run's log is empty (the API's ``Triggerer-Log-Empty`` header)."""

    NOT_STARTED = "not_started"
    CANCELLED_BEFORE_START = "cancelled_before_start"
    NO_OUTPUT_YET = "no_output_yet"
    NO_OUTPUT = "no_output"
    NOT_KEPT = "not_kept"


@dataclasses.dataclass(frozen=True)
class RunLog:
    """The log of a run's latest try; when ``text`` is empty, ``empty`` says why and
    ``reason`` says so in a sentence."""

    text: str
    empty: Empty | None = None
    reason: str | None = None


async def read(session: AsyncSession, run_id: str) -> RunLog:
    """The log of ``run_id``'s latest try, or why it has none; :class:`NotFound` for a run
    the store does not hold."""
    run = await session.scalar(select(models.Run).where(models.Run.run_id == run_id))
    if run is None:
        raise NotFound(
            f"run {run_id!r} does not exist (see 'runs list'): retention deletes a run, and its "
            "log, [retention] runs_days after it ended"
        )
    latest = select(func.max(_CHUNK.try_number)).where(_CHUNK.run_pk == run.id)
    rows = await session.execute(
        select(_CHUNK.position, _CHUNK.data)
        .where(_CHUNK.run_pk == run.id, _CHUNK.try_number == latest.scalar_subquery())
        .order_by(_CHUNK.seq)
    )
    chunks = [(position, bytes(data)) for position, data in rows.all()]
    if chunks:
        text = assemble(chunks)
    elif run.log_path and await anyio.Path(run.log_path).is_file():
        text = await anyio.Path(run.log_path).read_text(errors="replace")
    else:
        return _empty(run, _unshipped(run))
    return RunLog(text) if text else _empty(run, Empty.NO_OUTPUT)


def assemble(chunks: Iterable[tuple[int, bytes]]) -> str:
    """The text of a try's chunks, each ``(position, data)`` in order: a gap between two is a
    line saying how much was cut there (the rest of a line cut in two goes with it)."""
    parts: list[str] = []
    piece = bytearray()
    end = 0
    for position, data in chunks:
        gap = position - end
        end = position + len(data)
        if gap > 0:
            text = piece.decode(errors="replace")
            piece.clear()
            cut, data = _whole_lines(gap, data)
            parts.append(text if not text or text.endswith("\n") else text + "\n")
            parts.append(cut_line(cut))
        piece += data
    parts.append(piece.decode(errors="replace"))
    return "".join(parts)


def cut_line(size: int) -> str:
    """The line that stands for ``size`` bytes of a log the size cap cut."""
    return (
        f"[triggerer: {_size(size)} of this log cut here: the store keeps the start and the end "
        "of a run's log, [runs] log_max_bytes in all]\n"
    )


def _whole_lines(cut: int, data: bytes) -> tuple[int, bytes]:
    """``data`` from its first whole line on (what precedes a cut ends a line the cut began),
    and the bytes cut with that part."""
    newline = data.find(b"\n")
    if newline < 0 or newline == len(data) - 1:
        return cut, data
    return cut + newline + 1, data[newline + 1 :]


def _size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def _unshipped(run: models.Run) -> Empty:
    """Why a run has no chunk at all."""
    if run.state == RunState.QUEUED:  # (one stopped by a shutdown is queued to start again)
        return Empty.NOT_STARTED
    if run.state == RunState.CANCELLED and run.try_number == 0:  # never claimed, or requeued
        return Empty.CANCELLED_BEFORE_START
    if run.state in (RunState.RUNNING, RunState.CANCELLING):
        return Empty.NO_OUTPUT_YET
    return Empty.NOT_KEPT


def _empty(run: models.Run, empty: Empty) -> RunLog:
    return RunLog("", empty, _reasons(run)[empty])


def _reasons(run: models.Run) -> dict[Empty, str]:
    """Each reason in a sentence: ASCII on one line (the API sends it in a header)."""
    see_error = "; see its error" if run.error else ""
    path = "" if run.log_path is None else f" ({_ascii(run.log_path)})"
    return {
        Empty.NOT_STARTED: "the run has not started yet: it is queued",
        Empty.CANCELLED_BEFORE_START: "the run was cancelled before it started",
        Empty.NO_OUTPUT_YET: "the run has printed nothing yet",
        Empty.NO_OUTPUT: (
            "its last try printed nothing; it will be tried again"
            if run.state == RunState.UP_FOR_RETRY
            else f"the run printed nothing{see_error}"
        ),
        Empty.NOT_KEPT: (
            "the store holds no log of this run: it ran before the store kept runs' logs, or "
            "its daemon stopped before shipping any; the daemon that ran it may still have "
            f"its file{path}"
        ),
    }


def _ascii(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode().replace("\n", "\\n")
