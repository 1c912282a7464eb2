"""Mistakes in pipeline files found before they are deployed: ``triggerer pipelines check`` (a
process of its own, no daemon, store or Spark) names each with its file and line, and
``triggerer run --config FILE`` refuses the same ones with the same words, as import errors
(``triggerer pipelines list``), while the rest of the folder loads."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio

from tests.e2e.daemon import Deployment, sqlite_url, triggerer_cli
from tests.e2e.test_import_errors import WAIT_S, listed, without_triggerer_variables

if TYPE_CHECKING:
    from pathlib import Path

NO_SPARK = "sc://127.0.0.1:1"  # nothing runs

GOOD = """
from triggerer import Asset, AssetOrTimeSchedule, pipeline

orders = Asset("orders")

@pipeline(schedule=orders & Asset("customers"))
def joined(spark, context):
    pass

@pipeline(schedule=AssetOrTimeSchedule(cron="0 6 * * *", assets=[orders]))
def morning(spark, context):
    pass
"""

# Each of these loaded without a word before, and failed (or vanished) later.
RENAMED = """
from triggerer import Asset, pipeline

@pipeline(schedule=Asset("orders"))
def renamed_task():
    return 1
"""
SHADOWED = """
from triggerer import Asset, pipeline

@pipeline(schedule=Asset("orders"))
def load(spark, context):
    pass

def load(path):
    return path
"""
RESERVED = """
from triggerer import Asset, pipeline

@pipeline(schedule=Asset("airflow://orders"))
def on_reserved(spark, context):
    pass
"""
DUPLICATE = """
from triggerer import Asset, pipeline

@pipeline(pipeline_id="joined", schedule=Asset("orders"))
def joined_again(spark, context):
    pass
"""
BAD_QUEUE = """
from triggerer import Asset, AssetWatcher, pipeline
from watchers import MessageQueueTrigger

refunds = Asset("refunds", watchers=[
    AssetWatcher("refunds_queue", MessageQueueTrigger("kafak://127.0.0.1:9092/refunds")),
    AssetWatcher("refunds_topic", MessageQueueTrigger(
        "kafka://127.0.0.1:9092/refunds", auto_offset_reset="newest")),
])

@pipeline(schedule=refunds, max_active_runs=4)
def on_refunds(spark, context):
    pass
"""
BAD_OPTION = """
from triggerer import Asset, pipeline

@pipeline(schedule=Asset("orders"), max_active_runs=0)
def too_few(spark, context):
    pass
"""

DAG_LOOP = """
from airflow.sdk import DAG, task

for dag_id in ["sales", "sales"]:
    with DAG(dag_id, schedule=None):
        @task
        def step():
            return 1

        step()
"""
SHARED_DAG = """
from airflow.sdk import DAG, task

with DAG("shared", schedule=None):
    @task
    def step():
        return 1

    step()
