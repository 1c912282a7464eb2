"""The one botocore session the AWS providers (SQS, Kinesis) make their clients from.

A session loads the service models and endpoint data, about 8 MB of memory each; the clients of
one session share them. A daemon watching a hundred SQS queues held 880 MB with a session per
client, 72 MB with this one. Credentials are still resolved per client where a client is given
them (``client_options``), and refreshable ones (an instance role) refresh as before.
"""

from __future__ import annotations

import functools

from aiobotocore.session import AioSession, get_session


@functools.cache
def session() -> AioSession:
    """The process's session, made at the first client."""
    return get_session()
