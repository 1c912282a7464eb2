"""Assets, aliases and the conditions built from them with ``&`` and ``|``, an AND's window
(``within``) and reset."""

from __future__ import annotations

import zoneinfo
from collections.abc import Collection, Iterator, Sequence
from datetime import timedelta
from typing import Any

import msgspec

from triggerer.crons import validate_cron
from triggerer.sites import caller_site
from triggerer.triggers import BaseEventTrigger, check_json
from triggerer.uri import normalize_uri, validate_name


class BaseAsset:
    """Anything a schedule condition can be made of."""

    __slots__ = ()

    def __and__(self, other: object) -> AssetAll:
        return AssetAll(self, _operand(other, "&"))

    def __rand__(self, other: object) -> AssetAll:
        return AssetAll(_operand(other, "&"), self)

    def __or__(self, other: object) -> AssetAny:
        return AssetAny(self, _operand(other, "|"))

    def __ror__(self, other: object) -> AssetAny:
        return AssetAny(_operand(other, "|"), self)

    def evaluate(self, updated: Collection[BaseAsset]) -> bool:
        """Whether the condition holds when the assets (or aliases) in ``updated`` have events."""
        raise NotImplementedError

    def within(self, span: timedelta) -> AssetAll:
        """Only an AND has a window (:meth:`AssetAll.within`): a TypeError saying so."""
        raise TypeError(
            f"({self}).within({span!r}): only an AND of assets has a window, e.g. "
            "(a & b).within(timedelta(hours=2)); an OR or a single asset holds on one event, "
            "with nothing to be within"
        )

    def iter_assets(self) -> Iterator[Asset]:
        """Every asset named in the condition, depth first."""
        return iter(())

    def iter_aliases(self) -> Iterator[AssetAlias]:
        """Every alias named in the condition, depth first."""
        return iter(())

    def as_json(self) -> Any:
        """A JSON description stored with the pipeline and shown by the API."""
        raise NotImplementedError


class Asset(BaseAsset):
    """A piece of data, identified by ``(name, uri)``.

    Given only one of ``name`` and ``uri``, the other equals it. ``extra`` describes the asset
    and never affects identity. ``watchers`` turn external messages into events on it.
    """

    __slots__ = ("extra", "group", "name", "uri", "watchers")

    def __init__(
        self,
        name: str | None = None,
        uri: str | None = None,
        *,
        extra: dict[str, Any] | None = None,
        group: str = "asset",
        watchers: Sequence[AssetWatcher] = (),
    ) -> None:
        if name is None and uri is None:
            raise TypeError("Asset() needs a name or a uri, e.g. Asset('orders')")
        if name is not None:
            self.name = validate_name(name)
            self.uri = normalize_uri(uri if uri is not None else name)
        else:
            # Given only a URI, the name is its normalised form (never a dropped password).
            self.uri = normalize_uri(str(uri))
            self.name = validate_name(self.uri)
        self.extra = json_mapping(extra or {}, f"Asset({self.name!r}) extra")
        self.group = group
        for watcher in watchers:
            if not isinstance(watcher, AssetWatcher):
                raise TypeError(
                    f"Asset({self.name!r}) watchers must be AssetWatcher objects, "
                    f"got {type(watcher).__name__}"
                )
        self.watchers = tuple(watchers)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Asset):
            return NotImplemented
        return (self.name, self.uri) == (other.name, other.uri)

    def __hash__(self) -> int:
        return hash((Asset, self.name, self.uri))

    def __repr__(self) -> str:
        if self.name == self.uri:
            return f"Asset({self.name!r})"
        return f"Asset(name={self.name!r}, uri={self.uri!r})"

    def __str__(self) -> str:
        return self.name

    def evaluate(self, updated: Collection[BaseAsset]) -> bool:
        return self in updated

    def iter_assets(self) -> Iterator[Asset]:
        yield self

    def as_json(self) -> Any:
        return {"asset": {"name": self.name, "uri": self.uri}}


class AssetAlias(BaseAsset):
    """A name resolved at run time to the assets a pipeline adds through it."""

    __slots__ = ("group", "name")

    def __init__(self, name: str, *, group: str = "asset") -> None:
        self.name = validate_name(name)
        self.group = group

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AssetAlias):
            return NotImplemented
        return self.name == other.name

    def __hash__(self) -> int:
        return hash((AssetAlias, self.name))

    def __repr__(self) -> str:
        return f"AssetAlias({self.name!r})"

    def __str__(self) -> str:
        return f"alias:{self.name}"

    def evaluate(self, updated: Collection[BaseAsset]) -> bool:
        return self in updated

    def iter_aliases(self) -> Iterator[AssetAlias]:
        yield self

    def as_json(self) -> Any:
        return {"alias": {"name": self.name}}


