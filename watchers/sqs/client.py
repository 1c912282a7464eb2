"""The SQS API as a queue's session calls it: one client, transient errors retried, queue URLs.

The session, its deletes, its visibility changes and its dead letters all call the service
through one :class:`QueueClient`: it holds the connection pool sized for them and backs off on
throttling and server errors once the session is open.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from triggerer.backoff import backoff_s
from triggerer.connections import get_connection
from triggerer.triggers import SourceMissing
from watchers import aws

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from watchers.sqs.address import SqsQueue

#: The most messages one SQS call receives, deletes or changes the visibility of.
MAX_MESSAGES = 10
RETRY_MAX_S = 10.0
"""The longest wait between retries of a transient SQS error."""
_THROTTLING_CODES = frozenset(
    {"Throttling", "ThrottlingException", "RequestThrottled", "ServiceUnavailable"}
)
_CREDENTIAL_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


class QueueClient:
    """An SQS client for one queue (its URL once connected), closed with the session."""

    def __init__(self, log: FilteringBoundLogger) -> None:
        self._log = log
        self._exit_stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self.queue_url = ""
        #: Set once the session is open: from then on transient errors are retried.
        self.retrying = False

    async def connect(
        self, queue: SqsQueue, connection: str | None, *, pool_size: int, read_timeout_s: int
    ) -> None:
        """Create the client (credentials, region and endpoint from ``queue``, then from the
        named ``connection``) and find the queue's URL."""
        config = AioConfig(
            max_pool_connections=pool_size,
            read_timeout=read_timeout_s,
            retries={"mode": "standard"},
        )
        self._client = await self._exit_stack.enter_async_context(
            aws.session().create_client("sqs", config=config, **client_options(queue, connection))
        )
        self.queue_url = queue.url or await self.queue_url_of(queue.name)

    async def aclose(self) -> None:
        await self._exit_stack.aclose()

    async def call(self, operation: str, **arguments: Any) -> dict[str, Any]:
        """Call the SQS API, retrying transient errors with the project's backoff.

        Until the session is open an error is raised at once (after botocore's own retries):
        a watcher that cannot start fails, and the supervisor shows the error and restarts it.
        """
        attempt = 0
        while True:
            try:
                response: dict[str, Any] = await getattr(self._client, operation)(**arguments)
            except (ClientError, HTTPClientError, BotoConnectionError) as error:
                if not (self.retrying and _is_transient(error)):
                    raise
                attempt += 1
                delay_s = backoff_s(attempt, RETRY_MAX_S)
                self._log.warning(
                    "sqs_call_failed",
                    operation=operation,
                    error=str(error),
                    attempt=attempt,
                    retry_in_s=round(delay_s, 2),
                )
                await asyncio.sleep(delay_s)
            else:
                return response

    async def queue_url_of(self, name: str, account: str | None = None) -> str:
        """The URL of the queue ``name`` (of ``account``, else the caller's)."""
        arguments = {"QueueName": name}
        if account is not None:
            arguments["QueueOwnerAWSAccountId"] = account
        with self.missing_queue(name):
            response = await self.call("get_queue_url", **arguments)
        url: str = response["QueueUrl"]
        return url

    @contextlib.contextmanager
    def missing_queue(self, queue: str) -> Iterator[None]:
        """Turn the service's "no such queue" into a ``SourceMissing`` naming the queue."""
        try:
            yield
        except ClientError as error:
            if not is_missing_queue(error):
                raise
            raise SourceMissing(
                f"SQS queue {queue!r} does not exist at {self._client.meta.endpoint_url} "
                f"(region {self._client.meta.region_name}); create it or fix the queue name"
            ) from error


def client_options(queue: SqsQueue, connection: str | None) -> dict[str, Any]:
    """The SQS client's region, endpoint and credentials: those ``queue`` names, then the named
    ``connection``'s, then (left out) the environment's."""
    settings = {} if connection is None else get_connection(connection)
    credentials = {key: settings[key] for key in _CREDENTIAL_KEYS if key in settings}
    return {
        "region_name": queue.region_name or settings.get("region_name"),
        "endpoint_url": queue.endpoint_url or settings.get("endpoint_url"),
        **credentials,
    }


def is_missing_queue(error: ClientError) -> bool:
    """Whether the service answered that the queue does not exist."""
    return _error_code(error) in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")


def _is_transient(error: Exception) -> bool:
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return bool(status >= 500 or _error_code(error) in _THROTTLING_CODES)
    return True


def _error_code(error: ClientError) -> str:
    code: str = error.response.get("Error", {}).get("Code", "")
    return code
