"""Airflow's ``MessageQueueTrigger`` (its common-messaging provider) as triggerer's: a queue
URI read by the provider of its scheme, with the Airflow options that have a meaning here
renamed to triggerer's, and the others refused by name."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Any

from triggerer.airflow.errors import NotSupported
from watchers.queue import MessageQueueTrigger as _queue_trigger

if TYPE_CHECKING:
    from triggerer.triggers import BaseEventTrigger

KAFKA_OPTIONS = {"kafka_config_id": "connection"}
"""Airflow's options of a ``kafka://`` queue with a triggerer meaning, and their names here."""

SQS_OPTIONS = {
    "aws_conn_id": "connection",
    "region_name": "region_name",
    "max_messages": "max_messages",
    "wait_time_seconds": "wait_time_s",
    "visibility_timeout": "visibility_timeout_s",
}
"""Airflow's options of an SQS queue with a triggerer meaning, and their names here."""

_WHY = {
    "apply_function": (
        "Airflow calls it with the broker's message object and triggers on what it returns; "
        "triggerer's apply_function takes the message's JSON payload and returns the event's "
        "(docs/providers/), so the same function would not work"
    ),
    "trigger_queue": "triggerer has no trigger queues: every daemon runs every watcher",
}


def MessageQueueTrigger(
    *, queue: str | None = None, scheme: str | None = None, **kwargs: Any
) -> BaseEventTrigger:
    """The trigger of an Airflow ``MessageQueueTrigger(queue=URI, ...)``, or of
    ``MessageQueueTrigger(scheme='sqs', sqs_queue=URL, ...)``: triggerer's own queue trigger
    for that URI (docs/architecture.md lists the schemes)."""
    if queue is None and scheme is None:
        raise ValueError("MessageQueueTrigger needs queue= (a queue URI) or scheme=")
    if queue is None:
        queue = _uri_of_scheme(str(scheme), kwargs)
    for name in ("apply_function", "trigger_queue"):
        if name in kwargs:
            raise NotSupported(f"MessageQueueTrigger({name}=...)", _WHY[name])
    uri_scheme = urllib.parse.urlsplit(queue).scheme.lower()
    if uri_scheme == "kafka":
        queue = _kafka_topics(queue, kwargs.pop("topics", None))
        renames = KAFKA_OPTIONS
    elif uri_scheme == "sqs" or (
        uri_scheme == "https" and urllib.parse.urlsplit(queue).netloc.startswith("sqs.")
    ):
        renames = SQS_OPTIONS
        if kwargs.pop("delete_message_on_reception", True) is not True:
            raise NotSupported(
                "MessageQueueTrigger(delete_message_on_reception=False)",
                "triggerer deletes a message once its event is stored",
            )
    else:
        renames = {}
    unknown = sorted(set(kwargs) - set(renames))
    if unknown:
        raise NotSupported(
            f"MessageQueueTrigger({', '.join(f'{name}=...' for name in unknown)}) of {queue!r}",
            "only the options listed in docs/from-airflow.md have a triggerer meaning",
        )
    return _queue_trigger(queue, **{renames[name]: value for name, value in kwargs.items()})


def _uri_of_scheme(scheme: str, kwargs: dict[str, Any]) -> str:
    """The queue URI of Airflow's ``scheme=`` form, where it names one."""
    if scheme == "sqs" and "sqs_queue" in kwargs:
        return str(kwargs.pop("sqs_queue"))
    raise NotSupported(
        f"MessageQueueTrigger(scheme={scheme!r})",
        "the scheme form reads the queue's address from an Airflow connection, which "
        "triggerer does not have; give the queue URI, e.g. "
        "MessageQueueTrigger(queue='kafka://HOST:9092/TOPIC') or "
        "MessageQueueTrigger(scheme='sqs', sqs_queue='https://sqs.REGION.amazonaws.com/ID/NAME')",
    )


def _kafka_topics(queue: str, topics: object) -> str:
    """A ``kafka://`` URI with Airflow's ``topics=`` in place of the URI's own, as Airflow
    reads it."""
    if topics is None:
        return queue
    if not isinstance(topics, (list, tuple)) or not all(isinstance(t, str) for t in topics):
        raise TypeError(f"MessageQueueTrigger(topics={topics!r}) must be a list of topic names")
    parts = urllib.parse.urlsplit(queue)
    return urllib.parse.urlunsplit(parts._replace(path="/" + ",".join(topics)))
