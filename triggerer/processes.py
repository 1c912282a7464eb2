"""The environment and the end of the Spark processes the daemon starts: runs and the local
Spark Connect server."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from typing import Protocol

import anyio

KILL_GRACE_S = 5.0
"""How long a process group has after SIGTERM before SIGKILL."""


def spark_env() -> dict[str, str]:
    """The daemon's environment, plus the Spark home and the Python that runs use unless it
    names them itself: ``SPARK_HOME`` (pyspark's own folder) and the daemon's interpreter as
    the driver's and executors' Python.

    A service manager starts the daemon without its virtualenv on PATH, where spark-submit
    would look for both and find a Python without pyspark and triggerer. In ``submit`` mode
    ``spark.pyspark.python`` and ``spark.pyspark.driver.python`` in ``[spark] conf`` take
    precedence over these (spark-submit reads them).
    """
    env = dict(os.environ)
    defaults = {
        "SPARK_HOME": spark_home(),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    for name, value in defaults.items():
        env[name] = env.get(name) or value
    return env


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
    """End ``process`` and its process group: SIGTERM, then SIGKILL after ``KILL_GRACE_S``."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with anyio.move_on_after(KILL_GRACE_S):
        await process.wait()
        return
    os.killpg(process.pid, signal.SIGKILL)
    await process.wait()
