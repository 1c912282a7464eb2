"""Clients POSTing events as fast as they can, in a process of their own (as other deployments
would be): the daemon under test keeps its process, and the clients' CPU is not counted as its.

    python -m tests.benchmarks.post_load BASE_URL URI EVENTS CLIENTS [TOKEN]

Prints ``{"events_per_s": ...}``. With ``TOKEN``, each request bears it (``[api] tokens``).
aiohttp (installed with aiobotocore) costs the client a fraction of what httpx does per
request, so one process can load a 2-core machine's daemon.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import aiohttp


async def post_events(
    base_url: str, uri: str, count: int, clients: int, token: str | None = None
) -> float:
    per_client = count // clients
    connector = aiohttp.TCPConnector(limit=clients)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with aiohttp.ClientSession(
        base_url.rstrip("/") + "/", connector=connector, headers=headers
    ) as session:

        async def post_many(offset: int) -> None:
            for index in range(per_client):
                body = {"uri": uri, "extra": {"i": offset + index}}
                async with session.post("assets/events", json=body) as response:
                    if response.status != 201:
                        raise RuntimeError(f"{response.status}: {await response.text()}")

        started = time.perf_counter()
        await asyncio.gather(*(post_many(n * per_client) for n in range(clients)))
        return per_client * clients / (time.perf_counter() - started)


def main() -> None:
    base_url, uri, count, clients = sys.argv[1:5]
    token = sys.argv[5] if len(sys.argv) > 5 else None
    rate = asyncio.run(post_events(base_url, uri, int(count), int(clients), token))
    sys.stdout.write(json.dumps({"events_per_s": rate}) + "\n")


if __name__ == "__main__":
    main()
