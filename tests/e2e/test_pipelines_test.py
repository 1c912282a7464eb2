"""``triggerer pipelines test`` as users run it: the CLI as a process with ``--config FILE``
(SQLite in the test's folder), on real Spark. A run sees the events and params given, in
order, streams its output as it goes, and prints its outlet events; a raising pipeline exits 1
with its traceback; bad arguments are errors naming them; inlet events come from the store,
read-only, or the run says there is none; Ctrl-C stops the run; nothing is ever written to
the store. The runs are clients of the session's Spark Connect server (``connect`` mode: no
JVM of their own); local mode, on a JVM of the run's own, is the one slow test."""

from __future__ import annotations

import json
import signal
import subprocess
from typing import TYPE_CHECKING

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from tests.e2e.daemon import (
    TRIGGERER_BIN,
    alive,
    events_of,
    local_config,
    query,
    runs,
    sqlite_url,
    triggerer_cli,
    without_triggerer_variables,
    write_pipelines,
)
from triggerer.service import actions
from triggerer.service.loader import load_pipelines
from triggerer.service.principals import cli_principal
from triggerer.service.scheduling.registry import sync_definitions
from triggerer.service.store import create_engine, session_factory, upgrade

if TYPE_CHECKING:
    from pathlib import Path

    from anyio.abc import Process

RUN_TIMEOUT_S = 180.0
"""A run's start (an interpreter, PySpark, a session of the server) on 2 busy cores."""
NO_SPARK = "sc://127.0.0.1:1"  # for the tests whose command fails before any run

PIPELINES = """
import json
import os
import time
from pathlib import Path

from triggerer import Asset, AssetAlias, Metadata, pipeline

orders = Asset("orders")
customers = Asset("customers", "s3://lake/customers")
joined = Asset("joined")
days = AssetAlias("days")
raw = Asset("raw")


@pipeline(schedule=orders & customers, outlets=[joined, days], params={"limit": 5, "region": "eu"})
def join(spark, context):
    seen = {
        asset.name: [[event.id, event.extra] for event in events]
        for asset, events in context.triggering_asset_events.items()
    }
    print("SEEN", json.dumps({"events": seen, "params": context.params}))  # no flush
    while not Path(RELEASE).exists():  # the test reads the line above meanwhile
        time.sleep(0.05)
    yield Metadata(joined, {"rows": spark.range(4).count()})
    yield Metadata(Asset("s3://lake/day=1"), {"day": 1}, alias=days)


@pipeline(schedule=orders)
def fails(spark, context):
    raise RuntimeError("the orders are bad")


@pipeline(inlets=[raw, days])
def reads_inlets(spark, context):
    print("INLET", json.dumps([[event.id, event.extra] for event in context.inlet_events[raw]]))
    print("ALIAS", json.dumps([event.extra for event in context.inlet_events[days]]))


@pipeline()
def held(spark, context):
    print("PID", os.getpid())
    while True:  # until the test's Ctrl-C stops it
        time.sleep(0.05)
"""


def given(tmp_path: Path, spark_remote: str) -> tuple[Path, Path]:
    """The pipelines folder written, and a config for the Spark Connect server at
    ``spark_remote``: the config file, and the release file that ``join`` waits for."""
    release = tmp_path / "release"
    write_pipelines(tmp_path / "pipelines", PIPELINES.replace("RELEASE", repr(str(release))))
    return local_config(tmp_path, "connect", remote=spark_remote), release


def store_file(tmp_path: Path) -> Path:
    return tmp_path / "triggerer.db"  # sqlite_url's


async def pipelines_test(config: Path, *arguments: str) -> subprocess.CompletedProcess[bytes]:
    return await triggerer_cli(
        without_triggerer_variables(), "--config", str(config), "pipelines", "test", *arguments
    )


async def started(config: Path, stderr: Path, *arguments: str) -> Process:
    """``triggerer pipelines test ARGUMENTS`` started, its stdout a pipe, its stderr ``stderr``."""
    with stderr.open("wb") as errors:
        return await anyio.open_process(
            [str(TRIGGERER_BIN), "--config", str(config), "pipelines", "test", *arguments],
            stdout=subprocess.PIPE,
            stderr=errors,
            env=without_triggerer_variables(),
        )


async def line_starting(stream: BufferedByteReceiveStream, prefix: bytes) -> bytes:
    """The first line of ``stream`` from here that starts with ``prefix``."""
    with anyio.fail_after(RUN_TIMEOUT_S):
        while not (line := await stream.receive_until(b"\n", 1 << 20)).startswith(prefix):
            pass
    return line.removeprefix(prefix)


