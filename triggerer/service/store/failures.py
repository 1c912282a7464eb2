"""Telling a store that failed to do the work from one that refused it.

A failure (the database down or restarting, a lost or refused connection, SQLite's "database is
locked", a deadlock, no free pooled connection) is weather: the same work succeeds later, so the
daemon retries it with backoff and acknowledges nothing meanwhile. A refusal (a value the
database cannot hold, a constraint the data breaks) is the data's fault: writing it again is
refused again, so the caller isolates it (a dead letter, a failed run) and goes on.
"""

from __future__ import annotations

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout

STORE_ERRORS = (DBAPIError, PoolTimeout, OSError)
"""What talking to the store raises. A refused connection surfaces as the driver's ``OSError``;
a killed one, a lock or PostgreSQL's shutdown notice as a ``DBAPIError``."""

_REJECTING_SQLSTATE_CLASSES = frozenset({"22", "23", "54"})
"""PostgreSQL error classes that refuse the data itself: data exception (a value too long, a
NUL character), integrity constraint violation, program limit exceeded (an index row or a
document too large)."""


def is_rejection(error: BaseException) -> bool:
    """Whether ``error`` is the database refusing the data written, which writing it again
    cannot change."""
    if not isinstance(error, DBAPIError) or error.connection_invalidated:
        return False
    sqlstate = getattr(error.orig, "sqlstate", None)
    if isinstance(sqlstate, str):  # PostgreSQL, through asyncpg or psycopg
        return sqlstate[:2] in _REJECTING_SQLSTATE_CLASSES
    # SQLite (no SQLSTATE): lock, I/O and connection errors are OperationalError.
    return isinstance(error, DataError | IntegrityError)


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` is the store failing to do the work, which a retry may get past.
    Anything the store raises that is not a refusal of the data counts, so an unforeseen error
    stalls and is logged rather than losing or dead-lettering good work."""
    return isinstance(error, STORE_ERRORS) and not is_rejection(error)
