"""Events POSTed at about the same time are committed in one transaction: a group commit.

A transaction per request would hold the API to the commits the database makes per second
(about 150 on SQLite, where concurrent writers also queue for its one lock). Instead a request
hands its event over and waits; one writer task at a time commits all that is waiting in one
transaction, answers each request, and goes on while more came meanwhile. Alone, a request
costs what it did; under load, batches grow with the load.

Each request still gets its own answer: an unknown asset, an asset the caller may not emit to
(an emitter's globs, checked against the name and URI the batch reads anyway) or a refused
value fails that request alone; when the store refuses a batch, each event is written on its
own to find out whose; a store that does not answer fails every request of the batch (503,
nothing committed). Each event created is a row of the audit log naming its caller, the rows
of a batch written in one statement in the batch's transaction. A post with a dedup key (a
CloudEvent's) stored already on its asset stores nothing, and writes no audit row: its request
gets :class:`AlreadyStored`, with the event stored before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, cast

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.schedules import PartitionedAssetTimetable
from triggerer.service import actions, audit
from triggerer.service.api.schemas import CreatedEvent, NewAssetEvent
from triggerer.service.errors import Forbidden, NotFound, Refused
from triggerer.service.events import NewEvent, Recorded, record_events
from triggerer.service.reads import queries
from triggerer.service.store.failures import STORE_ERRORS, is_outage
from triggerer.service.store.notices import notify_queued
from triggerer.service.store.states import EventSource

if TYPE_CHECKING:
    from triggerer.service.principals import Principal
    from triggerer.service.scheduling.registry import Registry
    from triggerer.service.trace_context import TraceContext

MAX_BATCH = 500
"""Events per transaction at most; more waiting go in the next one."""
LINGER_S = 0.002
"""Under load, how long a batch waits for the clients just answered to post again."""


class AlreadyStored(Exception):  # an answer (200), not an error
    """A post's dedup key is stored already on its asset: ``event``, stored before."""

    def __init__(self, event: CreatedEvent) -> None:
        super().__init__(f"event {event.id} was stored before under the same key")
        self.event = event


@dataclasses.dataclass(eq=False)
class _Post:
    event: NewAssetEvent
    caller: Principal
    answer: asyncio.Future[CreatedEvent]
    trace: TraceContext | None = None
    dedup_key: str | None = None


class _Unmappable(Exception):  # not an error: rolls the transaction back
    """Some partition keys suit no consumer: those posts are answered; write the others."""

    def __init__(self, others: list[_Post]) -> None:
        self.others = others


