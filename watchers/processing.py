"""What the queue triggers do to a message before it becomes an event (its bytes decoded by
``value_format`` and the CloudEvent it is found, then ``filter``, ``apply_function``,
``partition_key_path`` on its payload), what they count of it, and the check of their integer
options."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from triggerer.cloudevents import CloudEvent, MalformedCloudEvent
from triggerer.triggers import BaseEventTrigger, check_json
from watchers.cloudevents import BODY, Binding, Headers
from watchers.filters import PayloadFilter, lookup, parse_path
from watchers.payloads import decode_body, import_callable
from watchers.schemas.decoding import BodyFormat, Decoded, Undecodable

Prepared = tuple[Any, str | None] | None
"""A payload and its partition key, ready for an event; ``None`` when the message is dropped."""

UNREADABLE = (Undecodable, MalformedCloudEvent)
"""What :meth:`Processing.decoded` raises for a message that is a dead letter at once, since
reading it again fails again: bytes its ``value_format`` cannot decode, a malformed CloudEvent
(both are ``ValueError``)."""

ADDED_LATER: dict[str, Any] = {"added_later": True}
"""The metadata of a dataclass trigger's option added after triggers were stored (``value_format``,
``schema_registry``): :func:`without_later_defaults` leaves it out of ``serialize()`` while it
holds its default, so a stored trigger keeps its key (and the checkpoints and dedup keys under
it)."""


LATER_DEFAULTS: dict[str, Any] = {"value_format": "json", "schema_registry": None}
"""The options added later to the queue triggers that are not dataclasses (those sharing a
reader, :class:`~watchers.shared_readers.SharedReaderTrigger`), and their defaults: left out of
``serialize()`` while they hold them, as :data:`ADDED_LATER` says for the dataclass triggers."""


def without_later_defaults(trigger: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` (a dataclass ``trigger``'s ``serialize()``) without its options marked
    :data:`ADDED_LATER` that hold their defaults."""
    for field in dataclasses.fields(trigger):
        if field.metadata.get("added_later") and kwargs.get(field.name) == field.default:
            del kwargs[field.name]
    return kwargs


class LaterOptionsTrigger(BaseEventTrigger):
    """A dataclass trigger some of whose options were added after triggers were stored: they
    are left out of ``serialize()`` while they hold their defaults (:data:`ADDED_LATER`)."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath, kwargs = super().serialize()
        return classpath, without_later_defaults(self, kwargs)


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class CountingTrigger(LaterOptionsTrigger):
    """A dataclass trigger that counts what became of its messages (its tests and logs read
    the counts): messages received, events yielded, messages dropped by ``filter`` or the
    function. A provider adds counters of its own."""

    messages: int = dataclasses.field(default=0, init=False)
    events: int = dataclasses.field(default=0, init=False)
    filtered: int = dataclasses.field(default=0, init=False)


class ProcessingOptions(Protocol):
    """A trigger's options that :meth:`Processing.of_trigger` reads."""

    filter: dict[str, Any] | None
    apply_function: str | None
    partition_key_path: str | None
    value_format: str
    schema_registry: str | None


