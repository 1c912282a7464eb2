"""``triggerer pipelines test``: one run of a pipeline in the foreground, as ``airflow dags test``
runs a DAG: on the configured Spark, with triggering events given on the command line, its log
on this terminal as it goes, and no daemon; nothing is written to the store.

The run is the daemon's own child process (:mod:`triggerer.service.runs.runner`, its spec and
argv from :mod:`triggerer.service.runs.run_process`), with two differences:

- ``[spark] mode = "local"`` runs it on classic Spark on ``[spark] master`` (a JVM of the run's
  own) rather than on a Spark Connect server started for one run: one JVM instead of a server's
  and a client's, so it starts sooner. A pipeline that works only on classic Spark passes here
  and fails under the daemon's local mode; the verb says which Spark it ran on.
- Inlet events are read from the configured store, read-only, as the daemon serves them; with no
  store to read (none yet, another schema, not answering), reading an inlet fails the run with
  the reason. A pipeline without inlets never opens the store.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

from triggerer.service.cli.output import loading, say
from triggerer.service.cli.store import CliError, with_store
from triggerer.service.cli.verbs import verb

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from triggerer.pipelines import Pipeline
    from triggerer.service.config import Settings, SparkSettings
    from triggerer.service.runs.run_process import Ended
    from triggerer.service.runs.spec import RunSpec, SpecEvent


class GivenEvent(NamedTuple):
    """An ``--event ASSET=JSON``: an asset's name or URI, and the event's extra."""

    asset: str
    extra: dict[str, Any]


def add_verb(pipelines: Any) -> None:
    """``pipelines test`` in the ``pipelines`` group of verbs."""
    test = verb(
        pipelines,
        "test",
        _test,
        "run a pipeline once in the foreground on the configured Spark, with the given "
        "triggering events; no daemon, nothing written to the store",
    )
    test.add_argument("pipeline_id")
    test.add_argument(
        "--event",
        dest="events",
        action="append",
        default=[],
        type=event_arg,
        metavar="ASSET=JSON",
        help="a triggering event: an asset's name or URI (of the schedule, or an inlet) and "
        "its extra as a JSON object; repeat for more, in order",
    )
    test.add_argument(
        "--params",
        type=params_arg,
        default={},
        metavar="JSON",
        help="a JSON object over the pipeline's params, as a manual run takes it",
    )


def event_arg(text: str) -> GivenEvent:
    """``ASSET=JSON``, cut at the first ``=`` followed by JSON: a URI may hold ``=`` itself
    (``s3://lake/orders?v=2={...}``), as may the JSON (``orders={"q": "a=b"}``)."""
    cuts = [at for at, character in enumerate(text) if character == "="]
    if not cuts:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not ASSET=JSON, e.g. orders='{{\"rows\": 10}}'"
        )
    for cut in cuts:
        try:
            json.loads(text[cut + 1 :])
        except ValueError:
            continue
        break
    else:
        cut = cuts[0]  # JSON after none of them: the error names what follows the first
    asset, extra = text[:cut], text[cut + 1 :]
    if not asset:
        raise argparse.ArgumentTypeError(f"{text!r} names no asset before '=' (ASSET=JSON)")
    return GivenEvent(asset, _json_object(extra, f"the extra of {asset!r}"))


def params_arg(text: str) -> dict[str, Any]:
    return _json_object(text, "the params")


def _json_object(text: str, what: str) -> dict[str, Any]:
    """``text`` as a JSON object as the store keeps one (no NaN or infinities)."""
    from triggerer.triggers import check_json

    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{what} is not JSON ({error}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f'{what} must be a JSON object, e.g. {{"rows": 10}}, got {text!r}'
        )
    try:
        check_json(value, what)
    except TypeError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def triggering_events(pipeline: Pipeline, given: Sequence[GivenEvent]) -> list[SpecEvent]:
    """``given`` as the run's triggering events, in their order (numbered from 1, stamped now,
    their source ``cli``). Each names, by name or URI, an asset of the pipeline's schedule or an
    asset inlet (an alias inlet's events are the store's); on a schedule with an alias, any
    asset (``Asset(ASSET)``), since only a run adds assets to an alias."""
    from datetime import UTC, datetime

    from triggerer.assets import Asset
    from triggerer.service.runs.spec import SpecAsset, SpecEvent
    from triggerer.service.store.states import EventSource

    condition = pipeline.condition
    inlets = [inlet for inlet in pipeline.inlets if isinstance(inlet, Asset)]
    known = list(dict.fromkeys([*(condition.iter_assets() if condition else ()), *inlets]))
    by_key = {key: asset for asset in known for key in (asset.name, asset.uri)}
    aliased = condition is not None and any(True for _ in condition.iter_aliases())
    now = datetime.now(UTC)
    events = []
    for number, event in enumerate(given, start=1):
        asset = by_key.get(event.asset)
        if asset is None and aliased:
            try:
                asset = Asset(event.asset)
            except ValueError as error:
                raise CliError(f"--event {event.asset}=...: {error}") from None
        if asset is None:
            raise CliError(f"--event {event.asset}=...: {_unknown(pipeline, event.asset, known)}")
        events.append(
            SpecEvent(
                id=number,
                asset=SpecAsset(asset.name, asset.uri),
                extra=event.extra,
                timestamp=now,
                source=EventSource.CLI,
                partition_key=None,
                source_run_id=None,
            )
        )
    return events


