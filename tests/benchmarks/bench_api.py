"""The REST API: an event POSTed to a run created, events/s with concurrent clients, and the
daemon's CPU per posted event.

    python -m tests.benchmarks.bench_api --out bench_api.json [--quick]
        [--parts in_process daemon_cpu] [--backends sqlite postgresql] [--alongside DIR]

Part ``in_process`` runs the daemon in this process with ``serve()`` and its API on a free
loopback port, on SQLite and on a fresh PostgreSQL database. The pipelines: ``on_order`` (per
event, on ``orders``) and ``pile`` (on ``[piled, never]``, so its events only queue). The
launcher's one run slot (``[runs] parallelism = 1``) is held by ``hold``, a manual run that
sleeps, so no run process adds CPU noise: runs are created and stay queued.

- latency: POST /assets/events on ``orders``, one at a time; from sending the POST to the
  ``created_at`` of the run that consumed the event (the polling client waits for it every
  10 ms). Goal: p50 <= 20 ms on SQLite.
- throughput: 8 clients in a process of their own (``post_load``, aiohttp) POST events on
  ``piled`` as fast as they can; events/s, against two baselines run alongside: 8 tasks calling
  ``record_events`` one event per transaction (what a route without group commit could do at
  best), and the HTTP ceiling: the same clients against a FastAPI route that only validates the
  body (what any route of this server could do at best). Goal: >= 1,000 events/s on SQLite and
  >= 2,000 on PostgreSQL.

Part ``daemon_cpu`` runs the daemon as users do, ``triggerer run --config FILE`` in a process of
its own (logging at its default level, INFO, as JSON to a file; ``[api] tokens`` set, so each
request is checked), with the same pipelines and held run slot. The same clients post
``warmup_events`` on ``piled``, then ``cpu_events`` more; the daemon's CPU (user + system, from
``/proc/PID/stat``) over the second batch, divided by its events, is the figure: daemon CPU ms per
posted event. Goal: <= 0.5 ms. With ``--alongside DIR`` (a checkout of the last landed
version), rounds alternate a daemon running DIR's code (``PYTHONPATH``) with one running this
checkout's, ``--rounds`` times, and the ratio of the medians is reported.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import uvicorn
from fastapi import FastAPI

from deploy.local.services import free_port
from tests.benchmarks.harness import DEFAULT_PG_URL, TRIGGERER, database
from tests.benchmarks.report import publish
from tests.e2e.daemon import stat_fields
from triggerer.service.api.schemas import NewAssetEvent  # noqa: TC001  # FastAPI reads it at runtime
from triggerer.service.api.server import api_server
from triggerer.service.config import LoggingSettings, Settings
from triggerer.service.daemon.service import serve
from triggerer.service.events import NewEvent, record_events
from triggerer.service.logs import configure_logging
from triggerer.service.store import create_engine, models, session_factory, upgrade

PIPELINES = """
import time

from triggerer import Asset, pipeline

orders, piled, never = Asset("orders"), Asset("piled"), Asset("never")


@pipeline(schedule=orders, run_policy="per_event", max_active_runs=100_000)
def on_order(spark, context):
    pass


@pipeline(schedule=[piled, never])
def pile(spark, context):
    pass


@pipeline(schedule=None)
def hold(spark, context):
    time.sleep(3600)
