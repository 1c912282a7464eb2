"""Queue providers: what a kind of message queue brings to triggerer, behind one interface.

A :class:`Provider` names the URI schemes it reads (``MessageQueueTrigger(queue=URI)`` picks it
by the scheme), makes the trigger for a URI, and may bring :class:`SharedReaders`: what its
triggers share within one daemon (one Kafka consumer per cluster, one SQS poller per queue),
so that watchers of one source each see every message without splitting them. The daemon
talks only to this interface; the built-in providers live in :mod:`watchers`, others come from
the ``triggerer.queue_providers`` entry points.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from triggerer.triggers import BaseEventTrigger


class SharedReaders(abc.ABC):
    """What the triggers of one provider share in one daemon.

    The daemon makes it once at start (:attr:`Provider.shared`), runs every trigger within
    :meth:`sharing`, and after each load of the pipelines tells it which triggers run now.
    """

    @abc.abstractmethod
    def sharing(self) -> AbstractContextManager[None]:
        """Within it (and the tasks started in it), this provider's triggers read through these
        readers instead of opening their own."""

    @abc.abstractmethod
    def keep(self, triggers: Iterable[BaseEventTrigger]) -> None:
        """The daemon runs these triggers now (of every provider): forget what only triggers
        that are gone needed (a place kept for them, a message held until they read it)."""


@dataclasses.dataclass(frozen=True)
class Provider:
    """A kind of message queue."""

    name: str
    schemes: tuple[str, ...]
    """The URI schemes it reads: ``MessageQueueTrigger(queue=URI)`` picks it by them."""
    trigger: Callable[..., BaseEventTrigger]
    """``trigger(uri, **options)``: the trigger of the queue at ``uri``; a ``ValueError``
    naming the URI and its expected form when it is not one."""
    shared: Callable[[str], SharedReaders] | None = None
    """``shared(deployment)``: the readers its triggers share in one daemon, ``deployment``
    naming the metadata database the daemon's instances share (for consumer group names)."""
    send: Callable[..., Awaitable[list[str]]] | None = None
    """``await send(uri, bodies, connection=None)``: post each text of ``bodies`` as one message
    to the queue at ``uri`` (read with the named connection's credentials); the ids of the
    messages sent, in order; keyword options of its own may follow (Kafka's ``key``, SQS's
    ``region_name`` and ``endpoint_url``). ``triggerer post NAME ...`` calls it."""
