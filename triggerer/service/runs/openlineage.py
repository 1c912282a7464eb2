"""What a run is in OpenLineage's terms: its datasets, its ids, its run events (pure logic).

A triggerer run is one OpenLineage run of the job named by its pipeline id, in the job namespace
of ``[openlineage] namespace``. Its inputs are the assets of the events it consumed, its outputs
the assets it emitted events on (through aliases too), and the run that produced its latest
triggering event is its parent (``ParentRunFacet``).

Datasets are named from canonical asset URIs (:mod:`triggerer.uri`) by OpenLineage's naming
spec (namespace = the data source, name = the dataset in it):

============================  ==========================  ==============================
asset URI                     dataset namespace           dataset name
============================  ==========================  ==============================
``s3://bucket/a/b``           ``s3://bucket``             ``a/b`` (the object key)
``gs://bucket/a/b``           ``gs://bucket``             ``a/b``
``s3://bucket/`` (a bucket)   ``s3://bucket``             ``/``
``postgres://h:5432/d/s/t``   ``postgres://h:5432``       ``d.s.t``
``file:///data/in``           ``file``                    ``/data/in``
``kafka://h1:9092,h2/topic``  ``kafka://h1:9092``         ``topic``
``orders`` (no scheme)        the job namespace           ``orders``
any other ``scheme://a/p?q``  ``scheme://a``              ``/p?q`` (``/`` when empty)
``scheme:opaque``             ``scheme``                  ``opaque``
``x-db://[bad/t`` (no URL)    the job namespace           ``x-db://[bad/t`` (as given)
============================  ==========================  ==============================

A user name in an authority is left out of the namespace (a data source is its host, whoever
reads it). Kafka's namespace is the first bootstrap server, with port 9092 when none is given.

A run id is a UUID in OpenLineage; triggerer's run ids (``pipeline__asset__1``) are not, so
each is mapped to ``uuid5`` of the job namespace and the run id: the same run always has the
same OpenLineage id, which is how a downstream run names its parent from the parent's run id
alone. Two deployments that share a backend need namespaces of their own, as their job names
would collide too.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Literal
from urllib.parse import SplitResult, urlsplit

from openlineage.client.event_v2 import (
    InputDataset,
    Job,
    OutputDataset,
    Run,
    RunEvent,
    RunState,
)
from openlineage.client.facet_v2 import error_message_run, job_type_job, parent_run

__all__ = (
    "KAFKA_DEFAULT_PORT",
    "RUN_ID_NAMESPACE",
    "DatasetId",
    "EventType",
    "ParentRun",
    "RunLineage",
    "dataset_id",
    "run_event",
    "run_uuid",
)

RUN_ID_NAMESPACE = uuid.UUID("5d1c0a52-6a43-5c2e-9a2f-8f6d2b7c1e40")
"""The ``uuid5`` namespace of OpenLineage run ids made from triggerer run ids. Never change
it: a changed value splits every run from the parents and children already sent."""

KAFKA_DEFAULT_PORT = 9092

EventType = Literal["START", "COMPLETE", "FAIL", "ABORT"]
"""The run events triggerer sends: a run's start, and its three ways to end."""


def _producer() -> str:
    try:
        return f"urn:triggerer:{version('triggerer')}"
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "urn:triggerer"


PRODUCER = _producer()
"""The ``producer`` of every event: which program, and which version of it, sent it."""


@dataclasses.dataclass(frozen=True)
class DatasetId:
    """An OpenLineage dataset's identity: its data source and its name in it."""

    namespace: str
    name: str


@dataclasses.dataclass(frozen=True)
class ParentRun:
    """The run that produced a run's (latest) triggering event."""

    run_id: str
    pipeline_id: str


@dataclasses.dataclass(frozen=True)
class RunLineage:
    """What OpenLineage is told of a run: its ids and the URIs of its inputs and outputs."""

    run_id: str
    pipeline_id: str
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    parent: ParentRun | None = None


def run_uuid(namespace: str, run_id: str) -> str:
    """The OpenLineage run id of the triggerer run ``run_id`` in the job ``namespace``."""
    return str(uuid.uuid5(RUN_ID_NAMESPACE, f"{namespace}/{run_id}"))


