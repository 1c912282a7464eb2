"""What the store cannot hold, told before writing, and its refusals told from outages."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from triggerer.service.dead_letters import DEDUP_KEY_MAX_BYTES, unstorable
from triggerer.service.events import NewEvent
from triggerer.service.store.failures import is_outage, is_rejection
from triggerer.service.store.models import ID_LENGTH, NAME_LENGTH


def event(payload: Any = None, **keys: Any) -> NewEvent:
    return NewEvent(1, {"from_trigger": True, "payload": payload}, "trigger", **keys)


@pytest.mark.parametrize(
    "storable",
    [
        event({"n": 1, "text": "caf\u00e9"}, dedup_key="q/0/1", partition_key="2026-03-16"),
        event("a literal backslash-u0000: \\u0000"),
        event(dedup_key="k" * NAME_LENGTH, partition_key="p" * ID_LENGTH),
        event(dedup_key="\u00e9" * (DEDUP_KEY_MAX_BYTES // 2)),
    ],
)
def test_what_the_store_holds_has_no_reason(storable: NewEvent) -> None:
    assert unstorable(storable) is None


@pytest.mark.parametrize(
    ("unfit", "reason"),
    [
        (
            event(partition_key="p" * (ID_LENGTH + 1)),
            "partition key is 251 characters long; the store holds at most 250",
        ),
        (
            event(dedup_key="k" * (NAME_LENGTH + 1)),
            "dedup key is 1501 characters long; the store holds at most 1500",
        ),
        (
            event(dedup_key="\u4e00" * 1000),
            "dedup key is 3000 bytes long in UTF-8; the store indexes at most 2600",
        ),
        (event(dedup_key="a\x00b"), "dedup key holds a NUL character (U+0000)"),
        (event(partition_key="\ud800"), "partition key is not valid Unicode text"),
        (event(dedup_key=7), "dedup key must be text, got int 7"),
        (
            event({"rows": [{"name": "ok"}, {"name": "a\x00"}]}),
            "$.payload.rows[1].name holds a NUL character (U+0000)",
        ),
        (event({"a b\x00": 1}), '$.payload["a b\\u0000"] holds a NUL character (U+0000)'),
        (event({"text": "\udc80"}), "payload is not storable as JSON"),
    ],
)
def test_what_the_store_cannot_hold_is_told_before_writing(unfit: NewEvent, reason: str) -> None:
    found = unstorable(unfit)
    assert found is not None
    assert found.startswith(reason)


def _sqlite_error(error: sqlite3.Error) -> DBAPIError:
    wrapper = IntegrityError if isinstance(error, sqlite3.IntegrityError) else OperationalError
    return wrapper("INSERT ...", None, error)


def _pg_error(sqlstate: str, *, invalidated: bool = False) -> DBAPIError:
    class PostgresError(Exception):
        pass

    orig = PostgresError("message")
    orig.sqlstate = sqlstate  # type: ignore[attr-defined]  # what asyncpg and psycopg carry
    return DBAPIError("INSERT ...", None, orig, connection_invalidated=invalidated)


@pytest.mark.parametrize(
    ("error", "rejection"),
    [
        (_pg_error("22P05"), True),  # jsonb: unsupported Unicode escape sequence
        (_pg_error("22001"), True),  # value too long for the column
        (_pg_error("23514"), True),  # check constraint
        (_pg_error("54000"), True),  # index row too large
        (_pg_error("08006"), False),  # connection failure
        (_pg_error("57P01"), False),  # server shutting down
        (_pg_error("55000"), False),  # database does not allow connections
        (_pg_error("40P01"), False),  # deadlock
        (_pg_error("53100"), False),  # disk full
        (_pg_error("22001", invalidated=True), False),
        (
            OperationalError("INSERT ...", None, sqlite3.OperationalError("database is locked")),
            False,
        ),
        (OperationalError("INSERT ...", None, sqlite3.OperationalError("disk I/O error")), False),
        (IntegrityError("INSERT ...", None, sqlite3.IntegrityError("CHECK failed")), True),
    ],
)
def test_only_a_refusal_of_the_data_is_a_rejection(error: DBAPIError, rejection: bool) -> None:
    assert is_rejection(error) is rejection
    assert is_outage(error) is not rejection  # every store error is one or the other


def test_a_refused_connection_is_an_outage_and_other_errors_are_neither() -> None:
    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")
    assert (is_outage(refused), is_rejection(refused)) == (True, False)
    assert (is_outage(ValueError("bug")), is_rejection(ValueError("bug"))) == (False, False)
