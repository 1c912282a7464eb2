"""`make bench`: run every benchmark script; each prints its table and writes its JSON."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

BENCHMARKS = (
    "bench_kafka",
    "bench_sqs",
    "bench_nats",
    "bench_rabbitmq",
    "bench_kinesis",
    "bench_pubsub",
    "bench_mqtt",
    "bench_redis_streams",
    "bench_latency",
    "bench_provider_latency",
    "bench_spark",
    "bench_ingest",
    "bench_tracing",
    "bench_retention",
    "bench_large_store",
    "bench_idle",
    "bench_idle_demo",
    "bench_fanout",
    "bench_time_conditions",
    "bench_scale",
    "bench_listeners",
    "bench_api",
    "bench_ui",
    "bench_cli",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("var/bench"), help="folder for JSON")
    parser.add_argument("names", nargs="*", default=BENCHMARKS, help="benchmarks to run")
    arguments = parser.parse_args()
    arguments.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in arguments.names:
        print(f"== {name}", flush=True)  # noqa: T201 - benchmark output
        out = str(arguments.out / f"{name}.json")
        command = [sys.executable, "-m", f"tests.benchmarks.{name}", "--out", out]
        result = subprocess.run(command, check=False)  # noqa: S603 - our own scripts
        if result.returncode:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)  # noqa: T201
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
