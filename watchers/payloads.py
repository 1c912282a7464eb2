"""Turning message bytes into JSON payloads, and dotted-path callables into functions."""

from __future__ import annotations

import base64
import importlib
from collections.abc import Callable
from typing import Any

import msgspec

_JSON = msgspec.json.Decoder()
_NUL_ESCAPE = "\\u0000"
_NUL_ESCAPE_BYTES = _NUL_ESCAPE.encode()


def decode_body(raw: bytes | str | None) -> Any:
    """The decoded JSON when ``raw`` is JSON the store can hold, else its UTF-8 text when that
    holds no NUL character, else ``{"base64": ...}`` of its bytes.

    What decodes is strict JSON: ``NaN``, numbers that overflow a double, lone surrogate
    escapes and nesting over about 1,000 levels make a body text, not JSON. So does the escape
    ``\\u0000`` anywhere in it, as a NUL character (U+0000) in a string is what PostgreSQL
    cannot store. Nothing is lost either way: the text is the message itself.
    """
    if raw is None:
        return None
    try:
        value = _JSON.decode(raw)
    # RecursionError: JSON nested deeper than the decoder goes (about 1,000 levels).
    except (msgspec.DecodeError, RecursionError):
        pass
    else:
        # JSON text has NUL characters only as this escape (a raw one is malformed).
        has_nul = _NUL_ESCAPE in raw if isinstance(raw, str) else _NUL_ESCAPE_BYTES in raw
        if not has_nul:
            return value
    text = raw if isinstance(raw, str) else _utf8(raw)
    if text is not None and "\x00" not in text:
        return text
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    return {"base64": base64.b64encode(data).decode("ascii")}


def _utf8(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def import_callable(dotted_path: str, *, option: str) -> Callable[..., Any]:
    """Import ``package.module.function``; ``option`` names the setting in error messages."""
    module_name, _, attribute = dotted_path.rpartition(".")
    if not module_name:
        raise ValueError(
            f"{option}={dotted_path!r} must be a dotted path 'package.module.function'"
        )
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"{option}={dotted_path!r} cannot be imported: {error}") from error
    if not callable(target):
        raise TypeError(f"{option}={dotted_path!r} is not callable")
    return target  # type: ignore[no-any-return]  # getattr is untyped; checked callable above
