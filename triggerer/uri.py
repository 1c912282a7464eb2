"""Asset URI and asset name rules: what is accepted, and the one canonical form of each URI.

An asset's identity is its ``(name, uri)``, so every spelling of one location has to normalise to
the same text, and anything that cannot be made canonical is rejected with an
:class:`InvalidAssetUri` that names the URI, the rule it breaks and what would be valid.

Every URI and every name
    1 to 1500 printable ASCII characters, not blank, no leading or trailing whitespace. Control
    characters are rejected because ``urlsplit`` silently drops tabs and newlines, which would
    make two different texts one asset.

Names (:func:`validate_name`)
    Additionally not ``self`` or ``context``, which clash with the arguments a pipeline function
    receives. A URI equal to ``self`` or ``context`` is an ordinary scheme-less identifier and
    is accepted (an asset given only that URI still fails, on its derived name).

URIs (:func:`normalize_uri`), by scheme
    - No scheme (``orders``, ``//example/asset``) and ``x-`` schemes (in any case): verbatim.
    - ``triggerer`` and ``airflow``: reserved (as Airflow reserves its own), rejected.
    - Known schemes (``s3``, ``gs``, ``file``, ``postgres``/``postgresql``, ``http``, ``https``)
      and plugin schemes: the scheme is lower-cased, the fragment dropped, an empty query
      dropped, query parameters sorted by key (stable, so repeated keys keep their order; the
      percent-encoding is kept as written); host and path keep their case. Then:

      - ``s3``, ``gs``: a bucket is required and takes no port. A bucket on its own is
        ``s3://bucket/``; trailing slashes of a key are stripped (``s3://b/k/`` ->
        ``s3://b/k``).
      - ``file``: an absolute path, written ``file:///abs/path`` (``file:/abs/path`` and
        ``file://localhost/abs/path`` are the same); trailing slashes are stripped
        (``file:///data/in/`` -> ``file:///data/in``), but for the root ``file:///``. Any
        other host is rejected: it is nearly always a relative path written as
        ``file://data/x.csv``.
      - ``postgres``/``postgresql``: becomes ``postgres``; a host is required; the port
        defaults to 5432; the path is exactly ``/<database>/<schema>/<table>``.
      - ``http``, ``https``: a host is required; the default port (80, 443) is dropped and an
        empty path becomes ``/``.
    - Any other scheme (``kafka``, ``sqs``, ``bigquery``, ...): the scheme is lower-cased and
      the rest is kept verbatim, because its grammar is unknown.

    In every URI with a scheme (``x-`` aside) a password in the userinfo is dropped with an
    :class:`AssetUriWarning`; the user name stays. URIs are stored in clear text, and error
    messages show ``***`` in place of a password.

Scheme plugins
    A distribution adds a scheme through an entry point in the group ``triggerer.asset_uri_schemes``
    named by the scheme, whose object is a :data:`SchemeNormalizer`: it gets the
    :class:`~urllib.parse.SplitResult` after the common normalisation above and returns the
    canonical one, raising :class:`ValueError` (reported as :class:`InvalidAssetUri`) to reject
    it. Entry points are discovered once and each is imported the first time its scheme is seen.
    Built-in schemes win: a plugin for a built-in, ``x-`` or a reserved scheme is ignored with
    an :class:`AssetUriWarning`, because changing a canonical form would split assets already
    stored under it.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from urllib.parse import SplitResult, quote, urlsplit, urlunsplit

__all__ = (
    "MAX_LENGTH",
    "SCHEME_PLUGIN_GROUP",
    "AssetUriWarning",
    "InvalidAssetName",
    "InvalidAssetUri",
    "SchemeNormalizer",
    "normalize_uri",
    "validate_name",
)

MAX_LENGTH = 1500
"""Longest asset URI or name, in characters."""

SCHEME_PLUGIN_GROUP = "triggerer.asset_uri_schemes"
"""Entry-point group through which distributions add URI schemes."""

SchemeNormalizer = Callable[[SplitResult], SplitResult]
"""What a scheme plugin's entry point loads: validates and normalises one split URI."""

