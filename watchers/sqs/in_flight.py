"""The messages a queue's session holds, kept invisible until they are deleted or released.

A received message stays invisible to other consumers for the queue's visibility timeout; a
reader may take longer to store its events, so each held message is renewed when half of that is
used up. One that SQS will redeliver anyway (a failed renewal, a rejected delete) or that is left
to reappear is forgotten; at close, those never acked are made visible at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import TYPE_CHECKING, Any

from watchers.shared_readers import Held
from watchers.sqs.client import MAX_MESSAGES

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from watchers.sqs.client import QueueClient


@dataclasses.dataclass(eq=False)
class InFlight(Held):
    """A received message this process holds: extended until deleted or released. One to
    redeliver is left to reappear."""

    message_id: str
    receipt_handle: str
    visible_until: float  # time.monotonic() when SQS would make it visible again
    sent_at: float | None  # when SQS took it in (SentTimestamp), epoch seconds
    acked: bool = False  # being deleted


class InFlightMessages:
    """The held messages of one queue, by receipt handle, and the extension of their visibility."""

    def __init__(self, client: QueueClient, log: FilteringBoundLogger) -> None:
        self._client = client
        self._log = log
        self._held: dict[str, InFlight] = {}
        self._added = asyncio.Event()
        #: How long a receive hides a message, and each renewal; set when the session connects.
        self.visibility_timeout_s = 30

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, message: dict[str, Any], asked_at: float) -> InFlight:
        """Hold ``message``, received by a call sent at ``asked_at`` (``time.monotonic()``)."""
        entry = InFlight(
            message["MessageId"],
            message["ReceiptHandle"],
            asked_at + self.visibility_timeout_s,
            _sent_timestamp(message),
        )
        self._held[entry.receipt_handle] = entry
        self._added.set()
        return entry

    def forget(self, entry: InFlight) -> None:
        """Stop extending ``entry``: it is deleted, or SQS makes it visible again."""
        self._held.pop(entry.receipt_handle, None)

    async def keep_invisible(self) -> None:
        """Keep held messages invisible: renew each one when half its visibility is used up."""
        margin_s = self.visibility_timeout_s / 2
        while True:
            now = time.monotonic()
            due = [e for e in self._held.values() if e.visible_until - now <= margin_s]
            if not due:
                self._added.clear()
                next_due = min((e.visible_until for e in self._held.values()), default=None)
                timeout_s = None if next_due is None else next_due - margin_s - now
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout_s):
                        await self._added.wait()
                continue
            for start in range(0, len(due), MAX_MESSAGES):
                await self._change_visibility(
                    due[start : start + MAX_MESSAGES], self.visibility_timeout_s
                )

    async def release_unacked(self) -> None:
        """Make messages this process will never ack visible again at once."""
        unacked = [entry for entry in self._held.values() if not entry.acked]
        self._held.clear()
        for start in range(0, len(unacked), MAX_MESSAGES):
            await self._change_visibility(unacked[start : start + MAX_MESSAGES], 0)

    async def _change_visibility(self, batch: list[InFlight], timeout_s: int) -> None:
        sent_at = time.monotonic()
        response = await self._client.call(
            "change_message_visibility_batch",
            QueueUrl=self._client.queue_url,
            Entries=[
                {
                    "Id": str(number),
                    "ReceiptHandle": entry.receipt_handle,
                    "VisibilityTimeout": timeout_s,
                }
                for number, entry in enumerate(batch)
            ],
        )
        for entry in batch:
            entry.visible_until = sent_at + timeout_s
        for failure in response.get("Failed", []):
            entry = batch[int(failure["Id"])]
            if self._held.pop(entry.receipt_handle, None) is None:
                continue  # deleted while the call was on its way
            # Past the 12-hour limit, or the handle expired: SQS redelivers the message.
            self._log.warning(
                "sqs_visibility_change_failed",
                message_id=entry.message_id,
                code=failure.get("Code"),
                error=failure.get("Message"),
            )


def _sent_timestamp(message: dict[str, Any]) -> float | None:
    """When SQS took ``message`` in (its ``SentTimestamp`` attribute, milliseconds), as epoch
    seconds; ``None`` without one."""
    stamp = message.get("Attributes", {}).get("SentTimestamp")
    return int(stamp) / 1000 if isinstance(stamp, str) and stamp.isdecimal() else None
