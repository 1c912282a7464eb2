"""A literal filter on a JSON path of the payload, shared by the queue triggers."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

_STEP = re.compile(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]|\[\"([^\"]*)\"\]")
_MISSING = object()


@dataclasses.dataclass(frozen=True)
class PayloadFilter:
    """Keep a payload whose value at ``path`` equals ``equals`` (or is one of ``one_of``).

    ``path`` is a small JSONPath subset: ``$``, ``.field``, ``[index]`` and ``["field"]``,
    for example ``$.value.type`` or ``$.body.items[0]["sku"]``. A missing path never matches.
    """

    path: str
    equals: Any = None
    one_of: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        parse_path(self.path)
        if self.equals is not None and self.one_of:
            raise ValueError(f"filter on {self.path!r}: give either 'equals' or 'one_of'")

    @classmethod
    def from_option(cls, option: dict[str, Any]) -> PayloadFilter:
        """Build from the trigger keyword ``filter={"path": ..., "equals": ...}``."""
        valid = (
            isinstance(option, dict)
            and set(option) in ({"path", "equals"}, {"path", "one_of"})
            and isinstance(option.get("one_of", []), list)
        )
        if not valid:
            raise ValueError(
                f"filter={option!r} must be a mapping with 'path' and either 'equals' (a value) "
                "or 'one_of' (a list of values)"
            )
        return cls(option["path"], option.get("equals"), tuple(option.get("one_of", ())))

    def matches(self, payload: Any) -> bool:
        value = lookup(payload, self.path)
        if value is _MISSING:
            return False
        candidates = self.one_of if self.one_of else (self.equals,)
        return any(_same_json(value, candidate) for candidate in candidates)


@functools.cache
def parse_path(path: str) -> tuple[str | int, ...]:
    """The steps of a JSON path; a malformed path is a ``ValueError`` naming it."""
    if not path.startswith("$"):
        raise ValueError(f"JSON path {path!r} must start with '$', e.g. '$.value.type'")
    steps: list[str | int] = []
    position = 1
    while position < len(path):
        match = _STEP.match(path, position)
        if match is None:
            raise ValueError(
                f"JSON path {path!r} is malformed at position {position}: "
                'use .field, [index] or ["field"] steps'
            )
        name, index, quoted = match.groups()
        steps.append(int(index) if index is not None else (name if name is not None else quoted))
        position = match.end()
    return tuple(steps)


def lookup(payload: Any, path: str) -> Any:
    """The value at ``path`` in ``payload``, or a private missing marker."""
    value = payload
    for step in parse_path(path):
        in_list = (
            isinstance(value, list) and isinstance(step, int) and -len(value) <= step < len(value)
        )
        in_dict = isinstance(value, dict) and step in value
        if not (in_list or in_dict):
            return _MISSING
        value = value[step]
    return value


def _same_json(left: Any, right: Any) -> bool:
    # Python's 1 == True would make a filter on 1 match JSON true; JSON keeps them apart.
    return isinstance(left, bool) == isinstance(right, bool) and bool(left == right)
