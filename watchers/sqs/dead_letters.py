"""Dead-lettering of a queue's session: a message its readers keep failing on is sent aside.

A failing message is left for redelivery until its ``max_receives``-th receive; then it is sent
to the dead-letter queue (``dead_letter_queue``, else the queue's RedrivePolicy target) with the
reason and the source queue in message attributes, and deleted like an acked one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from watchers.sqs.address import parse_queue

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from watchers.sqs.client import QueueClient

DEAD_LETTER_REASON_ATTRIBUTE = "triggerer_dead_letter_reason"
DEAD_LETTER_SOURCE_ATTRIBUTE = "triggerer_source_queue"
_MAX_MESSAGE_ATTRIBUTES = 10
_MAX_REASON_CHARS = 1_000


class DeadLetters:
    """Where and after how many receives a queue's failing messages are dead-lettered."""

    def __init__(
        self, client: QueueClient, log: FilteringBoundLogger, *, queue_name: str, max_receives: int
    ) -> None:
        self._client = client
        self._log = log
        self._queue_name = queue_name
        #: The dead-letter queue's URL; ``None``: failing messages stay in the queue.
        self.url: str | None = None
        #: The receive on which a failing message is dead-lettered.
        self.max_receives = max_receives

    async def resolve(self, dead_letter_queue: str | None, redrive_policy: str | None) -> None:
        """Use ``dead_letter_queue``, else the queue's redrive target (capping ``max_receives``)."""
        if dead_letter_queue is not None:
            target = parse_queue(dead_letter_queue)
            self.url = target.url or await self._client.queue_url_of(target.name)
            return
        if redrive_policy is None:
            return
        policy = json.loads(redrive_policy)
        *_, account, name = policy["deadLetterTargetArn"].split(":")
        self.url = await self._client.queue_url_of(name, account)
        redrive_receives = int(policy["maxReceiveCount"])
        if redrive_receives < self.max_receives:
            # SQS would move the message first, without our reason attribute.
            self._log.warning(
                "sqs_max_receives_lowered",
                max_receives=self.max_receives,
                redrive_max_receive_count=redrive_receives,
            )
            self.max_receives = redrive_receives

    async def dead_letter(self, message: dict[str, Any], error: Exception) -> bool:
        """Send ``message``, which a reader failed on with ``error``, to the dead-letter queue
        if this was its last receive; whether it was sent (if not, it is to be redelivered)."""
        reason = f"{type(error).__name__}: {error}"[:_MAX_REASON_CHARS]
        receives = int(message.get("Attributes", {}).get("ApproximateReceiveCount", 1))
        log = self._log.bind(message_id=message["MessageId"], reason=reason, receives=receives)
        if receives < self.max_receives:
            log.warning("sqs_message_failed", max_receives=self.max_receives)
            return False
        if self.url is None:
            log.error(
                "sqs_message_not_dead_lettered",
                why="no dead_letter_queue and no RedrivePolicy: it stays in the queue",
            )
            return False
        try:
            await self._client.call("send_message", **self._message(message, reason))
        except ClientError as send_error:
            log.error(
                "sqs_dead_letter_failed",
                error=str(send_error),
                why="it stays in the queue and is retried on its next receive",
            )
            return False
        log.error("sqs_message_dead_lettered", dead_letter_queue=self.url)
        return True

    def _message(self, message: dict[str, Any], reason: str) -> dict[str, Any]:
        ours = {
            DEAD_LETTER_REASON_ATTRIBUTE: {"DataType": "String", "StringValue": reason},
            DEAD_LETTER_SOURCE_ATTRIBUTE: {
                "DataType": "String",
                "StringValue": self._client.queue_url,
            },
        }
        theirs = list(message.get("MessageAttributes", {}).items())
        theirs = theirs[: _MAX_MESSAGE_ATTRIBUTES - len(ours)]
        arguments: dict[str, Any] = {
            "QueueUrl": self.url,
            "MessageBody": message.get("Body", ""),
            "MessageAttributes": {**dict(theirs), **ours},
        }
        if (self.url or "").endswith(".fifo"):
            attributes = message.get("Attributes", {})
            arguments["MessageGroupId"] = attributes.get("MessageGroupId", self._queue_name)
            arguments["MessageDeduplicationId"] = message["MessageId"]
        return arguments
