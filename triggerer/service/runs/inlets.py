"""Inlet events for a run, served by the daemon so that the run holds no database credential.

A try of a pipeline with inlets gets a Unix socket of its own, in a folder only the daemon's
user may enter, for as long as the try runs (its path is in the run's spec). The run asks there
when it first reads an inlet: one request per connection, a line naming the asset (or the
alias), answered with the asset's events (the events emitted through the alias), oldest first
(:class:`~triggerer.service.runs.spec.InletAnswer`). Only the pipeline's inlets are answered.
Runs are always processes on the daemon's host (a Spark driver runs in client mode), so a local
socket reaches every one of them.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream
from sqlalchemy import select
from sqlalchemy.orm import aliased

from triggerer.assets import Asset
from triggerer.service.runs.spec import InletAnswer, InletRequest, SpecAsset, SpecEvent
from triggerer.service.store import models
from triggerer.service.store.failures import STORE_ERRORS

if TYPE_CHECKING:
    from anyio.abc import SocketStream
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from triggerer.assets import AssetAlias

log = structlog.get_logger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
"""An asset's name and URI together are far below this; a longer line is not a request."""


@asynccontextmanager
async def serving(
    sessions: async_sessionmaker[AsyncSession] | None,
    inlets: Sequence[Asset | AssetAlias],
    unavailable: str = "",
) -> AsyncIterator[str]:
    """Serve the events of ``inlets`` for the body of ``async with``; yields the socket's path.
    Without ``sessions`` (``pipelines test`` with no store to read), the answer for every inlet
    is the error ``unavailable``, which the run raises when it reads one."""
    # mkdtemp makes the folder mode 0700: another user cannot reach the socket in it. /tmp
    # rather than the run's folder, since a socket's path is limited to 107 bytes.
    folder = Path(await anyio.to_thread.run_sync(partial(tempfile.mkdtemp, prefix="triggerer-")))
    try:
        path = folder / "inlets.sock"
        listener = await anyio.create_unix_listener(path)
        known = {_request(inlet) for inlet in inlets}
        answer = partial(_answer, sessions, known, unavailable)
        async with listener, anyio.create_task_group() as serving:
            serving.start_soon(listener.serve, answer)
            yield str(path)
            serving.cancel_scope.cancel()
    finally:
        await anyio.to_thread.run_sync(shutil.rmtree, folder, True)


def _request(inlet: Asset | AssetAlias) -> InletRequest:
    """The request a run makes for ``inlet``'s events."""
    return InletRequest(inlet.name, inlet.uri if isinstance(inlet, Asset) else None)


async def _answer(
    sessions: async_sessionmaker[AsyncSession] | None,
    inlets: set[InletRequest],
    unavailable: str,
    stream: SocketStream,
) -> None:
    async with stream:
        try:
            request = BufferedByteReceiveStream(stream)
            answer = await _answer_to(sessions, inlets, unavailable, request)
            if answer is not None:
                # A large answer is encoded off the event loop: ingest goes on meanwhile.
                await stream.send(await anyio.to_thread.run_sync(msgspec.json.encode, answer))
        # The run went away before its answer (timed out, cancelled, or it closed the socket):
        # there is no one left to answer.
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as error:
            log.info("inlet_request_dropped", error=repr(error))


async def _answer_to(
    sessions: async_sessionmaker[AsyncSession] | None,
    inlets: set[InletRequest],
    unavailable: str,
    request: BufferedByteReceiveStream,
) -> InletAnswer | None:
    """The answer to the request on ``request``; ``None`` when it is no request at all."""
    try:
        inlet = msgspec.json.decode(
            await request.receive_until(b"\n", MAX_REQUEST_BYTES), type=InletRequest
        )
    except (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound):
        return None  # not a run of ours asking: nothing to answer
    except msgspec.DecodeError as error:
        return InletAnswer(error=f"not an inlet request: {error}")
    if inlet not in inlets:
        named = f"alias {inlet.name!r}" if inlet.uri is None else f"{inlet.name!r} ({inlet.uri})"
        return InletAnswer(error=f"{named} is not an inlet of this pipeline")
    if sessions is None:
        return InletAnswer(error=unavailable)
    try:
        return InletAnswer(events=await _events(sessions, inlet))
    except STORE_ERRORS as error:
        log.warning("inlet_events_failed", inlet=inlet.name, error=str(error).splitlines()[0])
        return InletAnswer(error=f"the metadata database did not answer: {error}")


async def _events(
    sessions: async_sessionmaker[AsyncSession], inlet: InletRequest
) -> list[SpecEvent]:
    """The events of an inlet asset, or those emitted through an inlet alias, oldest first."""
    producer = aliased(models.Run)
    query = (
        select(models.AssetEvent, models.Asset.name, models.Asset.uri, producer.run_id)
        .join(models.Asset, models.Asset.id == models.AssetEvent.asset_id)
        .outerjoin(producer, producer.id == models.AssetEvent.source_run_pk)
        .order_by(models.AssetEvent.id)
    )
    if inlet.uri is not None:
        query = query.where(models.Asset.name == inlet.name, models.Asset.uri == inlet.uri)
    else:
        query = (
            query.join(
                models.AssetEventAlias, models.AssetEventAlias.event_id == models.AssetEvent.id
            )
            .join(models.AssetAlias, models.AssetAlias.id == models.AssetEventAlias.alias_id)
            .where(models.AssetAlias.name == inlet.name)
        )
    async with sessions() as session:
        rows = await session.execute(query)
        return [
            SpecEvent(
                id=event.id,
                asset=SpecAsset(name, uri),
                extra=event.extra,
                timestamp=event.timestamp,
                source=event.source,
                partition_key=event.partition_key,
                source_run_id=source_run_id,
            )
            for event, name, uri, source_run_id in rows.all()
        ]
