"""The environment and the end of the Spark processes the daemon starts: runs and the local
Spark Connect server."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import sys
from collections.abc import Mapping
from typing import Protocol

import anyio

PR_SET_DUMPABLE = 4
"""prctl(2)'s option for whether a process is dumpable (linux/prctl.h)."""
KILL_GRACE_S = 5.0
"""How long a process group has after SIGTERM before SIGKILL."""
LOOPBACK = "127.0.0.1"
"""Where a local Spark listens: its driver, block manager and web UI (and the Connect server)."""
SETTINGS_PREFIX = "TRIGGERER_"
"""The daemon's settings in the environment (the database URL, the API's tokens, connection and
OpenLineage credentials, in any of pydantic-settings' spellings): no run or Spark process is
handed one; a run needs none of them."""


def spark_env(master: str | None = None) -> dict[str, str]:
    """The daemon's environment, plus the Spark home and the Python that runs use unless it
    names them itself: ``SPARK_HOME`` (pyspark's own folder) and the daemon's interpreter as
    the driver's and executors' Python. For a process that starts a JVM on a local ``master``,
    also ``SPARK_LOCAL_IP`` on loopback (see :func:`spark_conf`).

    A service manager starts the daemon without its virtualenv on PATH, where spark-submit
    would look for both and find a Python without pyspark and triggerer. In ``submit`` mode
    ``spark.pyspark.python`` and ``spark.pyspark.driver.python`` in ``[spark] conf`` take
    precedence over these (spark-submit reads them).
    """
    # pydantic-settings reads the variables' names in any case.
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(SETTINGS_PREFIX)}
    defaults = {
        "SPARK_HOME": spark_home(),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    if master is not None and is_local_master(master):
        # Spark's web UI has no setting for its address: it binds to SPARK_LOCAL_IP, else to
        # every address of the machine.
        defaults["SPARK_LOCAL_IP"] = LOOPBACK
    for name, value in defaults.items():
        env[name] = env.get(name) or value
    return env


def spark_conf(master: str, conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` for a Spark on ``master``: on a local master, its driver and block manager
    listen on loopback unless ``conf`` places them (Spark binds them to the address of the
    machine's name, open to the network, though nothing outside the machine needs them)."""
    if not is_local_master(master):
        return dict(conf)
    defaults = {"spark.driver.host": LOOPBACK}
    if "spark.driver.host" not in conf:
        # Otherwise Spark's own default, the driver's host: it listens where it is reached.
        defaults["spark.driver.bindAddress"] = LOOPBACK
    return {**defaults, **conf}


def is_local_master(master: str) -> bool:
    """Whether Spark on ``master`` runs on this machine alone: ``local``, ``local[N]``,
    ``local[N,F]`` or ``local-cluster[...]``."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def spark_home() -> str:
    """The pyspark package's folder, found without importing it: a Spark home (bin/, jars/)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("pyspark, a dependency of triggerer, is not installed")
    return os.path.dirname(spec.origin)


class Process(Protocol):
    """What :func:`terminate` needs of a process: a started one, or a run the forker forked."""

    @property
    def pid(self) -> int: ...

    async def wait(self) -> int: ...


async def terminate(process: Process) -> None:
    """End ``process`` and its process group: SIGTERM, then SIGKILL after ``KILL_GRACE_S``.

    A run just forked may not lead its process group yet (it calls ``setsid()`` as it starts):
    then the process alone is signalled, before it could start anything of its own.
    """
    if not _signal(process.pid, signal.SIGTERM):
        return
    with anyio.move_on_after(KILL_GRACE_S):
        await process.wait()
        return
    _signal(process.pid, signal.SIGKILL)
    await process.wait()


def _signal(pid: int, signum: int) -> bool:
    """Send ``signum`` to the process group ``pid`` leads, else to process ``pid``; whether
    either was there."""
    for send in (os.killpg, os.kill):
        try:
            send(pid, signum)
        except ProcessLookupError:
            continue
        return True
    return False


def hide_environment() -> None:
    """Make this process's ``/proc`` files (its environment, its memory) readable by root alone,
    not by the runs it starts as the same user (Linux; elsewhere nothing changes).

    A process that is not dumpable also leaves no core dump and takes no ptrace from its user.
    """
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
