"""User code that raised past the daemon's fault boundaries: a trigger's ``cleanup()`` or
``shareable``, a file in the pipelines folder, a listener plugin. Each now fails alone, or
stops ``triggerer run`` at start with an error naming it, never with a traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import textwrap
from typing import TYPE_CHECKING

import anyio
import pytest

from tests.e2e.daemon import (
    ORDERS,
    DaemonProcess,
    Deployment,
    pipeline_row,
    sqlite_url,
    trigger_rows,
    triggerer_cli,
)
from triggerer.listeners import ENTRY_POINT_GROUP

if TYPE_CHECKING:
    from pathlib import Path

    from triggerer.service.store import models

NO_SPARK = "sc://127.0.0.1:1"  # no pipeline runs in these tests

FAILING = """
    import dataclasses

    from triggerer import Asset, AssetWatcher, BaseEventTrigger

    @dataclasses.dataclass
    class {name}(BaseEventTrigger):
        url: str = "http://example.invalid"

        async def run(self):
            raise ConnectionError("cannot reach " + self.url)
            yield
{members}
    orders = Asset("orders", watchers=[AssetWatcher("flaky", {name}())])
"""

CLEANUP_RAISES = """
        async def cleanup(self):
            await self.client.close()  # never connected: there is no client
"""

SHAREABLE_RAISES = """
        @property
        def shareable(self):
            return self.options["shared"]
"""


@pytest.fixture
def deployment(tmp_path: Path) -> Deployment:
    """A deployment without a broker or Spark: nothing here gets as far as using them."""
    return Deployment(tmp_path, sqlite_url(tmp_path), NO_SPARK, bootstrap="", topic="")


async def restarted(deployment: Deployment, daemon: DaemonProcess) -> models.Trigger:
    """The trigger row once its watcher has failed three times, started again after each
    backoff, with the daemon still up."""
    daemon.start()
    await daemon.wait_logged("trigger_failed", timeout_s=30, times=3)
    (row,) = await deployment.wait_for(
        trigger_rows, lambda rows: rows[0].restart_count >= 3, timeout_s=60
    )
    assert daemon.process is not None
    assert daemon.process.poll() is None, daemon.tail()
    return row


async def test_trigger_whose_cleanup_raises_is_restarted_with_backoff(
    deployment: Deployment,
) -> None:
    """Was: the daemon exited after the first failed poll, and again on every restart."""
    deployment.write_pipelines(FAILING.format(name="FlakyTrigger", members=CLEANUP_RAISES))

    with deployment.process_with_config(deployment.config_file()) as daemon:
        row = await restarted(deployment, daemon)
        cleanups = await daemon.wait_logged("trigger_cleanup_failed", times=3)

    assert row.state in ("backoff", "running")
    assert row.last_error == "ConnectionError: cannot reach http://example.invalid"
    assert {(c["trigger_id"], c["trigger"], c["error"]) for c in cleanups} == {
        (
            row.id,
            row.classpath,
            "AttributeError: 'FlakyTrigger' object has no attribute 'client'",
        )
    }


WAITING = """
    import anyio

    from triggerer import Asset, AssetWatcher, BaseEventTrigger

    class WaitingTrigger(BaseEventTrigger):
        def serialize(self):
            return WaitingTrigger.classpath(), {{}}

        async def run(self):
            await anyio.sleep_forever()
            yield

        async def cleanup(self):
            raise OSError("connection already closed")

    orders = Asset("orders", watchers=[AssetWatcher("waiting", WaitingTrigger())])
"""


async def test_trigger_whose_cleanup_raises_lets_the_daemon_stop_cleanly(
    deployment: Deployment,
) -> None:
    """Was: SIGTERM ended the daemon with the cleanup's traceback instead of a clean exit."""
    deployment.write_pipelines(WAITING)

    with deployment.process_with_config(deployment.config_file()) as daemon:
        await deployment.start_watching(daemon)
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(timeout_s=45) == 0, daemon.tail()
        (cleanup,) = await daemon.wait_logged("trigger_cleanup_failed")

    assert cleanup["error"] == "OSError: connection already closed"


