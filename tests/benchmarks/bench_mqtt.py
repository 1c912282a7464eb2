"""MqttTrigger throughput against a raw aiomqtt loop (receive + PUBACK), on one Mosquitto.

    python -m tests.benchmarks.bench_mqtt [--quick] [--messages 10000]

Starts a Mosquitto of its own (no queue limit). Each round makes two persistent sessions,
publishes the messages once (the broker queues a copy for each), then reads them: the raw
loop acknowledges each message as it comes through paho's manual acks, the trigger acks each
event as it comes (as the daemon does after its commit). Both have the same Receive Maximum.
The latency part publishes one message at a time to a running trigger and times each until
its event is yielded (publish -> event, without the daemon's commit).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.benchmarks.harness import Bench, main
from tests.benchmarks.providers import ack_each, order
from tests.fixtures.mqtt import mosquitto
from triggerer.triggers import TriggerEvent
from watchers.mqtt import MqttTrigger, send
from watchers.payloads import decode_body

ROUNDS = 3
IN_FLIGHT = 1_000
LATENCY_SAMPLES = 200


def session_client(port: int, client_id: str) -> aiomqtt.Client:
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 3600
    properties.ReceiveMaximum = IN_FLIGHT
    client = aiomqtt.Client(
        "127.0.0.1",
        port,
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=False,
        properties=properties,
    )
    client._client.manual_ack_set(True)  # as the trigger does
    return client


async def make_session(port: int, client_id: str, topic: str) -> None:
    async with session_client(port, client_id) as client:
        await client.subscribe(topic, qos=1)


async def raw_loop(port: int, client_id: str, messages: int) -> float:
    """Receive, decode the body, PUBACK: the least a QoS 1 reader that acks after use does."""
    async with session_client(port, client_id) as client:
        started = time.perf_counter()
        done = 0
        async for message in client.messages:
            decode_body(message.payload)  # type: ignore[arg-type]
            client._client.ack(message.mid, message.qos)
            done += 1
            if done == messages:
                break
        return time.perf_counter() - started


async def trigger_loop(uri: str, client_id: str, messages: int) -> float:
    trigger = MqttTrigger(uri=uri, client_id=client_id, max_in_flight=IN_FLIGHT)
    return await ack_each(trigger, messages, through_cleanup=True)


async def throughput(port: int, messages: int) -> list[dict[str, Any]]:
    seconds: dict[str, list[float]] = {"raw aiomqtt": [], "MqttTrigger": []}
    for _ in range(ROUNDS):
        topic = f"bench/{uuid.uuid4().hex}"
        uri = f"mqtt://127.0.0.1:{port}/{topic}"
        raw_id, trigger_id = f"raw-{uuid.uuid4().hex}", f"trigger-{uuid.uuid4().hex}"
        await make_session(port, raw_id, topic)
        await make_session(port, trigger_id, topic)
        for first in range(0, messages, 5_000):
            await send(uri, [order(i) for i in range(first, min(first + 5_000, messages))])
        seconds["raw aiomqtt"].append(await raw_loop(port, raw_id, messages))
        seconds["MqttTrigger"].append(await trigger_loop(uri, trigger_id, messages))
    results = [
        {
            "name": name,
            "messages": messages,
            "seconds": round(statistics.median(values), 3),
            "messages_per_s": round(messages / statistics.median(values), 1),
        }
        for name, values in seconds.items()
    ]
    raw_rate = results[0]["messages_per_s"]
    for result in results:
        result["ratio_to_raw"] = round(result["messages_per_s"] / raw_rate, 2)
    return results


async def latency(port: int) -> dict[str, Any]:
    """Publish one message (QoS 1, from a connected client), wait for its event;
    ``LATENCY_SAMPLES`` times."""
    topic = f"bench/{uuid.uuid4().hex}"
    uri = f"mqtt://127.0.0.1:{port}/{topic}"
    trigger = MqttTrigger(uri=uri, client_id=f"latency-{uuid.uuid4().hex}")
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    samples: list[float] = []
    pending: asyncio.Future[TriggerEvent] = asyncio.ensure_future(anext(events))
    try:
        while trigger.connections == 0:  # noqa: ASYNC110 - a counter the trigger keeps
            await asyncio.sleep(0.01)
        async with aiomqtt.Client("127.0.0.1", port, protocol=aiomqtt.ProtocolVersion.V5) as client:
            for index in range(LATENCY_SAMPLES):
                properties = Properties(PacketTypes.PUBLISH)
                properties.UserProperty = ("message-id", uuid.uuid4().hex)
                started = time.perf_counter()
                await client.publish(topic, order(index), qos=1, properties=properties)
                event = await pending
                samples.append(time.perf_counter() - started)
                assert event.ack is not None
                await event.ack()
                pending = asyncio.ensure_future(anext(events))
    finally:
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
        await events.aclose()
        await trigger.cleanup()
    ordered = sorted(samples)
    return {
        "name": "publish -> event",
        "samples": len(samples),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[int(len(ordered) * 0.95) - 1] * 1000, 2),
    }


async def part_mqtt(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The rounds and the latency on a Mosquitto of its own, persisting into ``folder``."""
    broker = mosquitto(folder / "mosquitto", folder)
    broker.start()
    try:
        rounds = await throughput(broker.port, args.messages)
        produced = await latency(broker.port)
    finally:
        broker.stop()
    return {"throughput": {run.pop("name"): run for run in rounds}, "latency": produced}


BENCH = Bench(
    module="tests.benchmarks.bench_mqtt",
    description="MqttTrigger against a raw aiomqtt loop, and publish -> event",
    parts={"mqtt": part_mqtt},
    full={"messages": 10_000},
    quick={"messages": 1_000},
)

if __name__ == "__main__":
    main(BENCH)
