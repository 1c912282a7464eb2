"""`make demo`: local Kafka (tansu) and SQS (moto), the daemon on its embedded default
(SQLite, local Spark), the demo pipelines in config/pipelines, and messages that fire them.

The addresses of the brokers and of the API are printed at start and written to
``var/demo/env.sh``, for another shell to ``source``. Runs are shown as they are created and
change state, read from the REST API; Ctrl-C stops everything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402 - after sys.path

from deploy.local.services import DUMMY_AWS_ENV, moto, tansu  # noqa: E402
from triggerer.service.config import load_settings  # noqa: E402
from watchers.kafka import send as send_to_kafka  # noqa: E402
from watchers.sqs import send as send_to_sqs  # noqa: E402

STATE = ROOT / "var" / "demo"
CONFIG = ROOT / "config" / "triggerer.toml"
TRIGGERER = Path(sys.executable).with_name("triggerer")
ORDERS = [{"id": 1, "amount": 12.5}, {"id": 2, "amount": 30}]
START_TIMEOUT_S = 60.0
"""How long the daemon may take to answer on its API, and then to store the orders."""
FOLLOW_INTERVAL_S = 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--state-dir", type=Path, default=STATE, help="the database, logs and env.sh (var/demo)"
    )
    state = parser.parse_args(argv).state_dir.resolve()
    # SIGTERM (a service manager, `timeout`) stops everything like Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    fresh(state)
    print("starting local SQS (moto) and Kafka (tansu)...")  # noqa: T201 - demo output
    sqs_server = moto(state)
    sqs_server.start()
    kafka = tansu(state)
    daemon: subprocess.Popen[bytes] | None = None
    try:
        kafka.start()
        endpoint = f"http://{sqs_server.address}"
        env = demo_env(state, kafka.address, endpoint)
        write_env_file(state / "env.sh", env)
        os.environ.update(env)  # for the daemon, and for this script's clients of moto
        asyncio.run(create_queue_and_topic(endpoint, kafka.address))
        with (state / "daemon.log").open("ab") as daemon_log:
            # Its own session: Ctrl-C reaches only this script, which then stops the daemon.
            daemon = subprocess.Popen(  # noqa: S603 - our own command
                [str(TRIGGERER), "run"], cwd=ROOT, stderr=daemon_log, start_new_session=True
            )
        show_addresses(state, env)
        api = env["TRIGGERER_DEMO_API"]
        with httpx.Client(base_url=f"{api}/api/v1", timeout=10) as client:
            wait_until(daemon, lambda: client.get("/healthz").is_success, "answer on its API")
            # The orders are stored before the customer is sent, so that their events, and the
            # runs named after them, have the same ids on every start (total_orders__asset__1).
            orders = [json.dumps(order) for order in ORDERS]
            asyncio.run(send_to_kafka(f"kafka://{kafka.address}/orders", orders))
            wait_until(daemon, lambda: stored_events(client) >= len(ORDERS), "store the orders")
            asyncio.run(
                send_to_sqs(
                    "customers", ['{"name": "Ada"}'], endpoint_url=endpoint, region_name="us-east-1"
                )
            )
            print("posted 2 orders to Kafka topic 'orders' and 1 customer to SQS queue 'customers'")  # noqa: T201
            follow_runs(daemon, client)
    except KeyboardInterrupt:
        print("\nstopping...")  # noqa: T201
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
        kafka.stop()
        sqs_server.stop()
    return 0 if daemon is None or daemon.returncode == 0 else 1


def fresh(state: Path) -> None:
    """Each start with an empty database and no run logs: the brokers start empty too."""
    state.mkdir(parents=True, exist_ok=True)
    for path in state.glob("triggerer.db*"):
        path.unlink()
    shutil.rmtree(state / "logs", ignore_errors=True)


def demo_env(state: Path, kafka: str, sqs_endpoint: str) -> dict[str, str]:
    """What the daemon, and a shell using the demo, need: the config, the database and logs in
    ``state`` (absolute, so any folder will do), the brokers' and the API's addresses, and
    moto's credentials."""
    return {
        **DUMMY_AWS_ENV,
        "TRIGGERER_CONFIG": str(CONFIG),
        "TRIGGERER_DATABASE__URL": f"sqlite:///{state / 'triggerer.db'}",
        "TRIGGERER_SPARK__LOGS_DIR": str(state / "logs"),
        "TRIGGERER_DEMO_KAFKA": kafka,
        "TRIGGERER_DEMO_SQS_ENDPOINT": sqs_endpoint,
        "TRIGGERER_DEMO_SQS": f"sqs://customers?region=us-east-1&endpoint_url={sqs_endpoint}",
        "TRIGGERER_DEMO_API": api_url(),
        "TRIGGERER_LOGGING__FORMAT": "console",
    }