async def test_trigger_whose_shareable_raises_fails_its_watcher_alone(
    deployment: Deployment,
) -> None:
    """Was: the daemon exited at start."""
    deployment.write_pipelines(FAILING.format(name="OptionsTrigger", members=SHAREABLE_RAISES))

    with deployment.process_with_config(deployment.config_file()) as daemon:
        row = await restarted(deployment, daemon)

    assert row.last_error == "AttributeError: 'OptionsTrigger' object has no attribute 'options'"


UNDECODABLE_ERROR = """
    import os

    from triggerer import Asset, AssetWatcher, BaseEventTrigger

    class ReportTrigger(BaseEventTrigger):
        def serialize(self):
            return ReportTrigger.classpath(), {{}}

        async def run(self):
            raise ValueError("cannot parse " + os.fsdecode(b"report-\\xe9.csv"))
            yield

    orders = Asset("orders", watchers=[AssetWatcher("reports", ReportTrigger())])
"""


async def test_trigger_error_naming_an_undecodable_file_is_stored_escaped(
    deployment: Deployment,
) -> None:
    """Was: the heartbeat could not write the error (a lone surrogate, from os.fsdecode) and
    the daemon exited, and again on every restart."""
    deployment.write_pipelines(UNDECODABLE_ERROR)

    with deployment.process_with_config(deployment.config_file()) as daemon:
        row = await restarted(deployment, daemon)

    assert row.last_error == "ValueError: cannot parse report-\\udce9.csv"


LATER = """
    from triggerer import Asset, pipeline

    @pipeline(schedule=Asset("orders"))
    def later(spark, context):
        pass
"""


async def test_dangling_symlinks_in_the_pipelines_folder_are_skipped(
    deployment: Deployment,
) -> None:
    """Was: the daemon exited at start (``old_job.py``), or on the next look at the folder
    after Emacs made its lock file (``.#later.py``)."""
    pipelines = deployment.tmp_path / "pipelines"
    pipelines.mkdir()
    (pipelines / "old_job.py").symlink_to(deployment.tmp_path / "moved_away.py")

    with deployment.process_with_config(deployment.config_file()) as daemon:
        daemon.start()
        (loaded,) = await daemon.wait_logged("pipelines_loaded")
        (pipelines / ".#later.py").symlink_to("someone@host.4242:1700000000")
        deployment.write_pipelines(LATER, name="later.py")
        await deployment.wait_for(
            lambda s: pipeline_row(s, "later"), lambda row: row is not None, timeout_s=60
        )
        (failed, *_) = await daemon.wait_logged("pipeline_file_failed")

    assert loaded["errors"] == 1
    assert failed["error"].startswith(f"{pipelines / 'old_job.py'}: FileNotFoundError")


SCRIPT = """
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--date")
    arguments = parser.parse_args()
"""


async def test_pipeline_file_that_exits_at_import_is_reported_and_the_others_load(
    deployment: Deployment,
) -> None:
    """Was: the daemon exited at start, and again on every restart."""
    script = deployment.write_pipelines(SCRIPT, name="script.py")
    deployment.write_pipelines(LATER, name="later.py")

    with deployment.process_with_config(deployment.config_file()) as daemon:
        daemon.start()
        (loaded,) = await daemon.wait_logged("pipelines_loaded")
        (failed,) = await daemon.wait_logged("pipeline_file_failed")
        assert await deployment.query(lambda s: pipeline_row(s, "later")) is not None

    assert loaded["errors"] == 1
    assert failed["error"].startswith(f"{script}:6: the file called exit(2) while being imported")


LISTENERS = {
    "raises_listener": 'raise RuntimeError("no webhook configured")\n',
    "key_error_listener": 'import os\n\nos.environ["NO_SUCH_VARIABLE"]\n',
    "hook_typo_listener": """
        from triggerer import hookimpl

        @hookimpl
        def on_asset_created(assets):  # the hook's argument is "asset"
            pass
    """,
}


