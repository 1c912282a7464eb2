"""What the provider benchmarks share: the message they send, and a trigger read as the daemon
reads it (each event acked as it comes)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from triggerer.triggers import BaseEventTrigger, TriggerEvent

MESSAGE_BYTES = 200


def order(index: int) -> str:
    """Order ``index`` as JSON of ``MESSAGE_BYTES`` characters."""
    head = json.dumps({"id": index, "type": "order", "pad": ""})
    return json.dumps({"id": index, "type": "order", "pad": "x" * (MESSAGE_BYTES - len(head))})


async def ack_each(
    trigger: BaseEventTrigger, messages: int, *, through_cleanup: bool = False
) -> float:
    """Seconds to read ``messages`` events off ``trigger``, acking each as it comes (markers
    that only carry a checkpoint are not messages); ``through_cleanup``: until its cleanup
    has ended too (where SQS flushes its deletes)."""
    # run() is an async generator; aclose() ends it before cleanup()
    events = cast(AsyncGenerator["TriggerEvent", None], trigger.run())
    started = time.perf_counter()
    done = 0
    try:
        async for event in events:
            if event.is_checkpoint_only:
                continue
            assert event.ack is not None
            await event.ack()
            done += 1
            if done == messages:
                break
        seconds = time.perf_counter() - started
    finally:
        await events.aclose()
        await trigger.cleanup()
    return time.perf_counter() - started if through_cleanup else seconds
