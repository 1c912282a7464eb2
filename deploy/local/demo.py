"""`make demo`: local Kafka (tansu) and SQS (moto), the daemon on its embedded default
(SQLite, local Spark), the demo pipelines in config/pipelines, and messages that fire them.

Runs are shown as they start and finish; Ctrl-C stops everything.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from deploy.local.services import DUMMY_AWS_ENV, moto, tansu  # noqa: E402 - after sys.path
from watchers.producers import send_kafka, send_sqs  # noqa: E402

STATE = ROOT / "var" / "demo"
TRIGGERER = Path(sys.executable).with_name("triggerer")


def main() -> int:
    # SIGTERM (a service manager, `timeout`) stops everything like Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    STATE.mkdir(parents=True, exist_ok=True)
    print("starting local SQS (moto) and Kafka (tansu)...")  # noqa: T201 - demo output
    sqs_server = moto(STATE)
    sqs_server.start()
    kafka = tansu(STATE)
    daemon: subprocess.Popen[bytes] | None = None
    try:
        kafka.start()
        endpoint = f"http://{sqs_server.address}"
        env = {
            **os.environ,
            **DUMMY_AWS_ENV,
            "TRIGGERER_CONFIG": str(ROOT / "config" / "triggerer.toml"),
            "TRIGGERER_DEMO_KAFKA": kafka.address,
            "TRIGGERER_DEMO_SQS": f"sqs://customers?region=us-east-1&endpoint_url={endpoint}",
            "TRIGGERER_LOGGING__FORMAT": "console",
        }
        os.environ.update(env)
        asyncio.run(create_queue_and_topic(endpoint, kafka.address))
        daemon_log = (STATE / "daemon.log").open("ab")
        # Its own session: Ctrl-C reaches only this script, which then stops the daemon once.
        daemon = subprocess.Popen(  # noqa: S603 - our own command
            [str(TRIGGERER), "run"], cwd=ROOT, env=env, stderr=daemon_log, start_new_session=True
        )
        print(f"triggerer is running (log: {STATE / 'daemon.log'}); posting messages...")  # noqa: T201
        print("the web UI and the REST API: http://127.0.0.1:8080/")  # noqa: T201
        time.sleep(5)  # let the watchers join their consumer group before the first message
        asyncio.run(_post(endpoint, kafka.address))
        _show_runs(env)
    except KeyboardInterrupt:
        print("\nstopping...")  # noqa: T201
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
        kafka.stop()
        sqs_server.stop()
    return 0


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


async def _post(endpoint: str, bootstrap: str) -> None:
    await send_kafka(bootstrap, "orders", [{"id": 1, "amount": 12.5}, {"id": 2, "amount": 30}])
    await send_sqs("customers", [{"name": "Ada"}], endpoint_url=endpoint, region_name="us-east-1")
    print("posted 2 orders to Kafka topic 'orders' and 1 customer to SQS queue 'customers'")  # noqa: T201


def _show_runs(env: dict[str, str]) -> None:
    shown = ""
    while True:
        listing = subprocess.run(  # noqa: S603
            [str(TRIGGERER), "runs", "list", "--json"], env=env, capture_output=True, check=False
        )
        if listing.returncode == 0:
            runs = json.loads(listing.stdout or b"[]")
            lines = "\n".join(
                f"  {r['run_id']:<55} {r['state']:<12} events={r['events']}" for r in reversed(runs)
            )
            if lines != shown:
                shown = lines
                print(f"\nruns ({time.strftime('%H:%M:%S')}), Ctrl-C to stop:\n{lines}")  # noqa: T201
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
