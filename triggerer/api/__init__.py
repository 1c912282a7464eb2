"""The REST API the daemon serves under ``/api/v1``."""

from triggerer.api.app import create_app
from triggerer.api.context import ApiContext

__all__ = ("ApiContext", "create_app")