class _AssetBooleanCondition(BaseAsset):
    __slots__ = ("objects",)
    _symbol: str
    _json_key: str

    def __init__(self, *items: BaseAsset) -> None:
        if not items:
            raise TypeError(f"{type(self).__name__}() needs at least one asset")
        objects: list[BaseAsset] = []
        for item in items:
            _operand(item, self._symbol)
            # a | b | c is one AssetAny of three: nested conditions of the same kind flatten
            # (an AND with a window or a reset of its own stays one operand).
            if isinstance(item, _AssetBooleanCondition) and type(item) is type(self):
                objects.extend(item.objects if not item._timed() else (item,))
            else:
                objects.append(item)
        self.objects: tuple[BaseAsset, ...] = tuple(objects)

    def _timed(self) -> bool:
        """Whether it has a window or a reset, which make it more than its operands."""
        return False

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, type(self)):
            return NotImplemented
        return self.objects == other.objects

    def __hash__(self) -> int:
        return hash((type(self), self.objects))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.objects))})"

    def __str__(self) -> str:
        parts = (
            f"({o})" if isinstance(o, _AssetBooleanCondition) else str(o) for o in self.objects
        )
        return f" {self._symbol} ".join(parts)

    def iter_assets(self) -> Iterator[Asset]:
        for item in self.objects:
            yield from item.iter_assets()

    def iter_aliases(self) -> Iterator[AssetAlias]:
        for item in self.objects:
            yield from item.iter_aliases()

    def as_json(self) -> Any:
        return {self._json_key: [item.as_json() for item in self.objects]}


class AssetAll(_AssetBooleanCondition):
    """Holds when every operand holds (what ``a & b`` builds).

    ``within``: only for events that lie within that span of each other; a queued event of an
    operand leaves the pipeline's queue (expires) that long after its own timestamp.
    ``reset``: a cron expression (in ``reset_timezone``, UTC by default) at each of whose ticks
    the operands' queued events are cleared.
    """

    __slots__ = ("reset", "reset_timezone", "window")
    _symbol = "&"
    _json_key = "all"

    def __init__(
        self,
        *items: BaseAsset,
        within: timedelta | None = None,
        reset: str | None = None,
        reset_timezone: str | None = None,
    ) -> None:
        super().__init__(*items)
        self.window = self.reset = self.reset_timezone = None  # read by str() in the errors
        if within is not None and not (isinstance(within, timedelta) and within > timedelta(0)):
            raise ValueError(
                f"{self}: within={within!r} must be a positive timedelta, e.g. "
                "within=timedelta(hours=2)"
            )
        if within is not None and len(self.objects) < 2:
            raise ValueError(
                f"{self}: within={within!r} needs an AND of two or more operands, e.g. "
                "(a & b).within(timedelta(hours=2))"
            )
        if reset is not None:
            try:
                validate_cron(reset)
            except ValueError as error:
                raise ValueError(f"{self}: reset={reset!r}: {error}") from None
        if reset_timezone is not None:
            if reset is None:
                raise ValueError(f"{self}: reset_timezone={reset_timezone!r} without a reset")
            try:
                zoneinfo.ZoneInfo(reset_timezone)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
                raise ValueError(
                    f"{self}: reset_timezone={reset_timezone!r} is not an IANA time zone name, "
                    "e.g. 'Europe/Paris'"
                ) from None
        self.window = within
        self.reset = reset
        self.reset_timezone = reset_timezone

    def within(self, span: timedelta) -> AssetAll:
        """This AND, holding only for events within ``span`` of each other."""
        return AssetAll(
            *self.objects, within=span, reset=self.reset, reset_timezone=self.reset_timezone
        )

    def _timed(self) -> bool:
        return self.window is not None or self.reset is not None

    def evaluate(self, updated: Collection[BaseAsset]) -> bool:
        return all(item.evaluate(updated) for item in self.objects)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AssetAll):
            return NotImplemented
        return (self.objects, self.window, self.reset, self.reset_timezone) == (
            other.objects,
            other.window,
            other.reset,
            other.reset_timezone,
        )

    def __hash__(self) -> int:
        return hash((AssetAll, self.objects, self.window, self.reset, self.reset_timezone))

    def __repr__(self) -> str:
        options = [
            f"{name}={value!r}"
            for name, value in (
                ("within", self.window),
                ("reset", self.reset),
                ("reset_timezone", self.reset_timezone),
            )
            if value is not None
        ]
        return f"AssetAll({', '.join([*map(repr, self.objects), *options])})"

    def __str__(self) -> str:
        text = super().__str__()
        if not self._timed():
            return text
        if self.window is not None:
            text = f"({text}) within {self.window}"
        if self.reset is not None:
            zone = f" {self.reset_timezone}" if self.reset_timezone else " UTC"
            text = f"({text}) reset at '{self.reset}'{zone}"
        return text

    def as_json(self) -> Any:
        tree: dict[str, Any] = super().as_json()
        if self.window is not None:
            tree["within_s"] = self.window.total_seconds()
        if self.reset is not None:
            tree["reset"] = self.reset
        if self.reset_timezone is not None:
            tree["reset_timezone"] = self.reset_timezone
        return tree