def _unknown(pipeline: Pipeline, name: str, known: Sequence[Any]) -> str:
    if not known:
        inlets = "only alias inlets" if pipeline.inlets else "no inlets"
        return (
            f"pipeline {pipeline.pipeline_id!r} is scheduled on no asset and has {inlets}: "
            "test it without --event, as a manual run"
        )
    names = ", ".join(
        asset.name if asset.name == asset.uri else f"{asset.name} ({asset.uri})" for asset in known
    )
    return (
        f"pipeline {pipeline.pipeline_id!r} knows no asset {name!r}; give one of its "
        f"schedule's assets or inlets, by name or URI: {names}"
    )


def foreground_spark(spark: SparkSettings) -> SparkSettings:
    """The Spark a test run uses: the configured one, but classic Spark on ``[spark] master``
    for ``local`` mode (see the module docstring)."""
    return spark.model_copy(update={"mode": "classic"}) if spark.mode == "local" else spark


def spark_named(spark: SparkSettings, configured: str) -> str:
    """The Spark a test run uses, in words; ``configured`` is the mode of the config."""
    if spark.mode == "connect":
        return f"Spark Connect at {spark.remote}"
    if spark.mode == "submit":
        return f"spark-submit to master {spark.master}"
    if configured == "local":
        return (
            f"classic Spark on master {spark.master} (for local mode: the daemon runs it on a "
            "Spark Connect server instead, which has no SparkContext or RDDs)"
        )
    return f"classic Spark on master {spark.master}"


SHOWN_PIPELINES = 20
"""How many of the folder's pipelines an unknown id's error names."""


async def find_pipeline(settings: Settings, pipeline_id: str) -> Pipeline:
    """``pipeline_id`` of the configured pipelines folder; an error naming the folder, its
    pipelines and the files that failed to load when it has none of that id."""
    from triggerer.service.loader import load_pipelines

    folder = settings.pipelines.dir
    loaded = await loading(lambda: load_pipelines(folder))
    pipeline = loaded.pipelines.get(pipeline_id)
    if pipeline is not None:
        return pipeline
    defined = ", ".join(sorted(loaded.pipelines)[:SHOWN_PIPELINES]) or "none"
    if len(loaded.pipelines) > SHOWN_PIPELINES:
        defined += f" and {len(loaded.pipelines) - SHOWN_PIPELINES} more"
    failed = "".join(f"\n  {error}" for error in loaded.errors)
    failed = f"; files that failed to load:{failed}" if failed else ""
    raise CliError(f"no pipeline {pipeline_id!r} in {folder} (its pipelines: {defined}){failed}")