_RESERVED_SCHEMES = frozenset({"triggerer", "airflow"})
_RESERVED_NAMES = frozenset({"self", "context"})
# The scheme grammar of RFC 3986, which is also what urlsplit recognises as a scheme.
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
# The authority runs up to the first "/", "?" or "#", as in urlsplit.
_AUTHORITY_RE = re.compile(r"//([^/?#]*)")
# Long values are cut in messages so that one bad URI cannot flood a log line.
_SHOWN_MAX = 120
_SHOWN_PREFIX = 80


class InvalidAssetUri(ValueError):
    """An asset URI breaks a rule; the message names the URI, the rule and what is valid."""


class InvalidAssetName(ValueError):
    """An asset name breaks a rule; the message names the name, the rule and what is valid."""


class AssetUriWarning(UserWarning):
    """An asset URI was accepted but changed in a way its author should know about."""


def normalize_uri(uri: str) -> str:
    """Validate an asset URI and return its canonical form (see the module docstring).

    Raises :class:`InvalidAssetUri` when the URI breaks a rule, and warns with
    :class:`AssetUriWarning` when a password is dropped.
    """
    _check_text(uri, "asset URI", InvalidAssetUri)
    match = _SCHEME_RE.match(uri)
    if match is None or match[1].lower().startswith("x-"):
        return uri
    written_scheme = match[1]
    scheme = written_scheme.lower()
    after_scheme = uri[len(written_scheme) + 1 :]
    rest, shown, redacted = after_scheme, _show(uri), None
    authority = _AUTHORITY_RE.match(after_scheme)
    if authority is not None:
        netloc, rest = authority[1], after_scheme[authority.end() :]
        netloc, redacted = _drop_password(netloc)
        if redacted is not None:
            shown = _show(f"{scheme}://{redacted}{rest}")
        rest = f"//{netloc}{rest}"
    if scheme in _RESERVED_SCHEMES:
        raise InvalidAssetUri(
            f"asset URI {shown} uses the reserved scheme {scheme!r}: "
            "use another scheme, e.g. x-<name>:// for your own identifiers"
        )
    if redacted is not None:
        warnings.warn(
            AssetUriWarning(
                f"asset URI {shown} has a password in it; it was dropped because URIs are "
                "stored in clear text: name a connection instead"
            ),
            stacklevel=2,
        )

    builtin = _BUILTIN_SCHEMES.get(scheme)
    plugin = None if builtin is not None else _scheme_plugin(scheme)
    if builtin is not None:
        normalized = _unsplit(builtin(shown, _split_known(shown, f"{scheme}:{rest}")))
    elif plugin is not None:
        parts = _split_known(shown, f"{scheme}:{rest}")
        normalized = urlunsplit(_run_plugin(plugin, scheme, shown, parts))
    else:
        normalized = f"{scheme}:{rest}"

    if len(normalized) > MAX_LENGTH:
        raise InvalidAssetUri(
            f"asset URI {shown} normalises to {_show(normalized)}, which is longer than "
            f"{MAX_LENGTH} characters: shorten it"
        )
    return normalized


def validate_name(name: str) -> str:
    """Check an asset name against the rules in the module docstring and return it unchanged.

    Raises :class:`InvalidAssetName` when the name breaks a rule.
    """
    _check_text(name, "asset name", InvalidAssetName)
    if name in _RESERVED_NAMES:
        raise InvalidAssetName(
            f"asset name {name!r} is reserved (so are {sorted(_RESERVED_NAMES)}): "
            f"choose another name, e.g. {name + '_asset'!r}"
        )
    return name