"""
CLIENTS = 8
FULL = {"latency_events": 300, "throughput_events": 4000, "warmup_events": 800, "cpu_events": 4000}
QUICK = {"latency_events": 50, "throughput_events": 800, "warmup_events": 200, "cpu_events": 800}
PARTS = ("in_process", "daemon_cpu")
THIS_CHECKOUT = Path(__file__).resolve().parents[2]
TOKEN = "bench-token"  # noqa: S105  # the token of the benchmark's own daemon, not a secret
START_TIMEOUT_S = 60.0
GOAL_CPU_MS_PER_EVENT = 0.5


def settings(workdir: Path, database_url: str, port: int) -> Settings:
    return Settings.model_validate(
        {
            "database": {"url": database_url},
            "pipelines": {"dir": workdir / "pipelines"},
            "spark": {
                "mode": "connect",
                "remote": "sc://127.0.0.1:1",
                "logs_dir": workdir / "logs",
            },
            "runs": {"parallelism": 1},
            "api": {"port": port},
            "logging": {"level": "WARNING"},
        }
    )


async def latency(client: httpx.AsyncClient, count: int) -> dict[str, Any]:
    samples_ms = []
    for index in range(count):
        started = dt.datetime.now(dt.UTC)
        posted = await client.post("/assets/events", json={"uri": "orders", "extra": {"i": index}})
        posted.raise_for_status()
        event_id = posted.json()["id"]
        # Polling is what a client can do (no event tells it a run was created); the run's own
        # creation time is the measure, so the polling interval adds nothing to it.
        while not (consumed := (await client.get(f"/events/{event_id}")).json()["consumed_by"]):  # noqa: ASYNC110
            await anyio.sleep(0.01)
        run = (await client.get(f"/runs/{consumed[0]['run_id']}")).json()
        created = dt.datetime.fromisoformat(run["created_at"])
        samples_ms.append((created - started).total_seconds() * 1000)
    samples_ms = samples_ms[3:]  # warm-up
    quantiles = statistics.quantiles(samples_ms, n=100)
    return {
        "events": len(samples_ms),
        "p50_ms": round(quantiles[49], 1),
        "p99_ms": round(quantiles[98], 1),
    }


async def api_throughput(base_url: str, count: int, token: str | None = None) -> float:
    """Events/s of CLIENTS clients in a process of their own (``post_load``)."""
    loaded = await anyio.run_process(
        [
            sys.executable,
            "-m",
            "tests.benchmarks.post_load",
            base_url,
            "piled",
            str(count),
            str(CLIENTS),
            *([token] if token else []),
        ],
        cwd=THIS_CHECKOUT,
        # The clients are this checkout's, whichever code the daemon runs.
        env={**os.environ, "PYTHONPATH": str(THIS_CHECKOUT)},
    )
    rate: float = json.loads(loaded.stdout)["events_per_s"]
    return rate


async def raw_throughput(database_url: str, workdir: Path, count: int) -> float:
    """``record_events`` of one event per transaction from 8 tasks, on a migrated database
    with the same pipelines synced."""
    from triggerer.service.loader import load_pipelines
    from triggerer.service.scheduling.registry import sync_definitions

    await upgrade(database_url)
    engine = create_engine(database_url)
    sessions = session_factory(engine)
    try:
        async with sessions.begin() as session:
            registry = await sync_definitions(session, load_pipelines(workdir / "pipelines"))
        piled = next(i for i, asset in registry.assets.items() if asset.name == "piled")
        per_task = count // CLIENTS

        async def record_many(offset: int) -> None:
            for index in range(per_task):
                async with sessions.begin() as session:
                    new = NewEvent(piled, {"i": offset + index}, models.EventSource.REST_API)
                    await record_events(session, [new])

        started = time.perf_counter()
        async with anyio.create_task_group() as tasks:
            for number in range(CLIENTS):
                tasks.start_soon(record_many, number * per_task)
        return per_task * CLIENTS / (time.perf_counter() - started)
    finally:
        await engine.dispose()


async def http_ceiling(count: int) -> float:
    """Events/s the same clients get from a route that only validates the body and answers
    201, served by uvicorn in this process as the daemon serves its API: the most FastAPI
    gives on this machine, with no store, auth or scheduler behind it."""
    app = FastAPI()

    @app.post("/api/v1/assets/events", status_code=201)
    async def create(new: NewAssetEvent) -> dict[str, int]:
        return {"id": 1}

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_config=None)
    )
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve)
        while not server.started:  # noqa: ASYNC110  # uvicorn offers no event for it
            await anyio.sleep(0.01)
        rate = await api_throughput(f"http://127.0.0.1:{port}/api/v1", count)
        server.should_exit = True
    return rate


async def measure(backend: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    folder = workdir / backend
    (folder / "pipelines").mkdir(parents=True)
    (folder / "pipelines" / "bench.py").write_text(PIPELINES)
    result: dict[str, Any] = {}
    with database(backend, folder, args.pg_url, "daemon") as database_url:
        port = free_port()
        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            await group.start(
                partial(
                    serve,
                    settings(folder, database_url, port),
                    api=api_server,
                    shutdown_trigger=stop.wait,
                )
            )
            base = f"http://127.0.0.1:{port}/api/v1"
            limits = httpx.Limits(max_connections=CLIENTS)
            async with httpx.AsyncClient(base_url=base, limits=limits) as client:
                (await client.post("/pipelines/hold/runs", json={})).raise_for_status()
                result["latency"] = await latency(client, args.latency_events)
            result["api_events_per_s"] = round(await api_throughput(base, args.throughput_events))
            stop.set()
    with database(backend, folder, args.pg_url, "raw") as database_url:
        result["raw_record_events_per_s"] = round(
            await raw_throughput(database_url, folder, args.throughput_events)
        )
    result["api_vs_raw"] = round(result["api_events_per_s"] / result["raw_record_events_per_s"], 2)
    result["http_ceiling_events_per_s"] = round(await http_ceiling(args.throughput_events))
    result["api_vs_http_ceiling"] = round(
        result["api_events_per_s"] / result["http_ceiling_events_per_s"], 2
    )
    return result


def write_pipelines(folder: Path) -> None:
    (folder / "pipelines").mkdir(parents=True)
    (folder / "pipelines" / "bench.py").write_text(PIPELINES)


def daemon_config(folder: Path, database_url: str) -> Path:
    config = folder / "triggerer.toml"
    config.write_text(
        f'[database]\nurl = "{database_url}"\n'
        f'[pipelines]\ndir = "{folder / "pipelines"}"\n'
        f'[spark]\nmode = "connect"\nremote = "sc://127.0.0.1:1"\nlogs_dir = "{folder / "logs"}"\n'
        "[runs]\nparallelism = 1\n"
        # The held run would have the daemon wait its grace period at shutdown.
        "[daemon]\nshutdown_grace_s = 0\n"
        f'[api]\nport = 0\ntokens = ["{TOKEN}"]\n'
    )
    return config


def logged_address(log_path: Path) -> str | None:
    """The API's base URL, if the daemon has logged it."""
    for line in log_path.read_text(errors="replace").splitlines():
        if '"api_listening"' in line:
            logged = json.loads(line)
            return f"http://{logged['host']}:{logged['port']}/api/v1"
    return None