def install_entry_point(folder: Path, name: str, value: str) -> None:
    """A distribution in ``folder`` (put on the path) with the listener entry point ``name``."""
    dist_info = folder / "listener_plugin-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: listener-plugin\nVersion: 1.0\n"
    )
    (dist_info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{name} = {value}\n")


@pytest.mark.parametrize(
    ("plugin", "cause"),
    [
        ("raises_listener", "RuntimeError: no webhook configured"),
        ("key_error_listener", "KeyError: 'NO_SUCH_VARIABLE'"),
        ("hook_typo_listener", "hookimpl definition: on_asset_created(assets)"),
        (".raises_listener", "TypeError: the 'package' argument is required"),
    ],
)
async def test_listener_plugin_that_cannot_be_loaded_stops_the_start_naming_it(
    deployment: Deployment, plugin: str, cause: str
) -> None:
    """Was: a traceback, or ``triggerer: 'NO_SUCH_VARIABLE'`` naming neither plugin nor
    setting."""
    config = deployment.config_file(listeners={"plugins": [plugin]})

    stderr = await failed_start(deployment, config)

    assert stderr.startswith(
        f"triggerer: listener plugin {plugin!r} cannot be loaded ([listeners] plugins): "
    ), stderr
    assert cause in stderr


async def test_entry_point_listener_that_cannot_be_loaded_stops_the_start_naming_it(
    deployment: Deployment,
) -> None:
    """Was: a traceback."""
    install_entry_point(deployment.tmp_path / "modules", "typo", "hook_typo_listener")

    stderr = await failed_start(deployment, deployment.config_file())

    assert stderr.startswith(
        f"triggerer: listener plugin 'typo' cannot be loaded ({ENTRY_POINT_GROUP} entry point "
        "hook_typo_listener): PluginValidationError: "
    ), stderr
    assert "hookimpl definition: on_asset_created(assets)" in stderr


async def failed_start(deployment: Deployment, config: Path) -> str:
    """What ``triggerer run --config CONFIG`` printed, having stopped at start, with the
    modules of :data:`LISTENERS` importable."""
    modules = deployment.tmp_path / "modules"
    modules.mkdir(exist_ok=True)
    for name, source in LISTENERS.items():
        (modules / f"{name}.py").write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}
    started = await triggerer_cli(
        env | {"PYTHONPATH": str(modules)}, "run", "--config", str(config)
    )
    stderr = started.stderr.decode()
    assert started.returncode == 1, stderr
    assert len(stderr.splitlines()) == 1, stderr
    return stderr


BUG = """
    import anyio

    from triggerer import Asset, AssetWatcher, BaseEventTrigger
    from triggerer.service.daemon import supervisor

    async def lease_with_a_bug(self, *args):
        raise RuntimeError("a bug in the daemon")

    supervisor.Supervisor._lease = lease_with_a_bug  # a pipeline file runs in the daemon

    class QuietTrigger(BaseEventTrigger):
        def serialize(self):
            return QuietTrigger.classpath(), {{}}

        async def run(self):
            await anyio.sleep_forever()
            yield

    orders = Asset("orders", watchers=[AssetWatcher("quiet", QuietTrigger())])
"""


MISSHAPEN_LAG = """
    import asyncio
    import dataclasses

    from triggerer import Asset, AssetWatcher, BaseEventTrigger

    @dataclasses.dataclass
    class LaggingTrigger(BaseEventTrigger):
        lag = 5

        @property
        def lag_by_partition(self):
            return {{"orders": 5}}  # no partition

        async def run(self):
            await asyncio.Event().wait()
            yield

    orders = Asset("orders", watchers=[AssetWatcher("lagging", LaggingTrigger())])
"""


