"""Where an SQS queue lives: queue names, queue URLs and ``sqs://`` URIs."""

from __future__ import annotations

import dataclasses
import re
import urllib.parse

from watchers.uris import split_uri

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}(\.fifo)?")
_AWS_HOST = re.compile(r"sqs\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?")
_SQS_URI_FORM = "sqs://queue-name?region=..&endpoint_url=.."


@dataclasses.dataclass(frozen=True)
class SqsQueue:
    """Where a queue lives: its name, its URL when given, region and endpoint."""

    name: str
    url: str | None = None
    region_name: str | None = None
    endpoint_url: str | None = None


def parse_queue(
    queue: str, *, region_name: str | None = None, endpoint_url: str | None = None
) -> SqsQueue:
    """Parse a queue name, a queue URL or an ``sqs://`` URI; keyword arguments fill the gaps.

    A region or endpoint given both in the URI and as a keyword must agree.
    """
    parts = urllib.parse.urlsplit(queue)
    scheme = parts.scheme.lower()
    if scheme == "sqs":
        parts, options = split_uri(
            queue,
            kind="SQS",
            form=_SQS_URI_FORM,
            schemes=("sqs",),
            options=("region", "endpoint_url"),
        )
        if parts.path not in ("", "/") or not parts.netloc:
            raise ValueError(f"SQS URI {queue!r} must have the form {_SQS_URI_FORM}")
        name = _check_name(parts.netloc, queue)
        region = _agree(queue, "region", options.get("region"), region_name)
        endpoint = _agree(queue, "endpoint_url", options.get("endpoint_url"), endpoint_url)
        return SqsQueue(name, None, region, endpoint)
    if scheme in ("http", "https"):
        segments = [segment for segment in parts.path.split("/") if segment]
        if not segments:
            raise ValueError(
                f"SQS queue URL {queue!r} has no queue name; expected "
                "https://sqs.<region>.amazonaws.com/<account>/<name>"
            )
        name = _check_name(segments[-1], queue)
        host = _AWS_HOST.fullmatch(parts.hostname or "")
        if host is not None:
            return SqsQueue(name, queue, _agree(queue, "region", host.group(1), region_name), None)
        return SqsQueue(name, queue, region_name, endpoint_url or f"{scheme}://{parts.netloc}")
    if not parts.scheme and _QUEUE_NAME.fullmatch(queue):
        return SqsQueue(queue, None, region_name, endpoint_url)
    raise ValueError(
        f"SQS queue {queue!r} is not a queue name, a queue URL "
        f"(https://sqs.<region>.amazonaws.com/<account>/<name>) or a URI ({_SQS_URI_FORM})"
    )


def is_sqs_queue_url(url: str) -> bool:
    """Whether an http(s) URL looks like an SQS queue URL (AWS host, or ``/<account>/<name>``)."""
    parts = urllib.parse.urlsplit(url)
    if _AWS_HOST.fullmatch(parts.hostname or ""):
        return True
    return re.fullmatch(r"/\d{12}/[A-Za-z0-9_.-]+/?", parts.path) is not None


def _check_name(name: str, queue: str) -> str:
    if not _QUEUE_NAME.fullmatch(name):
        raise ValueError(
            f"SQS queue {queue!r}: queue name {name!r} must be 1-80 letters, digits, '-' or '_' "
            "(with '.fifo' for a FIFO queue)"
        )
    return name


def _agree(queue: str, option: str, in_uri: str | None, keyword: str | None) -> str | None:
    if in_uri and keyword and in_uri != keyword:
        raise ValueError(f"SQS queue {queue!r} says {option}={in_uri!r} but {keyword!r} was given")
    return in_uri or keyword
