"""``MessageQueueTrigger``: one entry point that picks the queue trigger from a URI."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from triggerer.triggers import BaseEventTrigger, UnusableTrigger
from watchers import providers


def MessageQueueTrigger(queue: str, **options: Any) -> BaseEventTrigger:
    """The trigger for the queue at ``queue``; ``options`` go to that trigger.

    The URI's scheme picks the provider (:mod:`watchers.providers`):
    ``kafka://host:port[,host:port]/topic[,topic]`` gives a ``KafkaTrigger``;
    ``sqs://name?region=..&endpoint_url=..`` or ``https://sqs.<region>.amazonaws.com/<acct>/<name>``
    an ``SqsTrigger``; ``kinesis://``, ``nats://``, ``redis+stream://``, ``redis+pubsub://``,
    ``amqp://``, ``pubsub://`` and ``mqtt://`` the other built-in providers' (docs/architecture.md
    gives each form); other schemes come from the ``triggerer.queue_providers`` entry points.
    The result is the concrete trigger, so its ``serialize()`` names the concrete class.

    A URI or an option the provider refuses gives an :class:`UnusableTrigger` holding the
    error, which names the value: the daemon fails that watcher alone with it.
    """
    try:
        return _trigger(queue, options)
    # ImportError: an option naming a function (apply_function) that cannot be imported.
    except (ValueError, TypeError, ImportError) as error:
        return UnusableTrigger(source=_hidden(queue), error=_hidden(str(error)))


_USERINFO = re.compile(r"(?<=://)[^/?#@\s'\"]*@")


def _hidden(text: str) -> str:
    """``text`` with the user part of every URI in it (a password, a token) shown as ``***``:
    the error is logged and shown as its watcher's, and ``source`` is stored."""
    return _USERINFO.sub("***@", text)


def _trigger(queue: str, options: dict[str, Any]) -> BaseEventTrigger:
    scheme = urllib.parse.urlsplit(queue).scheme.lower()
    provider = providers.for_scheme(scheme)
    if provider is None:
        raise ValueError(
            f"queue {queue!r} has no supported scheme; supported: "
            f"{', '.join(providers.schemes())} (e.g. kafka://host:port/topic or "
            "sqs://queue-name?region=..)"
        )
    trigger = provider.trigger(queue, **options)
    if not isinstance(trigger, BaseEventTrigger):
        raise TypeError(
            f"queue provider {provider.name!r} returned {trigger!r} for {queue!r}, "
            "not a BaseEventTrigger"
        )
    return trigger
