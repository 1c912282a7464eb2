"""Who makes a change and what it may do: the principal a request or a command acts as (named
in the audit log), its role, the permissions each role holds, an emitter's asset globs, and the
principals known by their tokens. Pure logic: the API's dependencies and its hot path apply it.
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
import functools
import hashlib
import os
import pwd
import re
from collections.abc import Iterable, Mapping

from triggerer.service.errors import Forbidden


class Role(enum.StrEnum):
    """What a principal is: each role holds the permissions of :data:`ROLE_PERMISSIONS`."""

    VIEWER = "viewer"
    EMITTER = "emitter"
    OPERATOR = "operator"
    ADMIN = "admin"


class Permission(enum.StrEnum):
    """What a route needs (each route says which, with ``requires``)."""

    READ = "read"
    """Every GET, and simulating a schedule (which changes nothing)."""
    EMIT = "emit"
    """Creating asset events; an emitter only on the assets its globs match."""
    OPERATE = "operate"
    """Pausing and unpausing pipelines, triggering, cancelling and re-running runs, replaying
    events, deleting queued events."""
    AUDIT = "audit"
    """Reading the audit log: who changed what."""

    @property
    def what(self) -> str:
        """What the permission allows, in words."""
        return _WHAT[self]


_WHAT = {
    Permission.READ: "read pipelines, assets, events, runs and watchers",
    Permission.EMIT: "create asset events",
    Permission.OPERATE: (
        "pause and unpause pipelines, trigger, cancel and re-run runs, replay events and "
        "delete queued events"
    ),
    Permission.AUDIT: "read the audit log",
}

ROLE_PERMISSIONS: Mapping[Role, frozenset[Permission]] = {
    Role.VIEWER: frozenset({Permission.READ}),
    Role.EMITTER: frozenset({Permission.READ, Permission.EMIT}),
    Role.OPERATOR: frozenset(
        {Permission.READ, Permission.EMIT, Permission.OPERATE, Permission.AUDIT}
    ),
    # Nothing in the API needs more than an operator today; admin is what [api] tokens, an
    # open API and the CLI are, and what any permission added later is held by.
    Role.ADMIN: frozenset(Permission),
}
"""The permissions of each role. An emitter's ``emit`` is only for the assets its globs match."""


@dataclasses.dataclass(frozen=True)
class Principal:
    """A caller of the API or the CLI: ``name`` is what the audit log records, ``role`` what
    it may do; ``assets``, an emitter's globs, the assets it may emit to."""

    name: str
    role: Role
    assets: tuple[str, ...] = ()

    @property
    def permissions(self) -> frozenset[Permission]:
        return ROLE_PERMISSIONS[self.role]

    def may(self, permission: Permission) -> bool:
        """Whether its role holds ``permission`` (for ``emit``: on some asset at least)."""
        return permission in self.permissions

    def may_emit_to(self, name: str, uri: str) -> bool:
        """Whether it may create events of the asset ``name`` with ``uri``: an emitter when
        one of its globs matches the name or the URI."""
        if not self.may(Permission.EMIT):
            return False
        if self.role != Role.EMITTER:
            return True
        if not self.assets:
            return False  # (the settings refuse an emitter without globs)
        pattern = _globs(self.assets)
        return pattern.match(name) is not None or pattern.match(uri) is not None

    def check(self, permission: Permission) -> None:
        """Raise :class:`Forbidden` naming the principal and ``permission`` unless it holds it."""
        if not self.may(permission):
            *others, last = [role for role in Role if permission in ROLE_PERMISSIONS[role]]
            holders = f"{', '.join(others)} and {last}" if others else last
            raise Forbidden(
                f"principal {self.name!r} ({self.role}) lacks the permission "
                f"{permission.value!r} ({permission.what}), which {holders} hold"
            )

    def check_emit(self, name: str, uri: str) -> None:
        """Raise :class:`Forbidden` unless it may create events of the asset ``name``
        (``uri``), naming the asset and, for an emitter, its globs."""
        self.check(Permission.EMIT)
        if not self.may_emit_to(name, uri):
            globs = ", ".join(repr(glob) for glob in self.assets)
            shown = repr(name) if name == uri else f"{name!r} (URI {uri!r})"
            raise Forbidden(
                f"principal {self.name!r} ({self.role}) lacks the permission 'emit' on asset "
                f"{shown}: it may emit only to the assets whose name or URI matches {globs}"
            )


@functools.cache
def _globs(globs: tuple[str, ...]) -> re.Pattern[str]:
    """One pattern matching what any of ``globs`` matches, as :func:`fnmatch.fnmatchcase` does
    (case-sensitive, ``*`` across ``/`` too)."""
    return re.compile("|".join(fnmatch.translate(glob) for glob in globs))


ANONYMOUS = Principal("anonymous", Role.ADMIN)
"""Whoever calls an API with no tokens configured (it listens on loopback only)."""

TOKEN_PRINCIPAL = re.compile(r"api-token-\d+")
"""The names of :func:`token_principal`."""


def token_principal(index: int) -> Principal:
    """The bearer of the ``index``-th token of ``[api] tokens``: an admin."""
    return Principal(f"api-token-{index + 1}", Role.ADMIN)


CLI_PREFIX = "cli:"
NAME_MAX_CHARS = 250
"""The longest principal's name: what the audit log's ``actor`` holds (the store's
``ID_LENGTH``)."""


def cli_principal() -> Principal:
    """The CLI's user, acting on the store directly: an admin named by the Unix user it runs as
    (its effective uid's name, which the environment cannot change; ``uid<N>`` when the uid has
    no name, as in a container run under an arbitrary uid)."""
    uid = os.geteuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = f"uid{uid}"
    return Principal(f"{CLI_PREFIX}{user}", Role.ADMIN)


def reserved(name: str) -> bool:
    """Whether ``name`` is one the daemon gives (``anonymous``, ``api-token-N``,
    ``cli:USER``), which a configured principal may not take: the audit log would not tell
    them apart."""
    return (
        name == ANONYMOUS.name
        or TOKEN_PRINCIPAL.fullmatch(name) is not None
        or name.startswith(CLI_PREFIX)
    )


def token_digest(token: str) -> bytes:
    """The SHA-256 digest of a bearer token (what ``token_sha256`` gives in hex)."""
    return hashlib.sha256(token.encode()).digest()


class Keyring:
    """The principals the API knows, by the digests of their tokens; none: the API is open."""

    def __init__(self, entries: Iterable[tuple[bytes, Principal]]) -> None:
        self._by_digest = dict(entries)

    @property
    def open(self) -> bool:
        """Whether no token is configured: anyone is :data:`ANONYMOUS`."""
        return not self._by_digest

    def bearer(self, token: str) -> Principal | None:
        """The principal whose token ``token`` is, if one."""
        # A lookup by the token's SHA-256 digest: its timing can tell at most about digests,
        # from which no token can be found.
        return self._by_digest.get(token_digest(token))