async def the_rest(stream: BufferedByteReceiveStream) -> str:
    chunks = []
    with anyio.fail_after(RUN_TIMEOUT_S):
        try:
            while True:
                chunks.append(await stream.receive())
        except anyio.EndOfStream:
            pass
    return b"".join(chunks).decode()


@pytest.mark.timeout(300)
async def test_a_run_sees_the_events_and_params_given_streams_its_output_and_writes_nothing(
    tmp_path: Path, spark_remote: str
) -> None:
    config, release = given(tmp_path, spark_remote)
    events = ['orders={"n": 1}', 's3://lake/customers={"c": 1}', 'orders={"n": 2}']
    arguments = ["join", *(f"--event={event}" for event in events), "--params", '{"limit": 7}']
    cli = await started(config, tmp_path / "stderr", *arguments)
    async with cli:
        assert cli.stdout is not None
        stdout = BufferedByteReceiveStream(cli.stdout)
        # The pipeline waits until the test has read this line: its output comes as it goes.
        seen = json.loads(await line_starting(stdout, b"SEEN "))
        release.touch()
        rest = await the_rest(stdout)
        code = await cli.wait()
    stderr = (tmp_path / "stderr").read_text()

    assert code == 0, stderr
    assert seen == {
        # Given as ids 1, 2, 3 in order; each asset's events keep theirs.
        "events": {"orders": [[1, {"n": 1}], [3, {"n": 2}]], "customers": [[2, {"c": 1}]]},
        "params": {"limit": 7, "region": "eu"},
    }
    assert "Nothing was written to the store; under the daemon it would emit 2 event(s):" in rest
    assert '\n  joined  {"rows": 4}\n' in rest
    assert '\n  s3://lake/day=1 through alias days  {"day": 1}\n' in rest
    assert f"on Spark Connect at {spark_remote}" in stderr
    assert not store_file(tmp_path).exists()


@pytest.mark.timeout(300)
async def test_a_raising_pipeline_exits_1_with_its_traceback(
    tmp_path: Path, spark_remote: str
) -> None:
    config, _ = given(tmp_path, spark_remote)
    done = await pipelines_test(config, "fails", "--event", 'orders={"n": 1}')
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert "Traceback (most recent call last):" in stderr
    assert 'raise RuntimeError("the orders are bad")' in stderr
    assert "RuntimeError: the orders are bad" in stderr
    assert stderr.endswith(
        "triggerer: the run failed: exit code 1, see above; nothing was written to the store\n"
    )
    assert "succeeded" not in done.stdout.decode()
    assert not store_file(tmp_path).exists()


@pytest.mark.parametrize(
    ("arguments", "code", "error"),
    [
        (
            ["join", "--event", "orders"],
            2,
            """argument --event: 'orders' is not ASSET=JSON, e.g. orders='{"rows": 10}'""",
        ),
        (
            ["join", "--event", "orders=[1]"],
            2,
            "argument --event: the extra of 'orders' must be a JSON object, "
            """e.g. {"rows": 10}, got '[1]'""",
        ),
        (
            ["join", "--event", "orders={rows: 1}"],
            2,
            "argument --event: the extra of 'orders' is not JSON (Expecting property name "
            "enclosed in double quotes: line 1 column 2 (char 1)): '{rows: 1}'",
        ),
        (
            ["join", "--params", '"eu"'],
            2,
            """argument --params: the params must be a JSON object, e.g. {"rows": 10}, """
            """got '"eu"'""",
        ),
        (
            ["join", "--event", "payments={}"],
            1,
            "triggerer: --event payments=...: pipeline 'join' knows no asset 'payments'; give "
            "one of its schedule's assets or inlets, by name or URI: orders, "
            "customers (s3://lake/customers)",
        ),
        (
            ["held", "--event", "orders={}"],
            1,
            "triggerer: --event orders=...: pipeline 'held' is scheduled on no asset and has no "
            "inlets: test it without --event, as a manual run",
        ),
    ],
)
async def test_a_bad_argument_is_an_error_naming_it(
    tmp_path: Path, arguments: list[str], code: int, error: str
) -> None:
    config, _ = given(tmp_path, NO_SPARK)
    done = await pipelines_test(config, *arguments)
    assert (done.returncode, done.stdout) == (code, b"")
    assert error in done.stderr.decode()
    assert not store_file(tmp_path).exists()