async def test_trigger_whose_lag_by_partition_is_misshapen_stops_no_heartbeat(
    deployment: Deployment,
) -> None:
    """Was: the heartbeat raised unpacking its keys, which ended the daemon on every start."""
    deployment.write_pipelines(MISSHAPEN_LAG)

    with deployment.process_with_config(deployment.config_file()) as daemon:
        daemon.start()
        failed = await daemon.wait_logged("trigger_lag_failed", timeout_s=30, times=3)
        checked = await triggerer_cli(
            deployment.env(), "--config", str(deployment.config_file()), "check"
        )
        assert daemon.process is not None
        assert daemon.process.poll() is None, daemon.tail()

    assert "got 'orders': 5" in failed[0]["error"]
    assert checked.returncode == 0, checked.stdout


async def test_kafka_watcher_whose_brokers_do_not_answer_shows_the_error(
    tmp_path: Path,
) -> None:
    """Was: ``running`` without an error, forever; only the log said ``kafka_connect_failed``."""
    unreachable = Deployment(
        tmp_path, sqlite_url(tmp_path), NO_SPARK, bootstrap="127.0.0.1:1", topic="orders"
    )
    unreachable.write_pipelines(ORDERS)
    config = unreachable.config_file()

    with unreachable.process_with_config(config) as daemon:
        row = await restarted(unreachable, daemon)
        listed = await triggerer_cli(
            unreachable.env(), "--config", str(config), "watchers", "list", "--json"
        )

    expected = "ConnectionError: cannot reach the Kafka brokers at 127.0.0.1:1 (tried 3 times)"
    assert row.last_error == expected
    (watcher,) = json.loads(listed.stdout)
    assert (watcher["state"], watcher["last_error"]) == ("backoff", expected)
    assert watcher["restarts"] >= 3


async def test_a_bug_past_every_fault_boundary_ends_the_daemon_at_once(
    deployment: Deployment,
) -> None:
    """Was: the daemon often hung instead of exiting (aiosqlite's close of a connection
    cancelled mid-statement waits forever), logging nothing, so nothing restarted it."""
    deployment.write_pipelines(BUG)

    for start in (1, 2, 3):  # the hang came two times in three
        with deployment.process_with_config(deployment.config_file()) as daemon:
            daemon.start()
            assert await daemon.wait(timeout_s=30) == 1, daemon.tail()
            crashes = await daemon.wait_logged("daemon_crashed", times=start)

    assert all("RuntimeError: a bug in the daemon" in c["exception"] for c in crashes)


async def test_subfolders_removed_while_the_daemon_scans_the_folder_stop_nothing(
    deployment: Deployment,
) -> None:
    """Was: a subfolder removed during the folder scan (a deploy, a checkout) ended the daemon
    with FileNotFoundError out of the walk."""
    pipelines = deployment.tmp_path / "pipelines"
    pipelines.mkdir()
    config = deployment.config_file(pipelines={"reload_interval_s": 0.02})

    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        churn = pipelines / "churn"
        with anyio.move_on_after(3):
            while True:  # deep enough that the walk is often inside when it goes
                for branch in range(8):
                    (churn / str(branch) / "a" / "b").mkdir(parents=True, exist_ok=True)
                await anyio.to_thread.run_sync(shutil.rmtree, churn)
        deployment.write_pipelines(LATER, name="later.py")
        await deployment.wait_for(
            lambda s: pipeline_row(s, "later"), lambda row: row is not None, timeout_s=60
        )
        assert daemon.process is not None
        assert daemon.process.poll() is None, daemon.tail()


@pytest.mark.parametrize(
    ("url", "cause"),
    [
        (
            "postgresql://postgres:secret@127.0.0.1:5432/postgres?sslmode=require",
            "connect() got an unexpected keyword argument 'sslmode'",
        ),
    ],
)
async def test_database_url_the_driver_refuses_stops_the_start_naming_it(
    deployment: Deployment, url: str, cause: str
) -> None:
    """Was: a traceback (``daemon_crashed``) on every start."""
    config = deployment.config_file(database={"url": url})

    stderr = await failed_start(deployment, config)

    shown = url.replace("secret", "***")
    assert stderr.startswith(f"triggerer: [database] url {shown}: the database driver refuses it: ")
    assert cause in stderr


