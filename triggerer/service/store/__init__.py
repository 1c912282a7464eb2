"""The metadata store: tables, engines and schema migrations."""

from triggerer.service.store.engine import async_url, create_engine, session_factory
from triggerer.service.store.migrate import current_revision, head_revision, upgrade

__all__ = (
    "async_url",
    "create_engine",
    "current_revision",
    "head_revision",
    "session_factory",
    "upgrade",
)