class AssetAny(_AssetBooleanCondition):
    """Holds when any operand holds (what ``a | b`` builds)."""

    __slots__ = ()
    _symbol = "|"
    _json_key = "any"

    def evaluate(self, updated: Collection[BaseAsset]) -> bool:
        return any(item.evaluate(updated) for item in self.objects)


def lifetimes(condition: BaseAsset) -> dict[Asset | AssetAlias, timedelta]:
    """How long a queued event of each asset (or alias) of ``condition`` can still make a run:
    the widest of the windows it is named under. An asset or alias named anywhere outside a
    window is absent: its events stay queued until a run takes them."""
    found: dict[Asset | AssetAlias, timedelta] = {}
    unwindowed: set[Asset | AssetAlias] = set()

    def visit(node: BaseAsset, window: timedelta | None) -> None:
        if isinstance(node, AssetAll) and node.window is not None:
            window = node.window  # the innermost window bounds its operands
        if isinstance(node, _AssetBooleanCondition):
            for item in node.objects:
                visit(item, window)
        elif isinstance(node, (Asset, AssetAlias)):
            if window is None:
                unwindowed.add(node)
            else:
                found[node] = max(window, found.get(node, window))

    visit(condition, None)
    return {leaf: span for leaf, span in found.items() if leaf not in unwindowed}


class AssetWatcher:
    """Turns the events of ``trigger`` into asset events on the asset that lists it.

    ``defined_at`` is the file and line that made it, where a trigger that could not be made
    (an :class:`~triggerer.triggers.UnusableTrigger`) is reported.
    """

    __slots__ = ("defined_at", "name", "trigger")

    def __init__(self, name: str, trigger: BaseEventTrigger) -> None:
        if not isinstance(trigger, BaseEventTrigger):
            raise TypeError(
                f"AssetWatcher({name!r}) trigger must be a BaseEventTrigger, "
                f"got {type(trigger).__name__}"
            )
        self.name = validate_name(name)
        self.trigger = trigger
        self.defined_at = caller_site()

    def __repr__(self) -> str:
        return f"AssetWatcher({self.name!r}, {self.trigger!r})"


def _operand(item: object, symbol: str) -> BaseAsset:
    if not isinstance(item, BaseAsset):
        raise TypeError(
            f"cannot use {type(item).__name__} ({item!r}) with '{symbol}' in an asset condition: "
            "operands must be Asset, AssetAlias, AssetAll or AssetAny"
        )
    return item


def json_mapping(value: dict[str, Any], what: str) -> dict[str, Any]:
    """``value``, once known to be a dict the store can hold as JSON."""
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be a dict, got {type(value).__name__}")
    check_json(value, what)
    try:
        stored = msgspec.json.encode(value)  # as the store writes it
    except (TypeError, ValueError) as error:  # a lone surrogate, a None or bool key
        raise TypeError(f"{what} cannot be stored, got {value!r}: {error}") from None
    if b"\\u0000" in stored and _holds_nul(value):
        raise TypeError(f"{what} holds a NUL character (U+0000), which the store cannot hold")
    return value


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(key) or _holds_nul(item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return any(_holds_nul(item) for item in value)
    return False
