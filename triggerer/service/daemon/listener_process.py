"""The listeners' own process, and what the daemon and it say to each other.

Listeners run in a child process of the daemon, never in the daemon: a listener that is slow,
blocks, or burns CPU then shares neither the daemon's event loop nor its interpreter lock. (In a
thread of the daemon, each time a listener's sleep or I/O ends it takes the lock back from the
event loop, and on a busy machine every such hand-over stalls the loop.)

The daemon writes one JSON line per item to the process's stdin: committed events (columns of
the recorded events, with the assets and runs they refer to) or definition changes. The process
calls the hooks for it, in order, and answers one line per item on its stdout with the failures
per hook. What listeners print goes to stderr, with the logs. The process dies with the daemon
(see :mod:`triggerer.service.runs.lifeline`) and ends when its stdin closes.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec
import structlog

from triggerer.assets import Asset, AssetAlias
from triggerer.listeners import listener_manager, notify
from triggerer.service.events import Origins, Recorded, RecordedEvent, asset_events
from triggerer.service.runs.lifeline import die_with_parent

if TYPE_CHECKING:
    import pluggy

    from triggerer.service.config import LoggingSettings
    from triggerer.service.scheduling.registry import DefinitionChanges

log = structlog.get_logger(__name__)


class WireAsset(msgspec.Struct, array_like=True, frozen=True):
    name: str
    uri: str
    group: str
    extra: dict[str, Any]

    @classmethod
    def of(cls, asset: Asset) -> WireAsset:
        return cls(asset.name, asset.uri, asset.group, asset.extra)

    def asset(self) -> Asset:
        return Asset(self.name, self.uri, group=self.group, extra=self.extra)


class WireEvents(msgspec.Struct, tag="events", frozen=True):
    """Committed events as columns, with the assets and producing runs they refer to."""

    ids: list[int]
    asset_ids: list[int]
    extras: list[dict[str, Any]]
    timestamps: list[datetime]
    sources: list[str]
    partition_keys: list[str | None]
    run_pks: list[int | None]
    assets: dict[int, WireAsset]
    run_ids: dict[int, str]


class WireDefinitions(msgspec.Struct, tag="definitions", frozen=True):
    created_assets: list[WireAsset]
    created_aliases: list[tuple[str, str]]  # name, group
    changed_assets: list[WireAsset]


class Ack(msgspec.Struct, frozen=True):
    """One item's hooks were called; how many calls raised, per hook."""

    failures: dict[str, int]


_ENCODER = msgspec.json.Encoder()
_ITEMS = msgspec.json.Decoder(WireEvents | WireDefinitions)
ACKS = msgspec.json.Decoder(Ack)


def encode_events(recorded: Recorded, known: Origins) -> bytes:
    """The line that carries ``recorded`` (its events are on assets and from runs ``known``)."""
    events = recorded.events
    return (
        _ENCODER.encode(
            WireEvents(
                ids=[e.id for e in events],
                asset_ids=[e.asset_id for e in events],
                extras=[e.extra for e in events],
                timestamps=[e.timestamp for e in events],
                sources=[e.source for e in events],
                partition_keys=[e.partition_key for e in events],
                run_pks=[e.source_run_pk for e in events],
                assets={
                    asset_id: WireAsset.of(known.assets[asset_id])
                    for asset_id in {e.asset_id for e in events}
                },
                run_ids={
                    run_pk: known.run_ids[run_pk]
                    for run_pk in {e.source_run_pk for e in events}
                    if run_pk is not None and run_pk in known.run_ids
                },
            )
        )
        + b"\n"
    )


def encode_definitions(changes: DefinitionChanges) -> bytes:
    """The line that carries ``changes``."""
    return (
        _ENCODER.encode(
            WireDefinitions(
                created_assets=[WireAsset.of(a) for a in changes.created_assets],
                created_aliases=[(a.name, a.group) for a in changes.created_aliases],
                changed_assets=[WireAsset.of(a) for a in changes.changed_assets],
            )
        )
        + b"\n"
    )


def command(plugins: Sequence[str], logging: LoggingSettings) -> list[str]:
    """How the daemon starts the listeners' process."""
    # The daemon's import path: plugins import here as they do there.
    options = {"plugins": list(plugins), "logging": logging.model_dump(), "path": sys.path}
    return [sys.executable, "-m", __name__, str(os.getpid()), json.dumps(options)]


def main(argv: Sequence[str]) -> None:
    """Call the listeners for each line of stdin, answering each on stdout, until stdin ends."""
    from triggerer.service.config import LoggingSettings
    from triggerer.service.logs import configure_logging

    parent_pid, options_json = argv
    die_with_parent(int(parent_pid))
    options = json.loads(options_json)
    configure_logging(LoggingSettings(**options["logging"]))
    structlog.contextvars.bind_contextvars(process="listeners")
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a listener's print() goes to the logs
    sys.path[:] = options["path"]
    manager = listener_manager(options["plugins"])
    for line in sys.stdin.buffer:
        failures = call_listeners(manager, _ITEMS.decode(line))
        answers.write(_ENCODER.encode(Ack(failures)) + b"\n")
        answers.flush()


def call_listeners(
    manager: pluggy.PluginManager, item: WireEvents | WireDefinitions
) -> dict[str, int]:
    """Call the hooks ``item`` is for; how many calls raised, per hook."""
    calls: list[tuple[str, dict[str, object]]]
    if isinstance(item, WireDefinitions):
        calls = [("on_asset_created", {"asset": a.asset()}) for a in item.created_assets]
        calls += [
            ("on_asset_alias_created", {"asset_alias": AssetAlias(name, group=group)})
            for name, group in item.created_aliases
        ]
        calls += [("on_asset_changed", {"asset": a.asset()}) for a in item.changed_assets]
    else:
        recorded = Recorded(
            [
                RecordedEvent(*columns)
                for columns in zip(
                    item.ids,
                    item.asset_ids,
                    [None] * len(item.ids),  # the dedup key: not for listeners
                    item.partition_keys,
                    item.extras,
                    item.sources,
                    item.timestamps,
                    item.run_pks,
                    strict=True,
                )
            ],
            [],
            {},
        )
        known = Origins({i: a.asset() for i, a in item.assets.items()}, item.run_ids)
        calls = [
            ("on_asset_event_emitted", {"asset_event": event})
            for event in asset_events(recorded, known)
        ]
    failures: dict[str, int] = {}
    for hook, kwargs in calls:
        failed = notify(manager, hook, **kwargs)
        if failed:
            failures[hook] = failures.get(hook, 0) + failed
    return failures


if __name__ == "__main__":
    main(sys.argv[1:])
