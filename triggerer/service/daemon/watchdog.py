"""The event-loop watchdog: a task that notices when the loop was kept from running.

Everything the daemon does shares one event loop, so code that blocks it (a blocking call, CPU
work that belongs in a thread or child process) stalls ingest, acks and heartbeats alike. The
watchdog sleeps a fixed interval and measures how late it wakes: that delay is how long the loop
was busy. Every delay is observed (``triggerer_event_loop_lag_seconds``); one past the threshold
is logged with its length and counted (``triggerer_event_loop_blocked_total``).
"""

from __future__ import annotations

import anyio
import structlog

from triggerer.service import metrics

log = structlog.get_logger(__name__)

INTERVAL_S = 0.25
"""A block of BLOCKED_AFTER_S + INTERVAL_S or more is always seen; a shorter one, past the
threshold, when it covers a wake-up."""
BLOCKED_AFTER_S = 0.5


async def watch_event_loop(
    interval_s: float = INTERVAL_S, blocked_after_s: float = BLOCKED_AFTER_S
) -> None:
    """Measure the event loop's lag until cancelled; log and count a blocked loop."""
    while True:
        before = anyio.current_time()
        await anyio.sleep(interval_s)
        late_s = max(0.0, anyio.current_time() - before - interval_s)
        metrics.EVENT_LOOP_LAG.observe(late_s)
        if late_s >= blocked_after_s:
            metrics.EVENT_LOOP_BLOCKED.inc()
            log.warning(
                "event_loop_blocked",
                blocked_s=round(late_s, 3),
                threshold_s=blocked_after_s,
                hint="something ran on the event loop without awaiting: blocking I/O or CPU "
                "work belongs in a thread or a child process",
            )