class GroupCommit:
    """Creates events POSTed to ``/assets/events``, concurrent ones in one transaction."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        registry: Callable[[], Registry],
        events_recorded: Callable[[Recorded], None],
    ) -> None:
        self._sessions = sessions
        self._registry = registry
        self._events_recorded = events_recorded
        self._waiting: list[_Post] = []
        self._writer: asyncio.Task[None] | None = None
        self._posted = asyncio.Event()

    async def create(
        self,
        event: NewAssetEvent,
        caller: Principal,
        trace: TraceContext | None = None,
        *,
        dedup_key: str | None = None,
    ) -> CreatedEvent:
        """Create ``event`` once committed (``extra`` gains ``"from_rest_api": true``), with
        the trace context of its request, and queued for the pipelines scheduled on its
        asset, if ``caller`` may emit to it (else :class:`Forbidden`); the audit log names
        ``caller``. With ``dedup_key``, unless an event of its asset has that key (then
        :class:`AlreadyStored`, and no audit row)."""
        loop = asyncio.get_running_loop()
        post = _Post(event, caller, loop.create_future(), trace, dedup_key)
        self._waiting.append(post)
        self._posted.set()
        if self._writer is None:
            # A task of its own, not the request's: a request that is cancelled while its
            # batch commits cancels nothing else.
            self._writer = loop.create_task(self._write_all(), name="rest-group-commit")
        return await asyncio.shield(post.answer)

    async def _write_all(self) -> None:
        # Clients posting one event after another each have a post in the batch being written
        # or waiting for the next; while they keep coming, the next batch waits a moment for
        # all of them, so a transaction serves every client instead of every other one.
        clients = 0
        try:
            while True:
                if len(self._waiting) < clients:
                    await self._gather(clients)
                if not self._waiting:
                    break
                batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
                await self._commit(batch)
                clients = len(batch) + len(self._waiting)
        finally:
            self._writer = None

    async def _gather(self, posts: int) -> None:
        """Wait until ``posts`` are waiting, or for :data:`LINGER_S` at most."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LINGER_S):
                while len(self._waiting) < posts:
                    self._posted.clear()
                    await self._posted.wait()

    async def _commit(self, posts: list[_Post]) -> None:
        # Requests are answered once the transaction has ended, never while it holds a
        # connection: a client that got its 404 may shut the store down next.
        refused: list[tuple[_Post, Exception]] = []
        try:
            answers, recorded = await self._write(posts, refused)
        except STORE_ERRORS as error:
            _fail(refused)
            if is_outage(error) or len(posts) == 1:
                _fail((post, error) for post in posts)
            else:
                # The store refused one of them: each alone, for its own answer.
                for post in posts:
                    if not post.answer.done():
                        await self._commit([post])
            return
        except Exception as error:  # noqa: BLE001  # a bug: each request answers 500
            _fail((post, error) for post in posts)
            return
        _fail(refused)
        self._events_recorded(recorded)
        for post, created in answers:
            if post.answer.done():  # its request may have been cancelled
                continue
            if isinstance(created, Exception):
                post.answer.set_exception(created)
            else:
                post.answer.set_result(created)

    async def _write(
        self, posts: list[_Post], refused: list[tuple[_Post, Exception]]
    ) -> tuple[list[tuple[_Post, CreatedEvent | Exception]], Recorded]:
        while True:
            try:
                async with self._sessions.begin() as session:
                    return await self._record(session, posts, refused)
            except _Unmappable as unmappable:
                posts = unmappable.others

    async def _record(
        self, session: AsyncSession, posts: list[_Post], refused: list[tuple[_Post, Exception]]
    ) -> tuple[list[tuple[_Post, CreatedEvent | Exception]], Recorded]:
        """Record the events of ``posts`` the user could have right; the others go to
        ``refused`` with the reason."""
        named = [(post.event.asset_id, post.event.uri) for post in posts]
        writing = []
        for post, found in zip(posts, await actions.find_assets(session, named), strict=True):
            try:
                if isinstance(found, Exception):
                    raise found
                post.caller.check_emit(found.name, found.uri)
                new = actions.new_event(
                    found.id,
                    {**post.event.extra, "from_rest_api": True},
                    source=EventSource.REST_API,
                    partition_key=post.event.partition_key,
                    dedup_key=post.dedup_key,
                    trace=post.trace,
                )
            except (NotFound, Forbidden, Refused) as error:
                refused.append((post, error))
                continue
            writing.append((post, new, found.uri))
        recorded = await record_events(session, [new for _, new, _ in writing])
        # The events stored are those given but the ones whose key was stored, in order.
        absorbed = {id(new) for new in recorded.absorbed}
        stored_before = [(post, new) for post, new, _ in writing if id(new) in absorbed]
        stored = [written for written in writing if id(written[1]) not in absorbed]
        queued_for = [recorded.queued.get(event.id, []) for event in recorded.events]
        unmappable = set()
        for (post, new, _), pipelines in zip(stored, queued_for, strict=True):
            reason = self._unmappable(new.partition_key, pipelines)
            if reason is not None:
                refused.append((post, Refused(reason)))
                unmappable.add(post)
        if unmappable:
            raise _Unmappable([post for post, _, _ in writing if post not in unmappable])
        await notify_queued(session, recorded.queued_pipelines)
        await audit.record_all(
            session,
            [
                actions.emitted(post.caller, uri, event, post.event.extra)
                for (post, _, uri), event in zip(stored, recorded.events, strict=True)
            ],
        )
        answers: list[tuple[_Post, CreatedEvent | Exception]] = [
            (post, await _stored_before(session, new)) for post, new in stored_before
        ]
        answers += [
            (
                post,
                CreatedEvent(
                    id=event.id,
                    asset_id=event.asset_id,
                    uri=uri,
                    source=event.source,
                    timestamp=event.timestamp,
                    partition_key=event.partition_key,
                    extra=event.extra,
                    source_run_id=None,
                    source_trigger_id=None,
                    queued_for=sorted(pipelines),
                ),
            )
            for (post, _, uri), event, pipelines in zip(
                stored, recorded.events, queued_for, strict=True
            )
        ]
        return answers, recorded

    def _unmappable(self, key: str | None, pipeline_ids: Sequence[str]) -> str | None:
        """Why a key the partition mapper of a consuming pipeline cannot map is refused (it
        would fail that pipeline's scheduling instead); None when every consumer can."""
        if key is None:
            return None
        loaded = self._registry().pipelines
        for pipeline_id in sorted(pipeline_ids):
            pipeline = loaded.get(pipeline_id)
            if pipeline is not None and isinstance(pipeline.schedule, PartitionedAssetTimetable):
                try:
                    pipeline.schedule.map_key(key)
                except ValueError as error:
                    return f"partition_key {key!r} does not suit pipeline {pipeline_id!r}: {error}"
        return None


async def _stored_before(session: AsyncSession, new: NewEvent) -> AlreadyStored | NotFound:
    """The answer to a post whose key the store holds already: the event stored under it."""
    key = cast("str", new.dedup_key)  # only an event with a key is absorbed
    stored = await queries.event_with_key(session, new.asset_id, key)
    if stored is None:  # deleted (retention) since its key kept this one out
        return NotFound(f"the event stored under the dedup key {key!r} is gone")
    return AlreadyStored(CreatedEvent(**stored.model_dump(), queued_for=[]))


def _fail(failures: Iterable[tuple[_Post, BaseException]]) -> None:
    for post, error in failures:
        if not post.answer.done():  # answered already, or its request was cancelled
            post.answer.set_exception(error)
