"""The deletes of a queue's session: acked messages go in ``DeleteMessageBatch`` calls of ten.

Acks arriving within ``DELETE_WINDOW_S`` of each other share a call, and a full batch goes at
once; a few calls run at a time. Entries the service failed on its side are retried with backoff;
one whose receipt handle expired is left to SQS, which redelivers it (its dedup key keeps a second
event out).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from triggerer.backoff import backoff_s
from watchers.sqs.client import MAX_MESSAGES, RETRY_MAX_S

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from watchers.sqs.client import QueueClient
    from watchers.sqs.in_flight import InFlight, InFlightMessages

DELETE_WINDOW_S = 0.005  # acks arriving within this window share one DeleteMessageBatch


class BatchedDeletes:
    """Messages acked and not deleted yet, and the delete calls on their way."""

    def __init__(
        self,
        client: QueueClient,
        in_flight: InFlightMessages,
        log: FilteringBoundLogger,
        *,
        concurrency: int,
        counted: Callable[[int], None],
        batch_done: Callable[[asyncio.Task[None]], None],
    ) -> None:
        """``counted`` is told how many messages each call deleted, and ``batch_done`` is
        given each finished call's task (to report its error)."""
        self._client = client
        self._in_flight = in_flight
        self._log = log
        self._counted = counted
        self._batch_done = batch_done
        self._pending: list[InFlight] = []
        self._ready = asyncio.Event()
        self._full = asyncio.Event()
        #: How many delete calls may run at once.
        self.concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        #: The delete calls on their way.
        self.tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, entry: InFlight) -> None:
        """Delete ``entry`` with the next batch."""
        entry.acked = True
        self._pending.append(entry)
        self._ready.set()
        if len(self._pending) >= MAX_MESSAGES:
            self._full.set()

    async def send_batches(self) -> None:
        """Send a batch once it is full or its window has passed, while a slot is free."""
        while True:
            await self._ready.wait()
            if len(self._pending) < MAX_MESSAGES:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(DELETE_WINDOW_S):
                        await self._full.wait()
            await self._slots.acquire()
            batch = self._take()
            task = asyncio.create_task(self._delete(batch), name="sqs-delete-batch")
            self.tasks.add(task)
            task.add_done_callback(self._done)

    async def flush(self) -> None:
        """Delete everything acked so far: wait for the running batches, then send the rest."""
        while self.tasks or self._pending:
            if self.tasks:
                await asyncio.wait(list(self.tasks))
            batch = self._take()
            if batch:
                await self._delete(batch)

    def _take(self) -> list[InFlight]:
        batch = self._pending[:MAX_MESSAGES]
        del self._pending[:MAX_MESSAGES]
        if len(self._pending) < MAX_MESSAGES:
            self._full.clear()
        if not self._pending:
            self._ready.clear()
        return batch

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._slots.release()
        self._batch_done(task)

    async def _delete(self, batch: list[InFlight], *, attempt: int = 0) -> None:
        """Delete up to ten messages; entries that failed on the server side are retried."""
        entries = [
            {"Id": str(number), "ReceiptHandle": entry.receipt_handle}
            for number, entry in enumerate(batch)
        ]
        response = await self._client.call(
            "delete_message_batch", QueueUrl=self._client.queue_url, Entries=entries
        )
        retry = []
        for failure in response.get("Failed", []):
            entry = batch[int(failure["Id"])]
            if failure.get("SenderFault"):
                # The receipt handle expired: SQS redelivers the message and its dedup key
                # keeps a second event out.
                self._log.warning(
                    "sqs_delete_rejected",
                    message_id=entry.message_id,
                    code=failure.get("Code"),
                    error=failure.get("Message"),
                )
                self._in_flight.forget(entry)
            else:
                retry.append(entry)
        done = len(batch) - len(retry)
        self._counted(len(response.get("Successful", [])))
        for entry in batch:
            if entry not in retry:
                self._in_flight.forget(entry)
        if retry:
            delay_s = backoff_s(attempt + 1, RETRY_MAX_S)
            self._log.warning(
                "sqs_delete_retrying", failed=len(retry), deleted=done, retry_in_s=delay_s
            )
            await asyncio.sleep(delay_s)
            await self._delete(retry, attempt=attempt + 1)
