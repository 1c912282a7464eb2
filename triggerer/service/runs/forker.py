"""The process that forks runs on Spark Connect: ``python -m triggerer.service.runs.forker``.

A run on Spark Connect spends about a second importing PySpark's Connect client before its
pipeline starts, and on a busy machine that second of CPU is most of what a short run costs.
This process imports it once; each run is a fork of it, ready in milliseconds, with a process
group of its own and its log as stdout and stderr from its first byte.

Its arguments name more modules to import ahead: those of the triggers the pipelines declare
(``watchers.kafka`` imports aiokafka, another tenth of a second of CPU), which every run imports
again with its pipeline file. They are installed code, never the pipelines folder's (which each
run imports afresh), and only imported: nothing in this process starts a thread or opens a
connection that a fork would share.

Its stdin takes one run per line: the spec, result and log paths, tab-separated. Its stdout
answers ``<pid>`` once that run is forked and ``<pid> <returncode>`` once it ended (negative:
the signal that ended it). When stdin closes it takes no more runs and exits once its runs have
ended. Its runs die with it (``PR_SET_PDEATHSIG``), as it dies with the daemon.
"""

from __future__ import annotations

import gc
import importlib
import os
import selectors
import sys
import traceback
from collections.abc import Sequence

from triggerer.service.runs import runner
from triggerer.service.runs.lifeline import die_with_parent

REQUEST_MAX_BYTES = 64 * 1024


def main(modules: Sequence[str]) -> int:
    import pyspark.sql.connect.session  # noqa: F401  # the second each run saves

    for module in modules:
        _import_ahead(module)
    # What is imported stays out of the collector's sight: a run's collections would otherwise
    # touch, and so copy, every page it shares with this process.
    gc.freeze()
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    pending = b""
    # Until stdin closed and every run ended: each is registered until then.
    while selector.get_map():
        for key, _ in selector.select():
            if key.data is None:  # stdin: runs to fork
                chunk = os.read(key.fd, REQUEST_MAX_BYTES)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    pid = _fork(*line.decode().split("\t"))
                    selector.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
                    _answer(str(pid))
            else:  # a run ended
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(key.data, 0)
                _answer(f"{key.data} {os.waitstatus_to_exitcode(status)}")
    return 0


def _import_ahead(module: str) -> None:
    """Import ``module`` for the runs to find loaded; one that fails is left to the runs that
    import it, whose logs then say why."""
    try:
        importlib.import_module(module)
    # Any error of a module's own code: the runs that need the module fail on it themselves.
    except Exception as error:  # noqa: BLE001
        sys.stderr.write(f"run forker: {module} not imported ahead: {error!r}\n")


def _answer(line: str) -> None:
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


def _fork(spec_path: str, result_path: str, log_path: str) -> int:
    """Start the run in a child; its pid. The child never returns."""
    forker = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        die_with_parent(forker)
        os.setsid()  # a process group of its own: the launcher stops the run's whole tree
        _take_log(log_path)
        code = runner.main([spec_path, result_path])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    except BaseException:  # noqa: BLE001  # the run failed: its log says how
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _take_log(log_path: str) -> None:
    """Nothing on stdin (the daemon's requests are this process's), the log on stdout and
    stderr (its answers too)."""
    nothing = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(nothing, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(nothing)
    os.close(log)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
