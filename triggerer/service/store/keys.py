"""The identities the unique indexes hold: SHA-256 digests of canonical JSON, small whatever
they identify (a trigger's kwargs, an asset's 1500-character name and URI, a file's path)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def trigger_key(classpath: str, kwargs: Mapping[str, Any]) -> str:
    """The identity of a trigger: SHA-256 (hex) of the canonical JSON of ``[classpath, kwargs]``.

    Equal ``serialize()`` results give the same key however the kwargs are ordered, so assets
    watching the same trigger share one row. A digest rather than the JSON itself keeps the
    unique index small whatever the kwargs hold.
    """
    return _digest([classpath, dict(kwargs)])


def asset_identity_key(name: str, uri: str) -> str:
    """The identity of an asset: SHA-256 (hex) of the JSON of ``[name, uri]``.

    A unique index on the two 1500-character columns themselves could exceed PostgreSQL's
    B-tree row limit (2704 bytes); the digest cannot.
    """
    return _digest([name, uri])


def import_error_key(fileloc: str) -> str:
    """The identity of an import error: SHA-256 (hex) of the JSON of its path."""
    return _digest(fileloc)
