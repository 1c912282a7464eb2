"""How a noun adds a verb to the parser: its handler, whether it logs, a list verb's options."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from datetime import datetime

    from triggerer.service.config import Settings

    Handler = Callable[[Settings, argparse.Namespace], Awaitable[int]]


def verb(
    group: Any,
    name: str,
    handler: Handler,
    help_text: str,
    *,
    listing: bool = False,
    reads: bool = False,
) -> argparse.ArgumentParser:
    """A verb running ``handler``; one that only ``reads`` and prints (every ``listing``)
    logs nothing, so it does not set logging up (structlog's import would be a tenth of
    its run)."""
    command: argparse.ArgumentParser = group.add_parser(name, help=help_text)
    command.set_defaults(handler=handler, logs=not (reads or listing))
    # Also after the verb (`triggerer run --config FILE`); SUPPRESS keeps one given before.
    command.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    if listing:
        command.add_argument("--json", action="store_true", help="one JSON array on stdout")
        command.add_argument("--limit", type=limit_arg, default=50)
    return command


MAX_LIMIT = 2**63 - 1
"""The largest ``LIMIT`` SQLite and PostgreSQL take (a signed 64-bit integer)."""


def limit_arg(text: str) -> int:
    try:
        limit: int | None = int(text)
    except ValueError:
        limit = None
    if limit is None or not 1 <= limit <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 1 to {MAX_LIMIT}, got {text!r}"
        )
    return limit


def time_arg(text: str) -> datetime:
    """An ISO date (midnight) or date and time, UTC unless it names its offset."""
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO date or date and time, e.g. 2026-01-31 or "
            "2026-01-31T12:00:00+02:00"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