def dataset_id(uri: str, job_namespace: str) -> DatasetId:
    """The OpenLineage dataset of the canonical asset URI ``uri`` (see the module docstring);
    scheme-less URIs, and URIs that do not parse as URLs, are datasets of ``job_namespace``."""
    scheme, colon, rest = uri.partition(":")
    if not colon or not _is_scheme(scheme):
        return DatasetId(job_namespace, uri)
    scheme = scheme.lower()
    if not rest.startswith("//"):
        return DatasetId(scheme, rest or "/")
    try:
        parts = urlsplit(uri)
    # An ``x-`` URI is stored as given, so it need not parse as a URL (an unclosed IPv6 host):
    # its dataset is the URI itself, like a scheme-less one's.
    except ValueError:
        return DatasetId(job_namespace, uri)
    host = parts.netloc.rpartition("@")[2]
    if scheme in ("s3", "gs"):
        return DatasetId(f"{scheme}://{host}", parts.path.lstrip("/") or "/")
    if scheme == "postgres":
        return DatasetId(f"postgres://{host}", ".".join(parts.path.strip("/").split("/")))
    if scheme == "file":
        return DatasetId("file", parts.path or "/")
    if scheme == "kafka":
        return DatasetId(f"kafka://{_first_server(host)}", parts.path.lstrip("/") or "/")
    return DatasetId(f"{scheme}://{host}", _path_and_query(parts))


def _is_scheme(text: str) -> bool:
    """RFC 3986's scheme grammar: a letter, then letters, digits, ``+``, ``-`` or ``.``."""
    return (
        bool(text)
        and text[0].isascii()
        and text[0].isalpha()
        and all(c.isascii() and (c.isalnum() or c in "+-.") for c in text)
    )


def _first_server(servers: str) -> str:
    first = servers.split(",")[0]
    if first.startswith("["):  # an IPv6 address: [addr] or [addr]:port
        return first if "]:" in first else f"{first}:{KAFKA_DEFAULT_PORT}"
    return first if ":" in first else f"{first}:{KAFKA_DEFAULT_PORT}"


def _path_and_query(parts: SplitResult) -> str:
    path = parts.path or "/"
    return f"{path}?{parts.query}" if parts.query else path


def run_event(
    lineage: RunLineage,
    state: EventType,
    at: datetime,
    namespace: str,
    *,
    error: str | None = None,
) -> RunEvent:
    """The OpenLineage ``RunEvent`` of ``lineage`` entering ``state`` at ``at``.

    Every event names the run's inputs; ``COMPLETE`` its outputs too (a run that did not succeed
    emitted nothing). ``error`` goes into an ``errorMessage`` facet.
    """
    facets: dict[str, object] = {}
    if lineage.parent is not None:
        facets["parent"] = parent_run.ParentRunFacet(
            run=parent_run.Run(runId=run_uuid(namespace, lineage.parent.run_id)),
            job=parent_run.Job(namespace=namespace, name=lineage.parent.pipeline_id),
            producer=PRODUCER,
        )
    if error is not None:
        facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=error, programmingLanguage="python", producer=PRODUCER
        )
    job_facets = {
        "jobType": job_type_job.JobTypeJobFacet(
            processingType="BATCH", integration="TRIGGERER", jobType="PIPELINE", producer=PRODUCER
        )
    }
    inputs = [
        InputDataset(namespace=d.namespace, name=d.name)
        for d in _datasets(lineage.inputs, namespace)
    ]
    outputs = [
        OutputDataset(namespace=d.namespace, name=d.name)
        for d in _datasets(lineage.outputs if state == "COMPLETE" else (), namespace)
    ]
    return RunEvent(
        eventType=RunState(state),
        eventTime=at.isoformat(),
        run=Run(runId=run_uuid(namespace, lineage.run_id), facets=facets),  # type: ignore[arg-type]  # the facets' own classes
        job=Job(namespace=namespace, name=lineage.pipeline_id, facets=job_facets),  # type: ignore[arg-type]
        inputs=inputs,
        outputs=outputs,
        producer=PRODUCER,
    )


def _datasets(uris: tuple[str, ...], namespace: str) -> list[DatasetId]:
    """The datasets of ``uris``, each once, in order of first appearance."""
    return list(dict.fromkeys(dataset_id(uri, namespace) for uri in uris))
