"""The command line's start-up: ``triggerer --help`` and list verbs on a SQLite store.

    python -m tests.benchmarks.bench_cli --out bench_cli.json [--runs 15] [--against REF]

Each command is a new process, timed from spawn to exit: the median and the least wall time of
``--runs`` starts, and the median CPU time (user + system) it took, which the other work on a
shared machine disturbs less. Two floors run alongside, in turn with the commands:
``python -c pass`` (the interpreter's start) and ``python -c "import sqlalchemy.ext.asyncio"``
(what any command reading the store imports at least). Goals: ``--help`` <= 0.3 s, a list verb
on SQLite <= 0.6 s (wall, median).

The store is a SQLite file with a few pipelines, events and runs. ``python -X importtime``
ranks what ``--help`` and ``runs list`` import, by cumulative time (a module's own import and
everything it imports); the modules a list verb should not need are named if imported.

The same commands run with the ``triggerer/`` and ``watchers/`` of git revision ``--against``
too (taken with ``git archive``, first on ``PYTHONPATH``), on a store it migrated and filled
itself: by default :data:`BEFORE`, the last revision whose CLI imported everything at start, so
the table shows the timings and the import tree before and after.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import io
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import tomllib
from pathlib import Path
from typing import Any

from tests.benchmarks.report import publish

REPOSITORY = Path(__file__).resolve().parents[2]
GOALS_S = {"help": 0.3, "list": 0.6}
BEFORE = "bede0b4"
"""The last revision whose CLI imported the daemon, the brokers' clients and Alembic at start
(``--help`` 1.2 s, a list verb 1.2-1.4 s on the 2-core development VM)."""
LAUNCH = "import sys; from {module} import {function}; sys.exit({function}(sys.argv[1:]))"
"""What the ``triggerer`` console script runs; with ``PYTHONPATH`` it runs another version."""
COMMANDS = {
    "help": ["--help"],
    "runs_list": ["runs", "list"],
    "pipelines_list": ["pipelines", "list"],
    "events_list": ["events", "list"],
}
LIST_VERBS = ("runs_list", "pipelines_list", "events_list")
FLOORS = {"python_pass": "pass", "import_sqlalchemy_asyncio": "import sqlalchemy.ext.asyncio"}
IMPORTTIME_COMMANDS = ("help", "runs_list")
IMPORTTIME_TOP = 12
HEAVY = (
    "pyspark",
    "aiokafka",
    "aiobotocore",
    "botocore",
    "aiohttp",
    "fastapi",
    "uvicorn",
    "alembic",
    "httpx",
    "prometheus_client",
    "watchers",
    "{service}.daemon",
    "{service}.api",
)
"""Modules a list verb has no use for; ``{service}`` is the package of the version's CLI."""
PIPELINES = """
from triggerer import Asset, pipeline

orders, customers, totals = Asset("orders"), Asset("customers"), Asset("s3://lake/totals")


@pipeline(schedule=orders, outlets=[totals])
def total_orders(spark, context): ...


@pipeline(schedule=orders & customers)
def match_orders_to_customers(spark, context): ...


@pipeline(schedule=totals)
def publish_report(spark, context): ...
"""
EVENTS = 20
RUNS = 20


async def fill(database_url: str, folder: str, service: str) -> None:
    """A store as a small deployment has it: three pipelines, events with payloads, runs.

    Run with the version measured first on ``sys.path``, which migrates it to its own head;
    ``service`` is the package of its CLI, where its store, loader and actions are too.
    """
    actions = importlib.import_module(f"{service}.actions")
    try:  # in scheduling/ since issue 30, in daemon/ before
        registry = importlib.import_module(f"{service}.scheduling.registry")
    except ModuleNotFoundError:
        registry = importlib.import_module(f"{service}.daemon.registry")
    loader = importlib.import_module(f"{service}.loader")
    store = importlib.import_module(f"{service}.store")

    # Since issue 34 each change names its actor, for the audit log.
    actor = {}
    if "actor" in inspect.signature(actions.emit_event).parameters:
        actor["actor"] = importlib.import_module(f"{service}.principals").cli_principal()

    await store.upgrade(database_url)
    engine = store.create_engine(database_url)
    try:
        async with store.session_factory(engine).begin() as session:
            await registry.sync_definitions(session, loader.load_pipelines(Path(folder)))
            orders = await actions.find_asset(session, asset_id=None, uri="orders")
            for n in range(EVENTS):
                extra = {"payload": {"topic": "orders", "offset": n, "value": {"id": n}}}
                await actions.emit_event(session, orders, extra, source="cli", **actor)
            for _ in range(RUNS):
                await actions.trigger_run(session, "total_orders", **actor)
    finally:
        await engine.dispose()


FILL = (
    "import anyio, sys; from tests.benchmarks.bench_cli import fill; anyio.run(fill, *sys.argv[1:])"
)


def archive(ref: str, into: Path) -> Path:
    """The packages and ``pyproject.toml`` of git revision ``ref``, extracted under ``into``."""
    tar = subprocess.run(  # noqa: S603 - a revision the benchmark's user names
        ["git", "archive", ref, "triggerer", "watchers", "pyproject.toml"],  # noqa: S607 - git
        cwd=REPOSITORY,
        capture_output=True,
        check=True,
    )
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as files:
        files.extractall(into, filter="data")
    return into


