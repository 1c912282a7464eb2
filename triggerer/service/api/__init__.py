"""The REST API the daemon serves under ``/api/v1``."""

from triggerer.service.api.app import create_app
from triggerer.service.api.context import ApiContext

__all__ = ("ApiContext", "create_app")
