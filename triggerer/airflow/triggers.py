"""Airflow's ``BaseEventTrigger`` for a custom trigger written for Airflow: triggerer's own,
with what Airflow's adds (``__init__(**kwargs)``, ``log``) and Airflow's way of running it
(a ``run()`` that ends is started again, on a trigger made anew from ``serialize()``)."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio

from triggerer.triggers import BaseEventTrigger as _EventTrigger
from triggerer.triggers import TriggerEvent

__all__ = ("BaseEventTrigger", "TriggerEvent")

RESTART_DELAY_S = 1.0
"""The pause before a trigger whose ``run()`` ended runs again."""


class BaseEventTrigger(_EventTrigger):
    """A trigger that watches an asset, written against Airflow's base class.

    Airflow starts a watcher's trigger again after its ``run()`` ends (having yielded its
    event); so does this class, on a trigger rebuilt from its ``serialize()`` kwargs. The
    classpath ``serialize()`` returns is replaced by the class's own, where triggerer imports
    it from (a class in a pipeline file has that file's module).
    """

    def __init__(self, **kwargs: Any) -> None:
        """Airflow's triggers take keyword arguments of their own and pass on the rest."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The subclass's own methods, wrapped in place: the class is Airflow's user's, written
        # against Airflow's base class, and mypy cannot see what it defines.
        if "run" in cls.__dict__:
            cls.run = _restarting(cls.__dict__["run"])  # type: ignore[method-assign,assignment]
        if "serialize" in cls.__dict__:
            cls.serialize = _own_classpath(cls.__dict__["serialize"])  # type: ignore[method-assign,assignment]

    @property
    def log(self) -> logging.Logger:
        return logging.getLogger(self.classpath())

    async def run(self) -> AsyncIterator[TriggerEvent]:
        raise NotImplementedError(f"{self.classpath()} must implement run()")
        yield  # an async generator, as every trigger's run


def _restarting(
    run: Callable[[Any], AsyncIterator[TriggerEvent]],
) -> Callable[[Any], AsyncIterator[TriggerEvent]]:
    @functools.wraps(run)
    async def run_again(self: BaseEventTrigger) -> AsyncIterator[TriggerEvent]:
        trigger = self
        while True:
            async for event in run(trigger):
                yield event
            await anyio.sleep(RESTART_DELAY_S)
            trigger = type(self)(**self.serialize()[1])

    return run_again


def _own_classpath(
    serialize: Callable[[Any], tuple[str, dict[str, Any]]],
) -> Callable[[Any], tuple[str, dict[str, Any]]]:
    @functools.wraps(serialize)
    def serialized(self: BaseEventTrigger) -> tuple[str, dict[str, Any]]:
        _, kwargs = serialize(self)
        return type(self).classpath(), kwargs

    return serialized