def api_url() -> str:
    """Where the daemon will serve its API and web UI: ``[api]`` of the config, unless the
    environment says otherwise (``TRIGGERER_API__PORT``)."""
    api = load_settings(str(CONFIG)).api
    return f"http://{api.host}:{api.port}"


def write_env_file(path: Path, env: dict[str, str]) -> None:
    lines = [f"# The running demo's addresses (deploy/local/demo.py): source {path}"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    path.write_text("\n".join(lines) + "\n")


def show_addresses(state: Path, env: dict[str, str]) -> None:
    shown = {
        "Kafka bootstrap servers": "TRIGGERER_DEMO_KAFKA",
        "SQS endpoint (queue customers)": "TRIGGERER_DEMO_SQS_ENDPOINT",
        "web UI and REST API": "TRIGGERER_DEMO_API",
        "database": "TRIGGERER_DATABASE__URL",
    }
    width = max(len(env[name]) for name in shown.values())
    lines = [f"  {what:<31} {env[name]:<{width}}  ${name}" for what, name in shown.items()]
    print(  # noqa: T201
        f"triggerer is starting (log: {state / 'daemon.log'}). The addresses, for another shell:"
        f" source {state / 'env.sh'}\n" + "\n".join(lines)
    )


def wait_until(daemon: subprocess.Popen[bytes], done: Callable[[], bool], what: str) -> None:
    """Call ``done()`` until it is true; the daemon's API may not answer yet meanwhile."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon exited with {daemon.returncode}: see its log")
        try:
            if done():
                return
        except httpx.TransportError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise SystemExit(f"the daemon did not {what} within {START_TIMEOUT_S:.0f} s")
        time.sleep(0.2)  # poll interval bounded by the deadline


def stored_events(client: httpx.Client) -> int:
    return len(client.get("/assets/events").json())


async def create_queue_and_topic(endpoint: str, bootstrap: str) -> None:
    from aiobotocore.session import get_session
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async with get_session().create_client("sqs", endpoint_url=endpoint) as client:
        await client.create_queue(QueueName="customers")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("orders", 1, replication_factor=1)])
    finally:
        await admin.close()


def follow_runs(daemon: subprocess.Popen[bytes], client: httpx.Client) -> None:
    """Print each run when it is created and when its state changes, read from the API once a
    second, until the daemon ends."""
    print("\nruns as they change (Spark takes a few seconds to start), Ctrl-C to stop:")  # noqa: T201
    states: dict[str, str] = {}
    while daemon.poll() is None:
        for run in reversed(runs(client)):  # oldest first
            if states.get(run["run_id"]) != run["state"]:
                states[run["run_id"]] = run["state"]
                print(  # noqa: T201
                    f"  {time.strftime('%H:%M:%S')}  {run['run_id']:<40} {run['state']:<8} "
                    f"events={run['events']}"
                )
        time.sleep(FOLLOW_INTERVAL_S)
    print(f"the daemon exited with {daemon.returncode}: see its log")  # noqa: T201


def runs(client: httpx.Client) -> list[dict[str, Any]]:
    """The runs, newest first; none while the API does not answer (the daemon is stopping)."""
    try:
        response = client.get("/runs", params={"limit": 1000})
    except httpx.TransportError:
        return []
    found: list[dict[str, Any]] = response.json() if response.is_success else []
    return found


if __name__ == "__main__":
    sys.exit(main())