async def test_sqlite_url_naming_a_folder_stops_the_start_naming_it(
    deployment: Deployment,
) -> None:
    """Was: retried forever as an outage (store_unavailable), naming neither the folder nor
    the fix."""
    folder = deployment.tmp_path / "state"
    folder.mkdir()
    config = deployment.config_file(database={"url": f"sqlite:///{folder}"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}

    started = await triggerer_cli(env, "run", "--config", str(config))

    stderr = started.stderr.decode()
    assert started.returncode == 1, stderr
    assert stderr.startswith(f"triggerer: invalid configuration in {config}:\n  database.url: ")
    assert f"{folder} is a folder: name the database file in it" in stderr
    assert f"sqlite:///{folder / 'triggerer.db'}" in stderr


async def test_sqlite_url_under_the_home_folder_opens_there(deployment: Deployment) -> None:
    """Was: the folder was made under HOME but the file opened in a folder named "~" in the
    working directory, which did not exist: an outage retried forever."""
    config = deployment.config_file(database={"url": "sqlite:///~/state/triggerer.db"})
    home = deployment.tmp_path / "home"
    daemon = deployment.process_with_config(config)
    daemon.env |= {"HOME": str(home)}
    with daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded", timeout_s=30)

    assert (home / "state" / "triggerer.db").is_file()


WAITS_AT_IMPORT = """
    import time

    time.sleep(3600)  # a call to a service that does not answer
"""


async def test_pipeline_file_whose_import_does_not_return_is_named(
    deployment: Deployment,
) -> None:
    """Was: the daemon started no watcher and reloaded nothing, and said nothing of why."""
    slow = deployment.write_pipelines(WAITS_AT_IMPORT, name="slow.py")

    with deployment.process_with_config(deployment.config_file()) as daemon:
        daemon.start()
        (reported,) = await daemon.wait_logged("pipeline_file_slow", timeout_s=30)

    assert reported["path"] == str(slow)
    assert reported["loading_s"] >= 10


BROKEN_PROVIDER_PIPELINES = """
    from triggerer import Asset, AssetWatcher
    from watchers import MessageQueueTrigger

    orders = Asset("orders", watchers=[AssetWatcher("queue", MessageQueueTrigger("broken://h/q"))])
"""


async def test_queue_provider_that_cannot_be_loaded_fails_its_watchers_alone(
    deployment: Deployment,
) -> None:
    """A third party's provider whose import raises: the daemon starts and logs it, and the
    watcher using its scheme fails, naming the entry point; its file loads, with that watcher
    as its error."""
    modules = deployment.tmp_path / "modules"
    dist_info = modules / "queue_plugin-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: queue-plugin\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        "[triggerer.queue_providers]\nbroken = no_such_module:provider\n"
    )
    deployment.write_pipelines(BROKEN_PROVIDER_PIPELINES)
    config = deployment.config_file()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}
    with DaemonProcess(
        env | {"PYTHONPATH": str(modules)}, deployment.tmp_path / "daemon.log", config
    ) as daemon:
        daemon.start()
        [loaded] = await daemon.wait_logged("pipelines_loaded")
        [unusable] = await daemon.wait_logged("queue_provider_unusable")
        listed = await triggerer_cli(env, "watchers", "list", "--config", str(config), "--json")

    # The file loads; the watcher whose trigger could not be made is its one error (as
    # `pipelines check` says before a deploy), and fails alone.
    assert loaded["errors"] == 1
    assert unusable["scheme"] == "broken"
    expected = (
        "queue provider 'broken' (triggerer.queue_providers entry point no_such_module:provider)"
        " cannot be loaded: ModuleNotFoundError"
    )
    assert expected in unusable["error"]
    [watcher] = json.loads(listed.stdout)
    assert watcher["watcher"] == "queue"
    assert watcher["state"] == "failed"
    assert expected in watcher["last_error"], watcher
