"""The daemon's heap, frozen once it has started: what the cyclic garbage collector leaves alone.

A started daemon holds a quarter of a million objects that live as long as it does (the modules
of SQLAlchemy, pydantic, the brokers' clients and the API, the pipelines, the registry and the
watchers). CPython's full collection walks every one of them, and its idle work (a Kafka fetch
twice a second, the heartbeat) allocates enough to run one every half minute or so: 0.15 s of CPU
each with 300 Kafka watchers, a third of what the daemon spent of its own at idle, and a pause
of the event loop that grows with the heap. ``gc.freeze()`` moves the objects alive at the end of
the start out of the collector's reach, so a full collection walks only what came after.

An object frozen that later becomes unreachable in a reference cycle (a pipelines module
replaced by a reload) is not freed while the heap is frozen: what can be held so is bounded by
the heap at the start, as the heap is frozen once. ``gc.unfreeze()`` on the way out hands it all
back (a process that serves again, as the tests do, collects the last daemon's objects).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """Freeze the objects alive now for the duration of the ``with`` block."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
