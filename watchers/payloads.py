"""Turning message bytes into JSON payloads, and dotted-path callables into functions."""

from __future__ import annotations

import base64
import importlib
from collections.abc import Callable
from typing import Any

import msgspec

_JSON = msgspec.json.Decoder()


def decode_body(raw: bytes | str | None) -> Any:
    """The decoded JSON when ``raw`` is JSON, else its UTF-8 text, else ``{"base64": ...}``.

    What decodes is strict JSON, so the result is always storable as JSON: ``NaN``, numbers
    that overflow a double and lone surrogate escapes make a body text, not JSON.
    """
    if raw is None:
        return None
    try:
        return _JSON.decode(raw)
    except msgspec.DecodeError:
        pass
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode("ascii")}


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