async def _test(settings: Settings, arguments: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from triggerer.service.runs.run_process import run_spec
    from triggerer.service.scheduling.schedule_queries import compose_run_id

    pipeline = await find_pipeline(settings, arguments.pipeline_id)
    events = triggering_events(pipeline, arguments.events)
    assert pipeline.fileloc is not None  # noqa: S101 - the loader sets it on every pipeline
    spark = foreground_spark(settings.spark)
    started = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    spec = run_spec(
        pipeline,
        pipeline.fileloc,
        spark,
        run_id=compose_run_id(pipeline.pipeline_id, "test", started),
        try_number=1,
        partition_key=None,
        params=arguments.params,
        events=events,
        pipelines_dir=str(settings.pipelines.dir),
    )
    _note(
        f"run {spec.run_id} of {pipeline.fileloc} with {len(events)} triggering event(s); "
        "nothing is written to the store"
    )
    _note(f"on {spark_named(spark, settings.spark.mode)}")
    outcome = await _with_inlets(settings, pipeline, spec, spark)
    if outcome.result is None:
        raise CliError(f"the run failed: {outcome.error}; nothing was written to the store")
    _report(spec.run_id, outcome.result)
    return 0


async def _with_inlets(
    settings: Settings, pipeline: Pipeline, spec: RunSpec, spark: SparkSettings
) -> Ended:
    """The run, its inlets served from the store (read-only) while it runs, or with the reason
    there is no store to read them from."""
    from triggerer.service.runs.inlets import serving

    if not pipeline.inlets:
        return await _run(spec, spark, pipeline.timeout_s)

    async def run(sessions: async_sessionmaker[AsyncSession] | None, unavailable: str) -> Ended:
        import msgspec

        async with serving(sessions, pipeline.inlets, unavailable) as socket:
            inlets = msgspec.structs.replace(spec, inlets_socket=socket)
            return await _run(inlets, spark, pipeline.timeout_s)

    opened = False

    async def from_store(sessions: async_sessionmaker[AsyncSession]) -> Ended:
        nonlocal opened
        opened = True
        return await run(sessions, "")

    try:
        return await with_store(settings, from_store)
    except CliError as error:
        if opened:  # not about opening the store: the store failed later, as it would the run
            raise
        _note(f"the pipeline's inlets have no events to read: {error}")
        return await run(
            None, f"pipelines test reads inlet events from the configured store: {error}"
        )


async def _run(spec: RunSpec, spark: SparkSettings, timeout_s: float | None) -> Ended:
    """Run ``spec``'s process in the foreground, its output on this process's: how it ended,
    with what it emits (its result file) or why it failed. Cancelled (Ctrl-C), it is stopped
    first."""
    import math
    import subprocess
    import tempfile
    from pathlib import Path

    import anyio
    import msgspec

    from triggerer.service.runs.processes import terminate
    from triggerer.service.runs.run_process import Ended, ended, run_command, run_env

    with tempfile.TemporaryDirectory(prefix="triggerer-test-") as folder:  # mode 0700
        spec_path, result_path = Path(folder, "spec.json"), Path(folder, "result.json")
        await anyio.Path(spec_path).write_bytes(msgspec.json.encode(spec))
        # Unbuffered: a pipeline's prints show as it makes them, through a pipe (| tee) too.
        env = {"PYTHONUNBUFFERED": "1", **run_env(spark)}
        command = run_command(spark, spec_path, result_path, env["SPARK_HOME"])
        # A process group of its own, as the daemon starts a run: terminate() stops the whole
        # tree (the JVM too), and the terminal's Ctrl-C reaches this process alone, which
        # stops it then.
        process = await anyio.open_process(
            command,
            stdin=subprocess.DEVNULL,
            stdout=None,
            stderr=None,
            env=env,
            start_new_session=True,
        )
        try:
            with anyio.move_on_after(math.inf if timeout_s is None else timeout_s) as limit:
                code = await process.wait()
        finally:
            if process.returncode is None:  # cancelled (Ctrl-C), or past its timeout_s
                with anyio.CancelScope(shield=True):
                    await terminate(process)
        if limit.cancelled_caught:
            return Ended(error=f"timed out after {timeout_s:g} s (timeout_s), see above")
        return await ended(code, result_path, "above")


def _report(run_id: str, result: dict[str, Any]) -> None:
    """What the run would have emitted, had the daemon run it."""
    lines = [f"  {_asset(o)}  {json.dumps(o['extra'])}" for o in result["assets"]]
    lines += [
        f"  {_asset(add)} through alias {add['alias']}  {json.dumps(add['extra'])}"
        for add in result["alias_adds"]
    ]
    say(
        f"run {run_id} succeeded. Nothing was written to the store; under the daemon it "
        f"would emit {len(lines)} event(s){':' if lines else '.'}"
    )
    for line in lines:
        say(line)


def _asset(outlet: dict[str, Any]) -> str:
    name, uri = outlet["name"], outlet["uri"]
    return name if name == uri else f"{name} ({uri})"


def _note(text: str) -> None:
    """A line about the test itself, on stderr beside the run's log."""
    sys.stderr.write(f"pipelines test: {text}\n")
    sys.stderr.flush()