@dataclasses.dataclass(frozen=True)
class Processing:
    """A trigger's steps from a message's payload to its event's payload and partition key.

    ``filter`` is checked on the payload; then ``apply_function``, the dotted path of a plain
    function, may replace it (``None`` drops the message, anything else must be JSON); then
    ``partition_key_path`` picks the partition key (text or integer) from what is left.
    ``option`` names the function's option in messages (SQS calls it ``transform``).
    Before all that, :meth:`decoded` decodes the message's bytes by :attr:`body_format`
    (``value_format`` and ``schema_registry``) and finds the CloudEvent it is: a provider
    awaits it to build the payload.

    The function is imported on first use: a trigger calls :meth:`load` when it starts to run,
    so that a path that does not import is the watcher's error, not each message's; so are the
    schema registry's settings.
    """

    filter: PayloadFilter | None = None
    apply_function: str | None = None
    partition_key_path: str | None = None
    option: str = "apply_function"
    body_format: BodyFormat = dataclasses.field(default_factory=BodyFormat)

    def __post_init__(self) -> None:
        if self.apply_function is not None and not (
            isinstance(self.apply_function, str) and "." in self.apply_function.strip(".")
        ):
            raise ValueError(
                f"{self.option}={self.apply_function!r} must be a dotted path "
                "'package.module.function'"
            )
        if self.partition_key_path is not None:
            parse_path(self.partition_key_path)

    @classmethod
    def of_options(
        cls,
        *,
        filter: dict[str, Any] | None,
        apply_function: str | None,
        partition_key_path: str | None,
        option: str = "apply_function",
        value_format: str = "json",
        schema_registry: str | None = None,
    ) -> Processing:
        """From a trigger's options, checked: a bad one is a ``ValueError`` naming it."""
        return cls(
            filter=None if filter is None else PayloadFilter.from_option(filter),
            apply_function=apply_function,
            partition_key_path=partition_key_path,
            option=option,
            body_format=BodyFormat(value_format, schema_registry),
        )

    @classmethod
    def of_kwargs(cls, kwargs: Mapping[str, Any]) -> Processing:
        """From a trigger's keyword arguments (as given) of the names
        :class:`ProcessingOptions` lists, checked."""
        return cls.of_options(**{name: kwargs[name] for name in ProcessingOptions.__annotations__})

    @classmethod
    def of_trigger(cls, trigger: ProcessingOptions) -> Processing:
        """From a dataclass trigger's options of the same names, checked."""
        return cls.of_options(
            filter=trigger.filter,
            apply_function=trigger.apply_function,
            partition_key_path=trigger.partition_key_path,
            value_format=trigger.value_format,
            schema_registry=trigger.schema_registry,
        )

    def load(self) -> None:
        """Import ``apply_function`` now: ``ImportError`` when it does not import, ``TypeError``
        when it is not callable, ``ValueError`` when it is async; read the schema registry's
        connection (:meth:`BodyFormat.load`)."""
        self._function  # noqa: B018 - the cached import is the point
        self.body_format.load()

    async def decoded(
        self,
        payload: dict[str, Any],
        raw: bytes | None,
        binding: Binding = BODY,
        headers: Headers = (),
        content_type: str | None = None,
        field: str = "body",
    ) -> tuple[dict[str, Any], CloudEvent | None]:
        """``payload`` (built with its bytes as ``value_format="json"`` gives them) with
        ``field`` holding ``raw`` decoded by :attr:`body_format` and ``schema_id`` beside it
        (``payload`` itself for JSON), and the CloudEvent the message is by its transport's
        ``binding``, its ``headers`` and ``content_type`` (``None``: it is none), as
        :meth:`read` gives them. Raises what :meth:`read` raises: an :data:`UNREADABLE`
        message is the provider's dead letter, with ``payload`` as it was."""
        if self.body_format.plain:  # the payload holds the bytes as JSON already
            return payload, binding.recognise(headers, raw, content_type)
        decoded, cloudevent = await self.read(raw, binding, headers, content_type)
        payload = {**payload, field: decoded.value}
        if decoded.schema_id is not None:
            payload["schema_id"] = decoded.schema_id
        return payload, cloudevent

    async def read(
        self,
        raw: bytes | None,
        binding: Binding = BODY,
        headers: Headers = (),
        content_type: str | None = None,
    ) -> tuple[Decoded, CloudEvent | None]:
        """A message's bytes decoded by :attr:`body_format`, and the CloudEvent the message is
        (:mod:`watchers.cloudevents`), if any.

        A CloudEvent in structured mode is found in the bytes as they are: they are the event
        in JSON (a registry's record never is), so they are decoded as JSON whatever
        ``value_format`` says. In binary mode the bytes are its data: with a registry's
        ``value_format``, the record decoded is the event's data (checked first, so a malformed
        event costs no schema's fetch). Raises
        :class:`~triggerer.cloudevents.MalformedCloudEvent`, and what
        :meth:`BodyFormat.decode` raises."""
        if self.body_format.plain:
            return Decoded(decode_body(raw)), binding.recognise(headers, raw, content_type)
        found = binding.found(headers, raw, content_type)
        if isinstance(found, CloudEvent):
            return Decoded(decode_body(raw)), found
        binary = None if found is None else found.event(None)
        decoded = await self.body_format.decode(raw)
        if binary is None:
            return decoded, None
        return decoded, dataclasses.replace(binary, data=decoded.value)

    def prepare(self, payload: Any) -> Prepared:
        """The event's payload and partition key of ``payload``; ``None`` when dropped. Raises
        what the function raises, a ``TypeError`` when it returns what is not JSON, and a
        ``ValueError`` when the partition key path leads to no text or integer."""
        if self.filter is not None and not self.filter.matches(payload):
            return None
        function = self._function
        if function is not None:
            payload = function(payload)
            if payload is None:
                return None
            check_json(payload, f"{self.option} result")
        return payload, self.partition_key(payload)

    def partition_key(self, payload: Any) -> str | None:
        """The text or integer at ``partition_key_path`` in ``payload``, as text."""
        path = self.partition_key_path
        if path is None:
            return None
        value = lookup(payload, path)
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise ValueError(f"partition_key_path {path!r} does not lead to a text or integer value")

    @functools.cached_property
    def _function(self) -> Callable[[Any], Any] | None:
        if self.apply_function is None:
            return None
        function = import_callable(self.apply_function, option=self.option)
        if inspect.iscoroutinefunction(function):
            raise ValueError(
                f"{self.option}={self.apply_function!r} must be a plain function, not async"
            )
        return function


def check_range(option: str, value: object, low: int, high: int | None = None) -> None:
    """A ``ValueError`` naming ``option`` unless ``value`` is an integer from ``low`` to
    ``high`` (no upper bound when ``None``); booleans are not integers here."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f">= {low}" if high is None else f"from {low} to {high}"
        raise ValueError(f"{option}={value!r} must be an integer {bounds}")
