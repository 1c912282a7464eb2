"""The first checks every queue provider makes of its URI, worded once for all of them: the
scheme, no credentials (they belong in a named connection), no fragment, and a query only of the
options the provider takes there.

A provider then checks its own parts (servers, paths, names). The errors name the URI with its
credentials masked, as they are logged and shown as a watcher's error.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Collection, Sequence

_USERINFO = re.compile(r"(?<=://)[^/?#]*@")


def masked_uri(uri: str) -> str:
    """``uri`` with the user part of its address (a login, a password, a token) shown as ``***``."""
    return _USERINFO.sub("***@", uri, count=1)


def split_uri(
    uri: str,
    *,
    kind: str,
    form: str,
    schemes: Collection[str],
    options: Sequence[str] = (),
) -> tuple[urllib.parse.SplitResult, dict[str, str]]:
    """The parts of ``uri`` and the options of its query, once its scheme is one of ``schemes``
    (lower case), it holds no credentials and no fragment, and its query names only ``options``
    (no query at all without them); otherwise a ``ValueError`` naming the ``kind`` of URI
    (``"NATS"``), the URI and its ``form``."""
    shown = masked_uri(uri)
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError as error:  # an unclosed '[' of an IPv6 address, for one
        raise ValueError(f"{kind} URI {shown!r} must have the form {form} ({error})") from None
    if parts.scheme.lower() not in schemes:
        raise ValueError(f"{kind} URI {shown!r} must have the form {form}")
    if "@" in parts.netloc:
        raise ValueError(
            f"{kind} URI {shown!r} holds credentials: put them in a [connections.NAME] section "
            "and give connection='NAME'"
        )
    if not options and (parts.query or parts.fragment):
        raise ValueError(
            f"{kind} URI {shown!r} must not have a query or fragment; pass options as keyword "
            f"arguments (the form is {form})"
        )
    if parts.fragment:
        raise ValueError(f"{kind} URI {shown!r} must not have a fragment (the form is {form})")
    given = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(given) - set(options))
    if unknown:
        raise ValueError(
            f"{kind} URI {shown!r} has unknown options {unknown}; valid: {', '.join(options)}"
        )
    return parts, given