def entry_point(root: Path) -> tuple[str, str]:
    """The module and the function the ``triggerer`` console script of the version at ``root``
    runs, as its ``pyproject.toml`` says."""
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["triggerer"].partition(":")
    return module, function


def run_once(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one process running ``argv`` to its end (in ``cwd``, not the
    repository: ``python -c`` puts the current folder first on ``sys.path``)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, check=True)  # noqa: S603
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu


def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    walls = [wall for wall, _ in samples]
    return {
        "median_s": round(statistics.median(walls), 3),
        "min_s": round(min(walls), 3),
        "cpu_median_s": round(statistics.median(cpu for _, cpu in samples), 3),
    }


def importtime(argv: list[str], env: dict[str, str], cwd: Path, service: str) -> dict[str, Any]:
    """What ``argv`` imports: the top entries by cumulative milliseconds, the module count, and
    the modules of :data:`HEAVY` among them (``service``: the package of the version's CLI)."""
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-X", "importtime", *argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    entries: list[tuple[int, str]] = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        entries.append((int(cumulative), name.strip()))
    entries.sort(reverse=True)
    names = {name for _, name in entries}
    top: dict[str, float] = {}
    for us, name in entries:  # a module imported at the top and in a package: its larger time
        top.setdefault(name, round(us / 1000, 1))
    heavy = [h.format(service=service) for h in HEAVY]
    return {
        "modules": len(names),
        "heavy": [h for h in heavy if any(n == h or n.startswith(f"{h}.") for n in names)],
        "top_ms": dict(list(top.items())[:IMPORTTIME_TOP]),
    }


def bench(runs: int, against: str | None, workdir: Path) -> dict[str, Any]:
    folder = workdir / "pipelines"
    folder.mkdir()
    (folder / "pipelines.py").write_text(textwrap.dedent(PIPELINES))
    base_env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("TRIGGERER_") and key != "PYTHONPATH"
    }
    base_env |= {"TRIGGERER_PIPELINES__DIR": str(folder), "TRIGGERER_LOGGING__FORMAT": "json"}
    roots = {"current": REPOSITORY}
    if against is not None:
        roots[against] = archive(against, workdir / "against")
    envs: dict[str, dict[str, str]] = {}
    launches: dict[str, list[str]] = {}
    services: dict[str, str] = {}
    for version, root in roots.items():
        module, function = entry_point(root)
        services[version] = module.rpartition(".")[0]
        launches[version] = ["-c", LAUNCH.format(module=module, function=function)]
        # Each version on a store of its own schema, filled by its own code; tests/ after it.
        database_url = f"sqlite:///{workdir / f'{len(envs)}.db'}"
        envs[version] = base_env | {
            "TRIGGERER_DATABASE__URL": database_url,
            "PYTHONPATH": os.pathsep.join([str(root), str(REPOSITORY)]),
        }
        fill_argv = [sys.executable, "-c", FILL, database_url, str(folder), services[version]]
        subprocess.run(fill_argv, env=envs[version], cwd=workdir, check=True)  # noqa: S603
    # (label, version or None for a floor, argv, env); one of each per round, in turn, so that
    # the machine's other work falls on all of them alike.
    commands: list[tuple[str, str | None, list[str], dict[str, str]]] = [
        (floor, None, [sys.executable, "-c", code], base_env) for floor, code in FLOORS.items()
    ]
    for version, env in envs.items():
        commands += [
            (name, version, [sys.executable, *launches[version], *argv], env)
            for name, argv in COMMANDS.items()
        ]
    for _, _, argv, env in commands:  # a first start warms the file cache
        run_once(argv, env, workdir)
    samples: dict[tuple[str, str | None], list[tuple[float, float]]] = {}
    for _ in range(runs):
        for label, of, argv, env in commands:
            samples.setdefault((label, of), []).append(run_once(argv, env, workdir))
    results: dict[str, Any] = {
        "runs": runs,
        "goals_s": GOALS_S,
        "floors": {label: summary(samples[label, None]) for label in FLOORS},
    }
    for version, env in envs.items():
        timings = {name: summary(samples[name, version]) for name in COMMANDS}
        slowest_list = max(timings[name]["median_s"] for name in LIST_VERBS)
        results[version] = {
            **timings,
            "goals_met": {
                "help": timings["help"]["median_s"] <= GOALS_S["help"],
                "list": slowest_list <= GOALS_S["list"],
            },
            "importtime": {
                name: importtime(
                    [*launches[version], *COMMANDS[name]], env, workdir, services[version]
                )
                for name in IMPORTTIME_COMMANDS
            },
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON results")
    parser.add_argument("--runs", type=int, default=15, help="starts of each command")
    parser.add_argument(
        "--against",
        metavar="REF",
        default=BEFORE,
        help=f"a git revision to measure alongside, or '' for none (default: {BEFORE})",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        results = bench(args.runs, args.against or None, Path(workdir))
    publish(results, args.out)


if __name__ == "__main__":
    main()
