"""The child process of one run: a SparkSession, the pipeline function, and its outlets.

``python -m triggerer.service.runs.runner SPEC RESULT`` reads the run spec
(:mod:`triggerer.service.runs.spec`), runs the pipeline and writes what it emitted to RESULT. Its
stdout and stderr are the run log. In ``submit`` mode spark-submit runs this module as the
application; on Spark Connect a run is a fork of ``triggerer.service.runs.forker``, which calls
:func:`main` instead.
"""

from __future__ import annotations

import inspect
import json
import os
import runpy
import socket
import sys
import warnings
from collections.abc import MutableMapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
from pyspark.errors import PySparkAttributeError, PySparkNotImplementedError

from triggerer.assets import Asset, AssetAlias
from triggerer.context import AssetEvent, InletEvents, OutletEvents, RunContext
from triggerer.pipelines import Metadata, Pipeline
from triggerer.service.loader import import_pipeline_file
from triggerer.service.runs.lifeline import die_with_parent
from triggerer.service.runs.spec import InletAnswer, InletRequest, RunSpec, SpecEvent

TRACEPARENT_VARIABLE = "TRACEPARENT"
TRACESTATE_VARIABLE = "TRACESTATE"

# With pandas 3, PySpark 4 warns on each session that it "does not yet fully support pandas >=
# 3.0.0": a FutureWarning no pipeline can act on, printed into every run's log (and the run
# forker's, which imports this module before PySpark). Only that warning of PySpark's is
# silenced; its other warnings and pandas' own still show.
warnings.filterwarnings(
    "ignore",
    message="PySpark does not yet fully support pandas",
    category=FutureWarning,
    module=r"pyspark\.",
)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(argv if argv is not None else sys.argv[1:])
    # Started by the daemon (or forked by the run forker), this process is tied to it
    # already; in submit mode it is the child of spark-submit's JVM, and goes with it.
    die_with_parent()
    spec_path, result_path = arguments[:2]
    spec = RunSpec.read(Path(spec_path))
    # Before the pipeline's file is imported: what it starts (a Spark JVM, a tool) inherits it.
    trace_environment(os.environ, spec.trace_context)
    pipeline = _find_pipeline(spec)
    context = build_context(spec, pipeline)
    spark = _spark_session(spec, pipeline)
    try:
        if pipeline.application is not None:
            # An existing PySpark script: its getOrCreate() finds the session made here.
            runpy.run_path(
                str(Path(spec.fileloc).parent / pipeline.application), run_name="__main__"
            )
        else:
            assert pipeline.function is not None  # noqa: S101 - Pipeline has one or the other
            result = pipeline.function(spark, context)
            for item in result if inspect.isgenerator(result) else ():
                _apply(item, context)
    except (PySparkAttributeError, PySparkNotImplementedError) as error:
        if spec.spark.mode != "connect":
            raise
        raise ClassicSparkNeeded(
            f"{error}\nPipeline {pipeline.pipeline_id!r} uses what only classic Spark has "
            "(SparkContext, RDDs or the JVM), which Spark Connect does not offer: run it with "
            '[spark] mode = "classic" (a JVM of its own per run) or "submit"'
        ) from error
    finally:
        if spec.spark.mode != "submit":
            spark.stop()  # a Connect session is released on the server, a local JVM ends
    Path(result_path).write_text(json.dumps(collect_outlets(context)))
    return 0


def trace_environment(env: MutableMapping[str, str], trace_context: str | None) -> None:
    """Set ``TRACEPARENT`` in ``env`` to the run's trace context (a ``TRACESTATE`` inherited
    goes: it belonged to another), so that a tool that reads them (OpenTelemetry's
    environment carrier) starts its spans under the run's. Without one, ``env`` is left as
    it is."""
    if trace_context is not None:
        env.pop(TRACESTATE_VARIABLE, None)
        env[TRACEPARENT_VARIABLE] = trace_context


class ClassicSparkNeeded(RuntimeError):
    """A pipeline run on Spark Connect touched the classic-only API."""


