"""Events the store cannot hold: found before writing or from the database's refusal, and kept
as dead letters so that their messages can be acked instead of holding back every event after
them.

What is cheap to check is checked before writing (:func:`unstorable`), so that SQLite (which
enforces no string length and stores NUL characters) and PostgreSQL (which enforces lengths and
cannot store NUL in JSON or text) treat an event alike. The rest only the database can tell:
:func:`triggerer.service.store.failures.is_rejection` tells its refusal of the data apart from a
failure to write (a lost connection, a lock), which is retried instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.service.store.engine import json_text
from triggerer.service.store.models import ID_LENGTH, NAME_LENGTH, DeadLetter
from triggerer.service.store.types import storable_text

if TYPE_CHECKING:
    from triggerer.service.events import NewEvent

DEDUP_KEY_MAX_BYTES = 2600
"""Longest dedup key in UTF-8 bytes: ``(asset, dedup key)`` is a unique index, and PostgreSQL
indexes at most 2704 bytes a row (header and asset id included) when the key does not
compress."""

_DEAD_LETTERS: Table = DeadLetter.__table__  # type: ignore[assignment]  # a Table for models
_NUL = "\x00"
_NUL_ESCAPE = "\\u0000"  # how JSON text writes a NUL character
_CUT_KEY_CHARS = 500
"""Characters kept of a dead letter's dedup key too long for the dead-letter table's index."""


@dataclasses.dataclass(frozen=True, slots=True)
class Unstorable:
    """An event the store cannot hold, and why."""

    event: NewEvent
    reason: str


def unstorable(event: NewEvent) -> str | None:
    """Why the store cannot hold ``event``, as far as it can be told without writing it; else
    ``None``.

    A dedup key holds at most ``NAME_LENGTH`` characters (and ``DEDUP_KEY_MAX_BYTES`` bytes),
    a partition key ``ID_LENGTH``; neither may hold a NUL character or a lone surrogate, and
    neither may the extra, which must encode as JSON.
    """
    keys = (
        ("dedup key", event.dedup_key, NAME_LENGTH, DEDUP_KEY_MAX_BYTES),
        ("partition key", event.partition_key, ID_LENGTH, None),
    )
    for name, key, max_chars, max_bytes in keys:
        if key is not None and (problem := _key_problem(key, max_chars, max_bytes)):
            return f"{name} {problem}"
    try:
        text = json_text(event.extra)
    except (msgspec.EncodeError, TypeError, ValueError) as error:
        return f"payload is not storable as JSON: {error}"
    if _NUL_ESCAPE in text and (path := _nul_path(event.extra, "$")) is not None:
        return f"{path} holds a NUL character (U+0000), which the store cannot hold"
    return None


def rejection_reason(error: DBAPIError) -> str:
    """The database's message for ``error``, on one line, with its detail and SQLSTATE."""
    reason = " ".join(str(error.orig).split())
    detail = getattr(error.orig, "detail", None)  # asyncpg keeps it out of the message
    if isinstance(detail, str) and detail and detail not in reason:
        reason = f"{reason}: {detail}"
    sqlstate = getattr(error.orig, "sqlstate", None)
    return f"{reason} (SQLSTATE {sqlstate})" if sqlstate else reason


async def record_dead_letters(session: AsyncSession, letters: Sequence[Unstorable]) -> int:
    """Insert a dead letter for each of ``letters``; the number inserted. The caller commits.

    A letter whose ``(asset, dedup key)`` has one already is skipped, so a redelivered message
    is one dead letter. Every value is made storable: NUL characters and lone surrogates are
    written as backslash escapes, a dedup key too long for the index is cut and ends with a
    digest of the whole, and a payload that is not JSON is kept as its ``repr``.
    """
    if not letters:
        return 0
    rows = [
        {
            "asset_id": letter.event.asset_id,
            "trigger_id": letter.event.source_trigger_id,
            "source": letter.event.source,
            "dedup_key": _dead_letter_key(letter.event.dedup_key),
            "partition_key": (
                None
                if letter.event.partition_key is None
                else storable_text(letter.event.partition_key)
            ),
            "payload": _payload_text(letter.event.extra),
            "reason": storable_text(letter.reason),
        }
        for letter in letters
    ]
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(_DEAD_LETTERS).on_conflict_do_nothing()
    inserted = await session.execute(statement.returning(_DEAD_LETTERS.c.id), rows)
    return len(inserted.all())


def _key_problem(key: Any, max_chars: int, max_bytes: int | None) -> str | None:
    if not isinstance(key, str):
        return f"must be text, got {type(key).__name__} {key!r}"
    if len(key) > max_chars:
        return f"is {len(key)} characters long; the store holds at most {max_chars}"
    if _NUL in key:
        return "holds a NUL character (U+0000), which the store cannot hold"
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        return "is not valid Unicode text: it holds a lone surrogate"
    if max_bytes is not None and size > max_bytes:
        return f"is {size} bytes long in UTF-8; the store indexes at most {max_bytes}"
    return None


def _nul_path(value: Any, path: str) -> str | None:
    """The JSON path of the first string or key in ``value`` that holds a NUL character."""
    if isinstance(value, str):
        return path if _NUL in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            child = f"{path}.{key}" if str(key).isidentifier() else f"{path}[{json.dumps(key)}]"
            if isinstance(key, str) and _NUL in key:
                return child
            if (found := _nul_path(item, child)) is not None:
                return found
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if (found := _nul_path(item, f"{path}[{index}]")) is not None:
                return found
    return None


def _dead_letter_key(key: Any) -> str | None:
    if key is None:
        return None
    text = storable_text(str(key))
    if len(text) <= NAME_LENGTH and len(text.encode()) <= DEDUP_KEY_MAX_BYTES:
        return text
    # Cut to fit the unique index; the digest of the whole keeps different keys apart.
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"{text[:_CUT_KEY_CHARS]}…sha256:{digest}"


def _payload_text(extra: Any) -> str:
    try:
        return json_text(extra)  # writes a NUL character as the escape \u0000
    except (msgspec.EncodeError, TypeError, ValueError):
        return storable_text(repr(extra))