async def test_an_unknown_pipeline_is_an_error_naming_the_folder_and_its_broken_files(
    tmp_path: Path,
) -> None:
    config, _ = given(tmp_path, NO_SPARK)
    broken = write_pipelines(tmp_path / "pipelines", "import no_such_module\n", "broken.py")
    done = await pipelines_test(config, "join_orders")
    assert (done.returncode, done.stdout) == (1, b"")
    assert done.stderr.decode() == (
        f"triggerer: no pipeline 'join_orders' in {tmp_path / 'pipelines'} (its pipelines: "
        f"fails, held, join, reads_inlets); files that failed to load:\n  {broken}:1: "
        "ModuleNotFoundError: No module named 'no_such_module'\n"
    )


@pytest.mark.timeout(300)
async def test_inlet_events_are_read_from_the_store_which_is_left_as_it_was(
    tmp_path: Path, spark_remote: str
) -> None:
    config, _ = given(tmp_path, spark_remote)
    without_store = await pipelines_test(config, "reads_inlets")
    assert without_store.returncode == 1
    assert (
        "LookupError: inlet events of Asset('raw'): pipelines test reads inlet events from the "
        f"configured store: no database at {store_file(tmp_path)}"
    ) in without_store.stderr.decode()
    assert not store_file(tmp_path).exists()

    url = sqlite_url(tmp_path)
    await upgrade(url)
    engine = create_engine(url)
    try:
        async with session_factory(engine).begin() as session:
            await sync_definitions(session, load_pipelines(tmp_path / "pipelines"))
        async with session_factory(engine).begin() as session:
            raw = await actions.find_asset(session, asset_id=None, uri="raw")
            for k in (1, 2):
                await actions.emit_event(
                    session, raw, {"k": k}, source="cli", actor=cli_principal()
                )
    finally:
        await engine.dispose()
    before = store_file(tmp_path).stat()

    with_store = await pipelines_test(config, "reads_inlets")
    assert with_store.returncode == 0, with_store.stderr.decode()
    lines = with_store.stdout.decode().splitlines()
    [inlet] = [line for line in lines if line.startswith("INLET")]
    assert json.loads(inlet.removeprefix("INLET ")) == [[1, {"k": 1}], [2, {"k": 2}]]
    # An alias inlet (was: AttributeError before the run, an alias having no URI).
    [alias] = [line for line in lines if line.startswith("ALIAS")]
    assert json.loads(alias.removeprefix("ALIAS ")) == []
    after = store_file(tmp_path).stat()
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)
    assert await query(url, runs) == []
    assert [event.extra for event in await query(url, lambda s: events_of(s, "raw"))] == [
        {"k": 1},
        {"k": 2},
    ]


@pytest.mark.timeout(300)
async def test_ctrl_c_stops_the_run_and_exits_130(tmp_path: Path, spark_remote: str) -> None:
    config, _ = given(tmp_path, spark_remote)
    cli = await started(config, tmp_path / "stderr", "held")
    async with cli:
        assert cli.stdout is not None
        run_pid = int(await line_starting(BufferedByteReceiveStream(cli.stdout), b"PID "))
        cli.send_signal(signal.SIGINT)
        with anyio.fail_after(60):
            code = await cli.wait()
    assert code == 128 + signal.SIGINT, (tmp_path / "stderr").read_text()
    assert not alive(run_pid)  # stopped, and waited for, before the CLI exited


LOCAL = """
from triggerer import Asset, Metadata, pipeline

from _shared import rows_of  # a helper module of the pipelines folder, above this file

orders = Asset("orders")
counted = Asset("counted")

@pipeline(schedule=orders, outlets=[counted])
def count(spark, context):
    [event] = context.triggering_asset_events[orders]
    # The classic API, which only a JVM of the run's own has.
    rows = spark.sparkContext.parallelize(range(rows_of(event))).count()
    yield Metadata(counted, {"rows": rows})
"""


@pytest.mark.slow  # a JVM of its own: make test-slow
@pytest.mark.timeout(300)
async def test_local_mode_runs_the_test_on_classic_spark_on_its_master(tmp_path: Path) -> None:
    # In a subfolder, importing a helper of the folder: the run imports it as the daemon does.
    write_pipelines(
        tmp_path / "pipelines", "def rows_of(event):\n    return event.extra['n']\n", "_shared.py"
    )
    write_pipelines(tmp_path / "pipelines" / "counting", LOCAL)
    config = local_config(tmp_path, "local", master="local[1]")
    done = await pipelines_test(config, "count", "--event", 'orders={"n": 3}')
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    assert "pipelines test: on classic Spark on master local[1] (for local mode" in stderr
    assert '\n  counted  {"rows": 3}\n' in done.stdout.decode()
    assert not store_file(tmp_path).exists()