def build_context(spec: RunSpec, pipeline: Pipeline) -> RunContext:
    """The :class:`RunContext` a run spec describes."""
    triggering: dict[Asset, list[AssetEvent]] = {}
    for event in map(_event, spec.triggering_events):
        triggering.setdefault(event.asset, []).append(event)
    return RunContext(
        run_id=spec.run_id,
        pipeline_id=spec.pipeline_id,
        triggering_asset_events=triggering,
        inlet_events=InletEvents(pipeline.inlets, partial(_inlet_events, spec.inlets_socket)),
        outlet_events=OutletEvents(pipeline.outlets),
        params=spec.params,
        partition_key=spec.partition_key,
        try_number=spec.try_number,
        trace_context=spec.trace_context,
    )


def collect_outlets(context: RunContext) -> dict[str, Any]:
    """What the run emits, as JSON: extras per outlet asset and additions through aliases."""
    return {
        "assets": [
            {"name": o.asset.name, "uri": o.asset.uri, "extra": o.extra}
            for o in context.outlet_events.assets()
        ],
        "alias_adds": [
            {"alias": a.alias.name, "name": asset.name, "uri": asset.uri, "extra": extra}
            for a in context.outlet_events.aliases()
            for asset, extra in a.added
        ],
    }


def _apply(item: object, context: RunContext) -> None:
    if not isinstance(item, Metadata):
        raise TypeError(f"a pipeline may only yield Metadata, got {type(item).__name__}")
    if item.alias is not None:
        context.outlet_events[item.alias].add(item.asset, extra=item.extra)
    else:
        context.outlet_events[item.asset].extra.update(item.extra)


def _event(event: SpecEvent) -> AssetEvent:
    return AssetEvent(
        id=event.id,
        asset=Asset(event.asset.name, event.asset.uri),
        extra=event.extra,
        timestamp=event.timestamp,
        source=event.source,
        partition_key=event.partition_key,
        source_run_id=event.source_run_id,
    )


def _inlet_events(socket_path: str | None, inlet: Asset | AssetAlias) -> list[AssetEvent]:
    """The events of ``inlet`` (an asset, or an alias: those emitted through it), asked of
    the daemon (``runs/inlets.py``)."""
    if socket_path is None:
        raise LookupError(
            f"the daemon serves this run no inlet events, yet {inlet!r} is an inlet: the "
            "pipeline's inlets changed after the run started; it reads them on its next run"
        )
    request = InletRequest(inlet.name, inlet.uri if isinstance(inlet, Asset) else None)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(socket_path)
        connection.sendall(msgspec.json.encode(request) + b"\n")
        answer = msgspec.json.decode(_received(connection), type=InletAnswer)
    if answer.error is not None:
        raise LookupError(f"inlet events of {inlet!r}: {answer.error}")
    return [_event(event) for event in answer.events]


def _received(connection: socket.socket) -> bytes:
    """Everything sent until the other end closes."""
    chunks = []
    while chunk := connection.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _find_pipeline(spec: RunSpec) -> Pipeline:
    folder = None if spec.pipelines_dir is None else Path(spec.pipelines_dir)
    pipelines = import_pipeline_file(Path(spec.fileloc), folder)
    if spec.pipeline_id not in pipelines:
        raise LookupError(f"pipeline {spec.pipeline_id!r} is no longer defined in {spec.fileloc}")
    return pipelines[spec.pipeline_id]


def _spark_session(spec: RunSpec, pipeline: Pipeline) -> Any:
    from pyspark.sql import SparkSession

    spark = spec.spark
    builder = SparkSession.builder.appName(spec.run_id)
    if spark.mode == "connect":
        assert spark.remote is not None  # noqa: S101 - the launcher sets it for connect mode
        # Also where an application script's own SparkSession.builder looks.
        os.environ["SPARK_REMOTE"] = spark.remote
        builder = builder.remote(spark.remote)
    conf = {**spark.conf, **pipeline.spark_conf}
    if spark.mode == "classic":
        from triggerer.service.runs.processes import spark_conf

        builder = builder.master(spark.master).config("spark.ui.enabled", "false")
        conf = spark_conf(spark.master, conf)  # a local JVM listens on loopback
    for key, value in conf.items():
        builder = builder.config(key, value)
    if spark.mode == "connect":
        # A new session of the server, its conf set in one request: getOrCreate() (which
        # finds no session in a new process either) would send the same request twice.
        return builder.create()
    return builder.getOrCreate()


if __name__ == "__main__":
    sys.exit(main())
