"""The ways a user's request fails, raised by the queries, actions and replay alike (and
:class:`Forbidden` by the permission checks); the REST API answers them 404, 422, 409 and 403,
the CLI prints their message."""

from __future__ import annotations


class NotFound(LookupError):
    """Something a user named does not exist; the message names it and where to look."""


class Refused(ValueError):
    """A value a user gave cannot be used; the message names it and what would do."""


class Conflict(ValueError):
    """What a user asked for does not fit the state of what it names (cancelling a finished
    run); the message names that state and what would."""


class Forbidden(Exception):
    """The caller's role does not allow what it asked for; the message names the caller and the
    permission it lacks."""
