"""A run's process as the launcher starts it (and ``triggerer pipelines test``, in the
foreground): the spec it is handed, its argv and its environment for each ``[spark] mode``, and
how it ended."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import TYPE_CHECKING, Any

import anyio

from triggerer.service.runs import lifeline, runner
from triggerer.service.runs.processes import spark_conf, spark_env
from triggerer.service.runs.spec import RunSpec, SparkSpec

if TYPE_CHECKING:
    from pathlib import Path

    from triggerer.pipelines import Pipeline
    from triggerer.service.config import SparkSettings
    from triggerer.service.runs.spec import SpecEvent


def run_spec(
    pipeline: Pipeline,
    fileloc: str,
    spark: SparkSettings,
    *,
    run_id: str,
    try_number: int,
    partition_key: str | None,
    params: dict[str, Any],
    events: list[SpecEvent],
    pipelines_dir: str,
    local_server: str | None = None,
) -> RunSpec:
    """The spec of a try of ``pipeline`` (defined in ``fileloc``, imported as the files of
    ``pipelines_dir`` are) on the Spark of ``spark``, or as a client of ``local_server``,
    local mode's warm Connect server."""
    mode, remote = (spark.mode, spark.remote) if local_server is None else ("connect", local_server)
    return RunSpec(
        run_id=run_id,
        pipeline_id=pipeline.pipeline_id,
        fileloc=fileloc,
        application=pipeline.application,
        try_number=try_number,
        partition_key=partition_key,
        # Manual runs carry only what was given: the pipeline's defaults fill in the rest.
        params={**pipeline.params, **params},
        triggering_events=events,
        spark=SparkSpec(mode=mode, master=spark.master, remote=remote, conf=spark.conf),
        pipelines_dir=pipelines_dir,
    )


def run_env(spark: SparkSettings, trace_context: str | None = None) -> dict[str, str]:
    """The environment of a run's process on the Spark of ``spark`` (see :func:`spark_env`),
    with the run's ``TRACEPARENT`` (see :func:`runner.trace_environment`)."""
    # A run's own JVM (classic, submit) on a local master listens on loopback only.
    env = spark_env(spark.master if spark.mode in ("classic", "submit") else None)
    runner.trace_environment(env, trace_context)
    return env


def run_command(
    spark: SparkSettings, spec_path: Path, result_path: Path, spark_home: str
) -> list[str]:
    """A run's process: the runner, or spark-submit running it, started so that it dies with
    the process starting it, the daemon or the CLI (see :mod:`triggerer.service.runs.lifeline`).
    On Spark Connect the runner is the client itself (the daemon forks it instead)."""
    arguments = [str(spec_path), str(result_path)]
    if spark.mode == "submit":
        # [spark] conf goes to spark-submit: driver settings such as spark.driver.memory or
        # spark.pyspark.python only apply there, before the driver starts.
        conf = spark_conf(spark.master, spark.conf)
        confs = [f"--conf={key}={value}" for key, value in conf.items()]
        submit = os.path.join(spark_home, "bin", "spark-submit")
        run = [submit, "--master", spark.master, *confs, runner.__file__, *arguments]
    else:
        run = [sys.executable, "-m", "triggerer.service.runs.runner", *arguments]
    return lifeline.tied(run)


@dataclasses.dataclass(frozen=True)
class Ended:
    """How a try ended: with a result (success), an error, or interrupted (by shutdown, or a
    cancel)."""

    result: dict[str, Any] | None = None
    error: str | None = None
    interrupted: bool = False


async def ended(returncode: int, result_path: Path, see: str) -> Ended:
    """How a run's process that exited with ``returncode`` ended: its result file read, or an
    error that points to ``see`` (its log) for why."""
    if returncode != 0:
        return Ended(error=f"exit code {returncode}, see {see}")
    try:
        return Ended(result=json.loads(await anyio.Path(result_path).read_text()))
    except (OSError, ValueError) as error:
        return Ended(error=f"the run reported no outlets ({error}), see {see}")
