"""``triggerer``'s entry point: the parser, assembled from each noun's verbs, and how a verb's
outcome becomes an exit code."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import TYPE_CHECKING

from triggerer.service.cli import (
    assets,
    audit,
    daemon,
    db,
    events,
    explain,
    pipelines,
    post,
    runs,
)
from triggerer.service.cli import watchers as watcher_verbs
from triggerer.service.cli.store import CliError

if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if not hasattr(arguments, "handler"):
        parser.print_help(sys.stderr)
        return 2
    try:
        import asyncio

        from triggerer.service.config import load_settings

        settings = load_settings(arguments.config)
        if arguments.logs:
            from triggerer.service.logs import configure_logging

            configure_logging(settings.logging)
        # asyncio's runner rather than anyio's, whose backend (~25 ms to import) then comes with
        # the first call to anyio, which a verb reading the store never makes. The daemon runs
        # on either, as the end-to-end tests run it on pytest's loop.
        code: int = asyncio.run(arguments.handler(settings, arguments))
        sys.stdout.flush()  # a reader gone shows here rather than in the interpreter's exit
    except (CliError, LookupError, ValueError) as error:  # a ConfigError is a ValueError
        print(f"triggerer: {error}", file=sys.stderr)  # noqa: T201 - CLI output
        return 1
    except BrokenPipeError:
        # The reader of stdout is gone (`| head`): end quietly with the status of a tool that
        # SIGPIPE ended, as cat and ls do, so scripts tell it from a failure. Unwritten output
        # goes to devnull, or the interpreter's last flush would fail again and say so.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        # Ctrl-C is not an error to explain. `run` never gets here: the daemon takes SIGINT
        # itself, as a graceful stop.
        return 128 + signal.SIGINT
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="triggerer", description="Run the triggerer daemon, inspect it and drive it."
    )
    parser.add_argument("--config", help="config file (default: $TRIGGERER_CONFIG)")
    verbs = parser.add_subparsers(metavar="COMMAND")
    for noun in (daemon, db, pipelines, assets, watcher_verbs, events, runs, post, explain, audit):
        noun.add_verbs(verbs)
    return parser