async def api_address(log_path: Path, daemon: anyio.abc.Process) -> str:
    """The API's base URL, once the daemon has logged it."""
    with anyio.fail_after(START_TIMEOUT_S):
        while (address := logged_address(log_path)) is None:
            if daemon.returncode is not None:
                raise RuntimeError(f"triggerer exited; its log: {log_path}")
            await anyio.sleep(0.1)  # polling the daemon's log file until it logs its address
    return address


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (its threads included)."""
    fields = stat_fields(Path(f"/proc/{pid}/stat"))
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def daemon_cpu(
    backend: str, args: argparse.Namespace, folder: Path, code: Path
) -> dict[str, float]:
    """Daemon CPU ms per posted event, and events/s, of ``triggerer run`` running ``code``."""
    write_pipelines(folder)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}
    env["PYTHONPATH"] = str(code)
    log_path = folder / "daemon.log"
    with database(backend, folder, args.pg_url, "daemon") as database_url:
        with log_path.open("wb") as log:
            daemon = await anyio.open_process(
                [str(TRIGGERER), "run", "--config", str(daemon_config(folder, database_url))],
                cwd=folder,
                env=env,
                stdout=log,
                stderr=log,
            )
        try:
            base = await api_address(log_path, daemon)
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=base, headers=headers) as client:
                with anyio.fail_after(START_TIMEOUT_S):
                    # The pipelines are synced once the daemon has started: until then, 404.
                    while (await client.post("/pipelines/hold/runs", json={})).is_error:  # noqa: ASYNC110
                        await anyio.sleep(0.1)
            await api_throughput(base, args.warmup_events, TOKEN)
            before = process_cpu_s(daemon.pid)
            rate = await api_throughput(base, args.cpu_events, TOKEN)
            used_s = process_cpu_s(daemon.pid) - before
        finally:
            daemon.send_signal(signal.SIGTERM)
            with anyio.fail_after(START_TIMEOUT_S):
                await daemon.wait()
    return {
        "cpu_ms_per_event": round(1000 * used_s / args.cpu_events, 3),
        "events_per_s": round(rate),
    }


async def compare_daemon_cpu(
    backend: str, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """:func:`daemon_cpu` of this checkout, alternating with ``--alongside``'s when given."""
    codes = {"this": THIS_CHECKOUT}
    if args.alongside:
        codes = {"alongside": args.alongside.resolve(), **codes}
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
    for number in range(args.rounds if args.alongside else 1):
        for name, code in codes.items():
            folder = workdir / f"cpu-{backend}-{name}-{number}"
            rounds[name].append(await daemon_cpu(backend, args, folder, code))
    result: dict[str, Any] = {}
    for name, figures in rounds.items():
        result[name] = {
            key: [figure[key] for figure in figures] for key in ("cpu_ms_per_event", "events_per_s")
        }
        result[name]["cpu_ms_per_event_median"] = statistics.median(
            result[name]["cpu_ms_per_event"]
        )
    result["this"]["goal_cpu_ms_per_event"] = GOAL_CPU_MS_PER_EVENT
    if args.alongside:
        result["cpu_ratio_this_to_alongside"] = round(
            result["this"]["cpu_ms_per_event_median"]
            / result["alongside"]["cpu_ms_per_event_median"],
            2,
        )
    return result


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"meta": {"cores": os.cpu_count(), "clients": CLIENTS}}
    with tempfile.TemporaryDirectory(prefix="bench-api-") as workdir:
        for backend in args.backends:
            results[backend] = {}
            if "in_process" in args.parts:
                results[backend] = await measure(backend, args, Path(workdir))
            if "daemon_cpu" in args.parts:
                results[backend]["daemon_cpu"] = await compare_daemon_cpu(
                    backend, args, Path(workdir)
                )
    results["meta"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench_api.json"))
    parser.add_argument("--quick", action="store_true", help="small sizes: " + json.dumps(QUICK))
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="server to create databases on")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument(
        "--backends", nargs="+", choices=("sqlite", "postgresql"), default=["sqlite", "postgresql"]
    )
    parser.add_argument(
        "--alongside", type=Path, help="daemon_cpu: a checkout of the last landed version"
    )
    parser.add_argument("--rounds", type=int, default=2, help="daemon_cpu rounds with --alongside")
    args = parser.parse_args(argv)
    for name, size in (QUICK if args.quick else FULL).items():
        setattr(args, name, size)
    configure_logging(LoggingSettings(level="WARNING", format="console"))
    results = anyio.run(run_all, args)
    publish(results, args.out)


if __name__ == "__main__":
    main()
