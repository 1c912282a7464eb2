"""Logging: structlog for our events, the stdlib loggers of libraries routed through it."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from triggerer.service.config import LoggingSettings


def configure_logging(settings: LoggingSettings) -> None:
    """JSON lines in production (or when asked), readable console output on a terminal.

    Console output is coloured only on a terminal: written to a file (``format = "console"``
    with stderr redirected, as the demo does), it is plain text without escape codes.
    """
    terminal = sys.stderr.isatty()
    as_json = settings.format == "json" or (settings.format == "auto" and not terminal)
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=terminal)
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info if as_json else _keep,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level)
    # Client libraries are chatty at INFO; their warnings and errors still come through.
    for name in ("aiokafka", "botocore", "aiobotocore", "sqlalchemy", "alembic", "py4j"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))


def _keep(
    logger: object, method: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    return event
