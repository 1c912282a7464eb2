"""The Helm chart's single-replica release, played by ``podman kube play`` from the image
``make image`` builds: the init container migrates the SQLite store on the claimed volume, the
daemon starts under the chart's security context (uid 10001, read-only root file system, its
settings from the ConfigMap, its token from the Secret), ``/api/v1/healthz`` answers, and an
event posted over REST becomes a successful run of a pipeline mounted from the ConfigMap.

Where podman 4.3 differs from Kubernetes, the test does what the cluster would: it creates the
Secrets itself (``podman secret create``, with the JSON podman reads a secretKeyRef from; kube
play's own Secret support stores what that lookup cannot read), publishes the API through
``hostPort`` on loopback (no Service), and leaves out the probes (podman makes an httpGet probe
a ``curl`` in the container, which the image does not have; a kubelet probes from outside).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.container.conftest import BUILD_TIMEOUT_S
from tests.container.podman import Podman, free_port
from tests.fixtures.helm import Helm, Manifest

RELEASE = "kubeplay"
FULLNAME = f"{RELEASE}-triggerer"
START_TIMEOUT_S = 240.0
"""The init container and the daemon starting, until ``/healthz`` answers."""
RUN_TIMEOUT_S = 480.0
"""The daemon's local Spark Connect server starting (a JVM: 150 s seen on a busy two-core
machine), then the run."""
pytestmark = [
    pytest.mark.container,
    # The session's first container test builds the image (tests/container/conftest.py).
    pytest.mark.timeout(BUILD_TIMEOUT_S + START_TIMEOUT_S + RUN_TIMEOUT_S + 120),
]
PIPELINE = """\
from triggerer import Asset, pipeline

orders = Asset("orders")


@pipeline(schedule=orders)
def count_orders(spark, context):
    assert spark.range(3).count() == 3
"""


def pod_logs(podman: Podman) -> str:
    """What the release's containers printed, for a failing assertion to show."""
    names = podman.ok("ps", "--all", "--filter", f"name={FULLNAME}", "--format", "{{.Names}}")
    logs = [(name, podman("logs", name)) for name in names.split()]
    return "".join(f"\n--- {name}\n{done.stdout}{done.stderr[-4000:]}" for name, done in logs)


def wait_until(podman: Podman, condition: str, check: Callable[[], bool], timeout_s: float) -> None:
    """Call ``check`` every half second until it returns true; past ``timeout_s``, fail
    naming ``condition`` with the pod's logs."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not {condition} in {timeout_s} s{pod_logs(podman)}"
        time.sleep(0.5)


@pytest.fixture
def api(podman: Podman, triggerer_image: str, tmp_path: Path) -> Iterator[httpx.Client]:
    """The release played in podman, removed afterwards with its Secrets and volumes: a client
    of its API on the host port, with the token the chart put in its Secret."""
    repository, _, tag = triggerer_image.rpartition(":")
    port = free_port()
    token = secrets.token_urlsafe(24)
    pipeline = tmp_path / "orders.py"
    pipeline.write_text(PIPELINE)
    helm = Helm(tmp_path / "helm", release=RELEASE, namespace="default")
    rendered = helm.render(
        *("--set", f"image.repository={repository}", "--set", f"image.tag={tag}"),
        *("--set", "image.pullPolicy=Never", "--set", f"hostPort={port}"),
        *("--set", f"api.tokens={{{token}}}", "--set", "config.runs.parallelism=1"),
        *("--set-file", f"pipelines.files.orders\\.py={pipeline}"),
    )
    played: list[Manifest] = []
    created: list[str] = []
    for manifest in rendered:
        if manifest["kind"] == "Secret":
            # podman reads a secretKeyRef's key from a JSON object of base64 values, which is
            # what a Kubernetes Secret's data is.
            data = tmp_path / f"{manifest['metadata']['name']}.json"
            data.write_text(json.dumps(manifest["data"]))
            podman.ok("secret", "create", manifest["metadata"]["name"], str(data))
            created.append(manifest["metadata"]["name"])
        elif manifest["kind"] in ("ConfigMap", "PersistentVolumeClaim", "Deployment"):
            played.append(manifest)
    (deployment,) = [manifest for manifest in played if manifest["kind"] == "Deployment"]
    # podman removes a "once" init container as soon as it exits, and here fails to ("it is
    # running"); "always" runs it at each start of the pod, as Kubernetes does.
    # (podman reads it from the Deployment's own annotations.)
    deployment["metadata"]["annotations"] = {"io.podman.annotations.init.container.type": "always"}
    pod = deployment["spec"]["template"]
    for container in pod["spec"]["containers"]:
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            container.pop(probe)
        for published in container["ports"]:
            published["hostIP"] = "127.0.0.1"  # this machine's loopback only
    kube = tmp_path / "kube.yaml"
    kube.write_text(yaml.safe_dump_all(played))
    try:
        podman.ok("kube", "play", str(kube), timeout_s=START_TIMEOUT_S)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        ) as client:
            yield client
    finally:
        podman("kube", "down", str(kube))
        for name in created:
            podman("secret", "rm", name)
        # The claim's volume and those kube play made of the ConfigMaps.
        for manifest in played:
            if manifest["kind"] != "Deployment":
                podman("volume", "rm", "--force", manifest["metadata"]["name"])


def test_the_release_runs_a_pipeline(podman: Podman, api: httpx.Client) -> None:
    client = api

    def healthy() -> bool:
        try:
            return client.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    wait_until(podman, "healthy", healthy, START_TIMEOUT_S)
    posted = client.post("/assets/events", json={"uri": "orders", "extra": {"n": 1}})
    assert posted.status_code == 201, posted.text

    def run_succeeded() -> bool:
        runs = client.get("/pipelines/count_orders/runs").json()
        assert all(run["state"] != "failed" for run in runs), f"{runs}{pod_logs(podman)}"
        return [run["state"] for run in runs] == ["success"]

    wait_until(podman, "a successful run", run_succeeded, RUN_TIMEOUT_S)
    # The daemon is ready by its own account too, with the token the Secret gave it.
    assert client.get("/readyz").status_code == 200
