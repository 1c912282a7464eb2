"""``make demo`` as the README tells it: ``deploy/local/demo.py`` starts the brokers and the
daemon (local Spark), posts the orders and the customer and follows the runs; from another
shell, the commands of the README's demo section run exactly as printed there, each exiting 0
and doing what it says. Ctrl-C stops it all.

Was: the README's ``$TRIGGERER_DEMO_KAFKA`` existed only inside the demo, its run id was not
the demo's, and the demo started ``triggerer runs list --json`` every second to show the runs.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

from deploy.local.services import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # the whole demo: make test-slow

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
START_TIMEOUT_S = 180.0
"""The brokers, the daemon and its local Spark server on 2 busy cores, and the first runs."""
WAIT_S = 60.0
STOP_TIMEOUT_S = 90.0
RUN_LINE = re.compile(r"^  \d\d:\d\d:\d\d  (?P<run_id>\S+) +(?P<state>\S+) +events=\d+$")
SAYS = {
    "source .venv/bin/activate": "",
    "source var/demo/env.sh": "",
    "triggerer runs list": "total_orders__asset__1",
    "triggerer runs logs total_orders__asset__1": "2 order(s), total 42.5",
    "triggerer events list": "order_totals",
    "triggerer explain match_orders_to_customers": "match_orders_to_customers: schedule orders",
    "triggerer pipelines pause total_orders": "pipeline total_orders paused",
    "triggerer events emit orders": "on orders; queued for match_orders_to_customers, total_orders",
    "triggerer explain total_orders": "paused: no runs start; events are still queued",
    "triggerer pipelines unpause total_orders": "pipeline total_orders unpaused",
    "triggerer events dead-letters": "(none)",
    "triggerer post kafka orders": "sent 1 message(s) to orders",
    "triggerer post sqs customers": "sent 1 message(s) to customers",
}
"""What each command of the README prints (in part), by its first words."""


def another_shell_commands() -> list[str]:
    """The lines of the README's code block that follows "from another shell"."""
    after = README.read_text().split("from another shell", 1)[1]
    return after.split("```sh\n", 1)[1].split("\n```", 1)[0].splitlines()


def says(command: str) -> str:
    """What :data:`SAYS` expects of ``command``, found by its longest leading words."""
    words = shlex.split(command, comments=True)
    for end in range(len(words), 0, -1):
        if (key := " ".join(words[:end])) in SAYS:
            return SAYS[key]
    raise AssertionError(f"the README's command {command!r} is new: say in SAYS what it prints")


class Demo:
    """The demo's process, and the lines it printed so far."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.lines: list[str] = []

    async def read(self) -> None:
        assert self.process.stdout is not None
        pending = ""
        async for text in TextReceiveStream(self.process.stdout):
            *done, pending = (pending + text).split("\n")
            self.lines.extend(done)

    async def printed(self, wanted: Callable[[str], bool], timeout_s: float = WAIT_S) -> str:
        """The first line printed that is ``wanted``, waiting for it."""
        with anyio.fail_after(timeout_s):
            while True:
                found = [line for line in self.lines if wanted(line)]
                if found:
                    return found[0]
                assert self.process.returncode is None, "\n".join(self.lines)
                await anyio.sleep(0.2)

    def runs(self) -> list[tuple[str, str]]:
        """(run id, state) of each line of the runs it followed, in order."""
        return [
            (found["run_id"], found["state"])
            for found in map(RUN_LINE.match, self.lines)
            if found is not None
        ]


def shell_env() -> dict[str, str]:
    """A new shell's environment: nothing of the test's daemon or brokers."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("TRIGGERER_", "AWS_", "VIRTUAL_ENV"))
    }


def exported(env_file: Path) -> dict[str, str]:
    """The variables ``env_file`` exports."""
    return dict(
        shlex.split(line.removeprefix("export "))[0].split("=", 1)
        for line in env_file.read_text().splitlines()
        if line.startswith("export ")
    )


async def test_the_readmes_commands_run_as_printed_beside_the_demo(tmp_path: Path) -> None:
    commands = another_shell_commands()
    setup = [command for command in commands if command.startswith("source ")]
    assert [shlex.split(line, comments=True)[1] for line in setup] == [
        ".venv/bin/activate",
        "var/demo/env.sh",
    ]
    # Another checkout: its .venv, and its var/demo, where the demo writes env.sh.
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    state = tmp_path / "var" / "demo"
    api_port = free_port()  # not the config's 8080, which a demo of the user's may hold
    demo_env = shell_env() | {"PYTHONUNBUFFERED": "1", "TRIGGERER_API__PORT": str(api_port)}
    argv = [sys.executable, str(ROOT / "deploy" / "local" / "demo.py"), "--state-dir", str(state)]

    async with (
        await anyio.open_process(argv, env=demo_env, stderr=subprocess.STDOUT) as process,
        anyio.create_task_group() as group,
    ):
        demo = Demo(process)
        group.start_soon(demo.read)
        try:
            # The addresses, printed and in env.sh.
            await demo.printed(lambda line: line.endswith("$TRIGGERER_DATABASE__URL"))
            variables = exported(state / "env.sh")
            assert variables["TRIGGERER_DEMO_API"] == f"http://127.0.0.1:{api_port}"
            printed = "\n".join(demo.lines)
            for name in (
                "TRIGGERER_DEMO_KAFKA",
                "TRIGGERER_DEMO_SQS_ENDPOINT",
                "TRIGGERER_DEMO_API",
            ):
                assert re.search(rf"{re.escape(variables[name])} +\${name}$", printed, re.M)
            await demo.printed(
                lambda line: bool(re.match(r"  \S+  total_orders__asset__1 +success", line)),
                timeout_s=START_TIMEOUT_S,
            )

            for command in commands[len(setup) :]:
                script = "\n".join([*setup, command])  # as typed in one shell
                done = await anyio.run_process(
                    ["bash", "-c", script], cwd=tmp_path, env=shell_env(), check=False
                )
                out, err = done.stdout.decode(), done.stderr.decode()
                assert done.returncode == 0, f"{command}\n{out}{err}"
                assert says(command) in out, f"{command}\n{out}{err}"
                if by_hand := re.search(r"^event (\d+) on orders", out):
                    order_by_hand = by_hand[1]

            # The order emitted while total_orders was paused waited, and ran once unpaused.
            await demo.printed(
                lambda line: bool(
                    re.match(rf"  \S+  total_orders__asset__{order_by_hand} +success", line)
                )
            )
            # The customer posted by hand, with the order emitted and the one posted, start a
            # second run of match_orders_to_customers; the posted order is stored.
            await demo.printed(
                lambda line: bool(re.match(r"  \S+  match_orders_to_customers__asset__[^1]", line))
            )
            async with httpx.AsyncClient(base_url=variables["TRIGGERER_DEMO_API"]) as client:
                events = (await client.get("/api/v1/assets/events")).json()
            values = [event["extra"].get("payload", {}).get("value") for event in events]
            assert {"id": 3, "amount": 7} in values
        finally:
            process.send_signal(signal.SIGINT)  # Ctrl-C
            with anyio.fail_after(STOP_TIMEOUT_S):
                await process.wait()
            group.cancel_scope.cancel()

    assert process.returncode == 0, "\n".join(demo.lines)
    assert demo.lines[-1] == "stopping..."
    # Each run is printed when it appears and when its state changes, not on every look.
    runs = demo.runs()
    assert len(runs) == len(set(runs)), "\n".join(demo.lines)
    assert ("total_orders__asset__1", "success") in runs
