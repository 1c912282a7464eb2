"""SqsTrigger throughput against a raw receive + delete-batch loop, on the same moto server.

    python -m tests.benchmarks.bench_sqs [--quick] [--messages 2000]

moto answers in ~20-80 ms a call, so the absolute numbers say little: the ratio to the raw loop
is the figure to watch (goal: at least 0.8).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiobotocore.session import get_session

from deploy.local.services import DUMMY_AWS_ENV, moto
from tests.benchmarks.harness import Bench, main
from tests.benchmarks.providers import ack_each
from watchers.sqs import SqsTrigger, send


async def fill(client: Any, name: str, messages: int) -> str:
    url: str = (await client.create_queue(QueueName=name))["QueueUrl"]
    await send(url, (json.dumps({"n": n, "pad": "x" * 200}) for n in range(messages)))
    return url


async def raw_loop(client: Any, url: str, messages: int) -> float:
    """Receive ten, delete those ten with one DeleteMessageBatch, repeat."""
    started = time.perf_counter()
    done = 0
    while done < messages:
        response = await client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1
        )
        batch = response.get("Messages", [])
        if batch:
            await client.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(batch)
                ],
            )
        done += len(batch)
    return time.perf_counter() - started


async def trigger_loop(url: str, messages: int, receivers: int) -> float:
    """Every event acked as it comes, as the daemon does after its commit; cleanup flushes."""
    trigger = SqsTrigger(url, wait_time_s=1, receivers=receivers)
    return await ack_each(trigger, messages, through_cleanup=True)


async def left_in(client: Any, url: str) -> int:
    response = await client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )
    return sum(int(value) for value in response["Attributes"].values())


async def bench(endpoint: str, messages: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    async with get_session().create_client("sqs", endpoint_url=endpoint) as client:
        runs: list[tuple[str, int]] = [("raw", 1), ("trigger", 1), ("trigger", 4)]
        for number, (kind, receivers) in enumerate(runs):
            url = await fill(client, f"bench-{number}", messages)
            if kind == "raw":
                seconds = await raw_loop(client, url, messages)
            else:
                seconds = await trigger_loop(url, messages, receivers)
            results.append(
                {
                    "name": f"{kind} receivers={receivers}",
                    "messages": messages,
                    "seconds": round(seconds, 3),
                    "messages_per_s": round(messages / seconds, 1),
                    "left_in_queue": await left_in(client, url),
                }
            )
    raw_rate = results[0]["messages_per_s"]
    for result in results:
        result["ratio_to_raw"] = round(result["messages_per_s"] / raw_rate, 2)
    return results


async def part_sqs(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The runs on a moto server of its own, logging into ``folder``, by name."""
    os.environ.update(DUMMY_AWS_ENV)
    server = moto(folder)
    server.start()
    try:
        runs = await bench(f"http://{server.address}", args.messages)
    finally:
        server.stop()
    return {run.pop("name"): run for run in runs}


BENCH = Bench(
    module="tests.benchmarks.bench_sqs",
    description="SqsTrigger against a raw receive + delete-batch loop",
    parts={"sqs": part_sqs},
    full={"messages": 2_000},
    quick={"messages": 200},
)

if __name__ == "__main__":
    main(BENCH)
