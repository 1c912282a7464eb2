"""``triggerer assets list``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from triggerer.service.cli.output import listing
from triggerer.service.cli.verbs import verb

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from sqlalchemy.ext.asyncio import AsyncSession

    from triggerer.service.reads.views import View

ASSET_COLUMNS = ("id", "name", "uri", "group")


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    assets = verbs.add_parser("assets", help="assets").add_subparsers(metavar="VERB")
    verb(assets, "list", listing(_assets_rows, ASSET_COLUMNS), "list assets", listing=True)


async def _assets_rows(session: AsyncSession, arguments: argparse.Namespace) -> Sequence[View]:
    from triggerer.service.reads import queries

    return await queries.assets(session, limit=arguments.limit)
