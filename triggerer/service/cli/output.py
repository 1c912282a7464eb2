"""What the verbs print: lines, tables of rows (a payload's cell cut short), and the ``list``
verbs, which print the rows they read as a table or as JSON."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from typing import TYPE_CHECKING, Any, TypeVar

from triggerer.service.cli.store import with_session

if TYPE_CHECKING:
    import argparse
    from collections.abc import Awaitable, Callable, Iterable, Sequence

    from sqlalchemy.ext.asyncio import AsyncSession

    from triggerer.service.cli.verbs import Handler
    from triggerer.service.config import Settings
    from triggerer.service.reads.views import View

    ReadRows = Callable[[AsyncSession, argparse.Namespace], Awaitable[Sequence[View]]]

Rows = list[dict[str, Any]]
T = TypeVar("T")


def listing(rows_of: ReadRows, columns: tuple[str, ...], *, cut: tuple[str, ...] = ()) -> Handler:
    """A ``list`` verb: the rows ``rows_of`` reads, as a table of ``columns`` or (``--json``)
    one JSON array of whole rows, as the REST API returns them. In the table, the cells of the
    columns ``cut`` (payloads) show their first :data:`CUT_CHARS` characters."""

    async def handler(settings: Settings, arguments: argparse.Namespace) -> int:
        views = await with_session(settings, lambda session: rows_of(session, arguments))
        rows = [view.model_dump(mode="json") for view in views]
        if arguments.json:
            say(json.dumps(rows))
        else:
            # A row of another kind among them (a broken file among pipelines) has a dash.
            table([{column: row.get(column, "-") for column in columns} for row in rows], cut)
        return 0

    return handler


def say(text: str) -> None:
    sys.stdout.write(text + "\n")


CUT_CHARS = 60
"""How much of a payload's cell the table shows (``--json`` gives all of it)."""


def table(rows: Rows, cut: Iterable[str] = ()) -> None:
    """``rows`` in aligned columns; nothing is padded after the last one."""
    if not rows:
        say("(none)")
        return
    columns = list(rows[0])
    cells = [[_cell(row[c], cut=c in cut) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    for line in [[c.upper() for c in columns], *cells]:
        say("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())


def _cell(value: Any, *, cut: bool) -> str:
    """A value as the table shows it: JSON for a list or a mapping, nothing for ``None``, and
    (``cut``) its first :data:`CUT_CHARS` characters, ``…`` the last of them when cut."""
    text = (
        "" if value is None else json.dumps(value) if isinstance(value, dict | list) else str(value)
    )
    return text[: CUT_CHARS - 1] + "…" if cut and len(text) > CUT_CHARS else text


def quiet_client_logs() -> None:
    """A failed send is one line naming the address; the clients' own logs of each failed
    connection attempt would only repeat it."""
    for name in ("aiokafka", "botocore", "aiobotocore", "httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


async def loading(load: Callable[[], T]) -> T:
    """``load()``, an import of pipeline files, as the daemon imports its folder: in a worker
    thread (a file may run an event loop of its own as it is imported, which it cannot on the
    verb's), and what the files print meanwhile on stderr, away from the verb's output."""
    import anyio.to_thread

    with contextlib.redirect_stdout(sys.stderr):
        return await anyio.to_thread.run_sync(load)