def _check_text(value: str, what: str, error: type[ValueError]) -> None:
    """Apply the rules every URI and every name share."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}: {value!r}")
    shown = _show(value)
    valid = f"give 1 to {MAX_LENGTH} printable ASCII characters"
    if not value:
        raise error(f"{what} {shown} is empty: {valid}")
    if len(value) > MAX_LENGTH:
        raise error(f"{what} {shown} is longer than {MAX_LENGTH} characters: shorten it")
    if value.isspace():
        raise error(f"{what} {shown} is blank: {valid}")
    for index, char in enumerate(value):
        if not char.isascii():
            hint = f"percent-encode it as {quote(char)}" if error is InvalidAssetUri else valid
            raise error(
                f"{what} {shown} has the non-ASCII character {char!r} at index {index}: {hint}"
            )
        if not char.isprintable():
            raise error(
                f"{what} {shown} has the control character {char!r} at index {index}: {valid}"
            )
    if value != value.strip():
        raise error(f"{what} {shown} has leading or trailing whitespace: write {value.strip()!r}")


def _show(value: str) -> str:
    if len(value) <= _SHOWN_MAX:
        return repr(value)
    return f"{value[:_SHOWN_PREFIX]!r}... ({len(value)} characters)"


def _drop_password(netloc: str) -> tuple[str, str | None]:
    """Return the authority without its password, and the redacted one if a password was there.

    An empty password (``user:@host``) is normalised away without a warning, as nothing leaked;
    with no user name left, the ``@`` goes too.
    """
    userinfo, _, hostport = netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if not colon:
        return netloc, None
    kept = f"{user}@{hostport}" if user else hostport
    return kept, (f"{user}:***@{hostport}" if password else None)


def _sort_query(query: str) -> str:
    pairs = [pair for pair in query.split("&") if pair]
    return "&".join(sorted(pairs, key=lambda pair: pair.partition("=")[0]))


def _split_known(shown: str, uri: str) -> SplitResult:
    """Split a URI of a known or plugin scheme, with the normalisation they all share."""
    try:
        parts = urlsplit(uri)
    except ValueError as exc:  # urlsplit's only complaint: unbalanced IPv6 brackets
        raise InvalidAssetUri(
            f"asset URI {shown} cannot be parsed ({exc}): write an IPv6 host as [addr]"
        ) from exc
    return parts._replace(query=_sort_query(parts.query), fragment="")


def _unsplit(parts: SplitResult) -> str:
    # Built-in schemes always have an authority; urlunsplit would turn an empty authority and a
    # path starting with "//" into a host (file:////share -> file://share).
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme}://{parts.netloc}{parts.path}{query}"


def _split_netloc(shown: str, netloc: str) -> tuple[str, str, int | None]:
    """Split an authority into ``(userinfo@ or "", host, port)``, checking the port."""
    userinfo, at, hostport = netloc.rpartition("@")
    if hostport.startswith("["):
        host, bracket, port_text = hostport.partition("]")
        host += bracket
        if port_text and not port_text.startswith(":"):
            raise InvalidAssetUri(
                f"asset URI {shown} has {port_text!r} after the IPv6 host {host}: "
                f"write [addr] or [addr]:<port>"
            )
        port_text = port_text[1:]
    else:
        host, _, port_text = hostport.partition(":")
    if not port_text:
        return userinfo + at, host, None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise InvalidAssetUri(
            f"asset URI {shown} has the port {port_text!r}: a port is a number from 1 to 65535"
        )
    return userinfo + at, host, int(port_text)


def _bucket(shown: str, parts: SplitResult) -> SplitResult:
    """``s3``/``gs``: a bucket, no port; the bucket root is ``/``, key trailing slashes go."""
    _, host, port = _split_netloc(shown, parts.netloc)
    if not host:
        raise InvalidAssetUri(
            f"asset URI {shown} needs a bucket: write {parts.scheme}://<bucket>/<key>"
        )
    if port is not None:
        raise InvalidAssetUri(
            f"asset URI {shown} has a port, which a bucket does not take: "
            f"write {parts.scheme}://<bucket>/<key>"
        )
    return parts._replace(path=parts.path.rstrip("/") or "/")


def _file(shown: str, parts: SplitResult) -> SplitResult:
    """``file``: an absolute local path, no host other than ``localhost``; trailing slashes
    go (a folder is one asset however it is written), the root stays ``/``."""
    valid = "write file:///<absolute path>"
    if parts.netloc and parts.netloc.lower() != "localhost":
        raise InvalidAssetUri(
            f"asset URI {shown} has the host {parts.netloc!r}, but a file URI names a local "
            f"absolute path: {valid} (for example file:///{parts.netloc}{parts.path})"
        )
    if not parts.path.startswith("/"):
        problem = "has no path" if not parts.path else "has a relative path"
        raise InvalidAssetUri(f"asset URI {shown} {problem}: {valid}")
    return parts._replace(netloc="", path=parts.path.rstrip("/") or "/")


def _postgres(shown: str, parts: SplitResult) -> SplitResult:
    """``postgres``/``postgresql``: host, port (5432 by default), ``/db/schema/table``."""
    valid = "write postgres://<host>[:<port>]/<database>/<schema>/<table>"
    userinfo, host, port = _split_netloc(shown, parts.netloc)
    if not host:
        raise InvalidAssetUri(f"asset URI {shown} needs a host: {valid}")
    segments = parts.path.split("/")[1:]
    if len(segments) != 3 or not all(segments):
        raise InvalidAssetUri(
            f"asset URI {shown} needs exactly a database, schema and table as its path, "
            f"got {parts.path!r}: {valid}"
        )
    return parts._replace(scheme="postgres", netloc=f"{userinfo}{host}:{port or 5432}")


_DEFAULT_HTTP_PORTS = {"http": 80, "https": 443}


def _http(shown: str, parts: SplitResult) -> SplitResult:
    """``http``/``https``: a host; the default port is dropped and an empty path becomes ``/``."""
    userinfo, host, port = _split_netloc(shown, parts.netloc)
    if not host:
        raise InvalidAssetUri(
            f"asset URI {shown} needs a host: write {parts.scheme}://<host>[:<port>]/<path>"
        )
    if port is not None and port != _DEFAULT_HTTP_PORTS[parts.scheme]:
        host = f"{host}:{port}"
    return parts._replace(netloc=f"{userinfo}{host}", path=parts.path or "/")


_BUILTIN_SCHEMES: dict[str, Callable[[str, SplitResult], SplitResult]] = {
    "s3": _bucket,
    "gs": _bucket,
    "file": _file,
    "postgres": _postgres,
    "postgresql": _postgres,
    "http": _http,
    "https": _http,
}


@functools.cache
def _scheme_entry_points() -> dict[str, EntryPoint]:
    """Discover the scheme plugins once; schemes a plugin may not take are warned about."""
    found: dict[str, EntryPoint] = {}
    for entry_point in entry_points(group=SCHEME_PLUGIN_GROUP):
        scheme = entry_point.name.lower()
        if scheme in _BUILTIN_SCHEMES or scheme in _RESERVED_SCHEMES or scheme.startswith("x-"):
            warnings.warn(
                AssetUriWarning(
                    f"ignoring the {SCHEME_PLUGIN_GROUP} entry point {entry_point.name!r} "
                    f"({entry_point.value}): the scheme {scheme!r} is built in or reserved, "
                    f"and built-in rules win; plugins may add schemes other than "
                    f"{sorted(_BUILTIN_SCHEMES)}, {sorted(_RESERVED_SCHEMES)} and x-*"
                ),
                stacklevel=2,
            )
        elif scheme in found and found[scheme].value != entry_point.value:
            warnings.warn(
                AssetUriWarning(
                    f"ignoring the {SCHEME_PLUGIN_GROUP} entry point {entry_point.name!r} "
                    f"({entry_point.value}): {found[scheme].value} already handles the scheme "
                    f"{scheme!r}; uninstall one of the two"
                ),
                stacklevel=2,
            )
        else:
            found.setdefault(scheme, entry_point)
    return found


@functools.cache
def _scheme_plugin(scheme: str) -> tuple[SchemeNormalizer, str] | None:
    """Import the plugin for ``scheme`` the first time it is needed: ``(normalizer, source)``."""
    entry_point = _scheme_entry_points().get(scheme)
    if entry_point is None:
        return None
    normalizer = entry_point.load()
    if not callable(normalizer):
        raise TypeError(
            f"the {SCHEME_PLUGIN_GROUP} entry point {entry_point.name!r} loads "
            f"{entry_point.value} = {normalizer!r}, which is not callable: it must be a "
            f"function (SplitResult) -> SplitResult"
        )
    return normalizer, entry_point.value


def _run_plugin(
    plugin: tuple[SchemeNormalizer, str], scheme: str, shown: str, parts: SplitResult
) -> SplitResult:
    normalizer, source = plugin
    try:
        result = normalizer(parts)
    except InvalidAssetUri:
        raise
    except ValueError as exc:
        raise InvalidAssetUri(
            f"asset URI {shown} is rejected by the {scheme!r} scheme plugin {source}: {exc}"
        ) from exc
    if not isinstance(result, SplitResult):
        raise TypeError(
            f"the {scheme!r} scheme plugin {source} returned {result!r} for asset URI {shown}: "
            f"it must return a urllib.parse.SplitResult"
        )
    return result