"""
FROM_HELPER = """
from airflow.sdk import DAG
import _shared_dag
"""

BROKEN = {
    "dag_loop.py": DAG_LOOP,
    "from_helper.py": FROM_HELPER,
    "renamed.py": RENAMED,
    "shadowed.py": SHADOWED,
    "reserved.py": RESERVED,
    "z_duplicate.py": DUPLICATE,
    "bad_queue.py": BAD_QUEUE,
    "bad_option.py": BAD_OPTION,
}


def expected_errors(folder: str) -> list[tuple[str, int, str]]:
    """Each mistake of :data:`BROKEN`: the file, the line and the start of the message."""
    return [
        (
            f"{folder}/bad_option.py",
            4,
            "ValueError: pipeline 'too_few': max_active_runs=0; must be an integer >= 1",
        ),
        (
            f"{folder}/bad_queue.py",
            6,
            "watcher 'refunds_queue' of asset 'refunds': queue 'kafak://127.0.0.1:9092/refunds' "
            "has no supported scheme",
        ),
        (
            f"{folder}/bad_queue.py",
            7,
            "watcher 'refunds_topic' of asset 'refunds': KafkaTrigger "
            "auto_offset_reset='newest' must be one of",
        ),
        (
            f"{folder}/dag_loop.py",
            5,
            f"pipeline id 'sales' is already defined at {folder}/dag_loop.py:5; ids must be "
            "unique (this definition is ignored)",
        ),
        (
            f"{folder}/from_helper.py",
            3,
            f"DAG 'shared' is made in helper module {folder}/_shared_dag.py, line 4, as it is "
            "imported: make it in the pipeline file, or in a function the file calls",
        ),
        (
            f"{folder}/renamed.py",
            4,
            "TypeError: pipeline 'renamed_task': renamed_task() cannot be called with the "
            "run's (spark, context)",
        ),
        (
            f"{folder}/reserved.py",
            4,
            "InvalidAssetUri: asset URI 'airflow://orders' uses the reserved scheme 'airflow'",
        ),
        (
            f"{folder}/shadowed.py",
            4,
            "pipeline 'load' (line 4) is hidden: the name 'load' is defined again at line 8",
        ),
        (
            f"{folder}/z_duplicate.py",
            4,
            f"pipeline id 'joined' is already defined at {folder}/good.py:6",
        ),
    ]


async def wait_for_watchers(config: Path, names: set[str]) -> dict[str, dict[str, Any]]:
    """``triggerer watchers list --json`` once the watchers ``names`` have each a state
    (rows keyed by watcher name)."""
    with anyio.fail_after(WAIT_S):
        while True:
            done = await triggerer_cli(
                without_triggerer_variables(), "--config", str(config), "watchers", "list", "--json"
            )
            assert done.returncode == 0, done.stderr.decode()
            rows = {row["watcher"]: row for row in json.loads(done.stdout)}
            if names <= rows.keys() and all(rows[name]["state"] for name in names):
                return rows
            await anyio.sleep(0.2)


def matches(found: list[tuple[str, int, str]], expected: list[tuple[str, int, str]]) -> bool:
    return len(found) == len(expected) and all(
        (path, line) == (want_path, want_line) and message.startswith(start)
        for (path, line, message), (want_path, want_line, start) in zip(
            found, expected, strict=True
        )
    )


async def test_check_names_each_mistake_and_the_daemon_refuses_the_same(tmp_path: Path) -> None:
    deployment = Deployment(tmp_path, sqlite_url(tmp_path), NO_SPARK, bootstrap="", topic="")
    folder = tmp_path / "pipelines"
    deployment.write_pipelines(GOOD, name="good.py")
    config = deployment.config_file(pipelines={"dir": str(folder)})
    env = without_triggerer_variables()

    # A folder that loads: exit 0, each pipeline with its schedule.
    checked = await triggerer_cli(env, "pipelines", "check", str(folder), "--json")
    assert checked.returncode == 0, checked.stderr.decode()
    assert json.loads(checked.stdout) == {
        "pipelines": [
            {
                "pipeline_id": "joined",
                "file": f"{folder}/good.py",
                "schedule": "orders & customers",
            },
            {
                "pipeline_id": "morning",
                "file": f"{folder}/good.py",
                "schedule": "0 6 * * * or orders",
            },
        ],
        "errors": [],
    }

    for name, source in BROKEN.items():
        (folder / name).write_text(source)
    (folder / "_shared_dag.py").write_text(SHARED_DAG)
    # The configured folder by default.
    checked = await triggerer_cli(env, "--config", str(config), "pipelines", "check", "--json")
    assert checked.returncode == 1, checked.stderr.decode()
    report = json.loads(checked.stdout)
    # A pipeline on an asset with a broken watcher loads: its other watcher feeds it.
    assert [p["pipeline_id"] for p in report["pipelines"]] == [
        "on_refunds",
        "sales",
        "joined",
        "morning",
    ]
    found = [(e["file"], e["line"], e["message"]) for e in report["errors"]]
    assert matches(found, expected_errors(str(folder))), found

    # The table: the pipelines, then each error at its file and line, and the count.
    checked = await triggerer_cli(env, "pipelines", "check", str(folder / "shadowed.py"))
    assert checked.returncode == 1
    assert checked.stdout.decode().splitlines() == [
        f"error: {folder}/shadowed.py:4: pipeline 'load' (line 4) is hidden: the name 'load' is "
        "defined again at line 8, so the file no longer holds the pipeline; give one of them "
        "another name",
        "0 pipeline(s), 1 error(s)",
    ]

    # The daemon: the same errors as import errors, the good file's pipelines loaded, and the
    # watcher that could be made still watching beside the one that could not.
    with deployment.process_with_config(config, cwd=tmp_path) as daemon:
        daemon.start()
        (loaded,) = await daemon.wait_logged("pipelines_loaded", timeout_s=WAIT_S)
        assert loaded["errors"] == len(expected_errors(str(folder)))
        rows = json.loads(await listed(config, "--json"))
        watchers = await wait_for_watchers(config, {"refunds_queue", "refunds_topic"})
    assert watchers["refunds_queue"]["state"] == "failed"
    assert "has no supported scheme" in watchers["refunds_queue"]["last_error"]
    assert [row["pipeline_id"] for row in rows if row.get("pipeline_id")] == [
        "joined",
        "morning",
        "on_refunds",
        "sales",
    ]
    broken = {row["fileloc"]: row for row in rows if not row.get("pipeline_id")}
    for path, _line, start in expected_errors(str(folder)):
        assert path in broken, (path, sorted(broken))
        assert start in broken[path]["error"]
    assert broken[f"{folder}/bad_queue.py"]["line"] == 6  # a file's first error's line


LOOPING = """
import asyncio

from triggerer import Asset, pipeline
import _common


async def setting():
    return "orders"


print("imported looping.py")


@pipeline(schedule=Asset(asyncio.run(setting())), description=_common.TEAM)
def on_orders(spark, context):
    pass
"""


async def test_check_imports_a_file_as_the_daemon_does(tmp_path: Path) -> None:
    """A file of a subfolder that imports a helper of the configured folder, runs an event
    loop and prints as it is imported: it loads (was ModuleNotFoundError, then RuntimeError for
    the loop), and its print goes to stderr, away from the JSON on stdout."""
    deployment = Deployment(tmp_path, sqlite_url(tmp_path), NO_SPARK, bootstrap="", topic="")
    folder = tmp_path / "pipelines"
    (folder / "team").mkdir(parents=True)
    (folder / "_common.py").write_text("TEAM = 'sales'\n")
    job = folder / "team" / "job.py"
    job.write_text(LOOPING)
    config = deployment.config_file(pipelines={"dir": str(folder)})
    checked = await triggerer_cli(
        without_triggerer_variables(),
        "--config",
        str(config),
        "pipelines",
        "check",
        str(job),
        "--json",
    )
    assert checked.returncode == 0, checked.stderr.decode()
    assert json.loads(checked.stdout) == {
        "pipelines": [{"pipeline_id": "on_orders", "file": str(job), "schedule": "orders"}],
        "errors": [],
    }
    assert checked.stderr.decode() == "imported looping.py\n"
