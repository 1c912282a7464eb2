"""Column types shared by the metadata tables."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Dialect, Integer
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator, TypeEngine

BigId: TypeEngine[int] = BigInteger().with_variant(Integer(), "sqlite")
"""Key of the high-volume tables: 64-bit on PostgreSQL. SQLite autoincrements only a column
declared exactly ``INTEGER PRIMARY KEY`` (the rowid, 64-bit anyway), so it gets ``INTEGER``."""

Json: TypeEngine[Any] = JSON().with_variant(JSONB(), "postgresql")
"""JSON document; JSONB on PostgreSQL so it can be indexed and compared."""


def storable_text(text: str) -> str:
    """``text`` with what no store holds as backslash escapes: NUL as ``\\x00``, a lone
    surrogate as ``\\udXXX`` (messages of user code, and file names, may hold either)."""
    return text.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")


def utcnow() -> dt.datetime:
    """The current time as a timezone-aware UTC datetime."""
    return dt.datetime.now(dt.UTC)


class UtcDateTime(TypeDecorator[dt.datetime]):
    """A timestamp stored in UTC and always read back timezone-aware in UTC.

    SQLite has no timezone type: the value is written as UTC text and marked UTC when read.
    PostgreSQL stores ``timestamptz`` and returns it in the session zone, converted here to UTC.
    Naive datetimes are rejected rather than guessed at.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        """Convert an aware datetime to UTC; reject a naive one."""
        if value is None:
            return None
        if not isinstance(value, dt.datetime):
            raise TypeError(f"expected a datetime, got {value!r} ({type(value).__name__})")
        if value.utcoffset() is None:
            raise ValueError(
                f"naive datetime {value.isoformat()!r}: store timezone-aware datetimes, "
                "e.g. datetime.now(UTC)"
            )
        return value.astimezone(dt.UTC)

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        """Return the stored value as an aware UTC datetime."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)
