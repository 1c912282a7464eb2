"""Typed settings: ``config/triggerer.toml`` overridden by ``TRIGGERER_<SECTION>__<KEY>``.

The file is the one given with ``--config`` or in ``TRIGGERER_CONFIG``; without one the
embedded defaults apply (SQLite and pipelines under ``~/.triggerer``, local Spark).
"""

from __future__ import annotations

import functools
import importlib.util
import ipaddress
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import pydantic
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from triggerer import connections
from triggerer.service import tls
from triggerer.service.principals import (
    NAME_MAX_CHARS,
    Principal,
    Role,
    reserved,
    token_digest,
)

CONFIG_ENV = "TRIGGERER_CONFIG"
HOME = Path(os.environ.get("TRIGGERER_HOME", Path.home() / ".triggerer"))


class ConfigError(ValueError):
    """A setting has a bad value; the message names the key, the value and what is allowed."""


class _Section(BaseModel):
    # No NaN or infinity: a time that never comes is no setting (and breaks the clocks).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


DAY_S = 86_400.0
"""The longest interval or wait a setting may give."""
MAX_RETENTION_DAYS = 36_500
"""The longest a store may keep anything (a hundred years; ``0`` keeps it for ever)."""


class DatabaseSettings(_Section):
    url: str = f"sqlite:///{HOME / 'triggerer.db'}"

    @field_validator("url")
    @classmethod
    def _supported(cls, url: str) -> str:
        # The store's imports, only when needed.
        from triggerer.service.store.engine import async_url, sqlite_file

        parsed = async_url(url)  # a ValueError naming the URL, password hidden
        if parsed.port is not None and not 0 < parsed.port <= 65535:
            raise ValueError(f"port {parsed.port} is not a port (1 to 65535)")
        file = sqlite_file(parsed)
        if file is not None and file.is_dir():
            # SQLite cannot open it, which would look like an outage retried forever.
            raise ValueError(
                f"{file} is a folder: name the database file in it, e.g. "
                f"sqlite:///{file / 'triggerer.db'}"
            )
        return url


class PipelinesSettings(_Section):
    dir: Path = HOME / "pipelines"
    reload_interval_s: float = Field(default=1.0, gt=0, le=DAY_S)


TOKEN_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
"""What ``token_sha256`` holds: a SHA-256 digest in hex."""


def _entry_error(kind: str, message: str) -> PydanticCustomError:
    """An error whose ``message`` is used as it is (a name in it may hold braces)."""
    return PydanticCustomError(kind, "{message}", {"message": message})


class PrincipalSettings(_Section):
    """An ``[[api.principals]]`` entry: a caller of the API with its role, known by its token
    (or the token's SHA-256 digest, so the file need not hold the secret).

    Each entry is checked here, each error naming it; the checks across entries (one token or
    one name twice) are :class:`ApiSettings`'.
    """

    name: str
    role: str
    token: str | None = None
    token_sha256: str | None = None
    assets: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _usable(self) -> PrincipalSettings:
        if not self.name.strip():
            raise _entry_error("api_principal", "the name must not be empty")
        for problem in (self._name_problem(), self._token_problem(), self._assets_problem()):
            if problem is not None:
                raise _entry_error("api_principal", f"principal {self.name!r}: {problem}")
        return self

    def _name_problem(self) -> str | None:
        if len(self.name) > NAME_MAX_CHARS:
            return f"the name is longer than {NAME_MAX_CHARS} characters, the audit log's limit"
        if not self.name.isprintable():
            return "the name holds a control character, which the audit log would not show"
        if reserved(self.name):
            return (
                "the name is one the daemon gives (anonymous, api-token-N, cli:USER), which "
                "the audit log would not tell apart: choose another"
            )
        if self.role not in tuple(Role):
            return f"role {self.role!r} is not a role: {', '.join(Role)}"
        return None

    def _token_problem(self) -> str | None:
        if (self.token is None) == (self.token_sha256 is None):
            return (
                "give its token as token or as token_sha256 (the token's SHA-256 in hex), one "
                "of them"
            )
        if self.token is not None and not self.token.strip():
            return "the token must not be empty"
        if self.token_sha256 is not None and not TOKEN_SHA256.fullmatch(self.token_sha256):
            return (
                "token_sha256 must be 64 hex digits, the SHA-256 of the token "
                "(printf %s TOKEN | sha256sum)"
            )
        return None

    def _assets_problem(self) -> str | None:
        if self.role != Role.EMITTER:
            if self.assets is not None:
                return f"only an emitter takes assets; the role {self.role} acts on every asset"
            return None
        if not self.assets:
            return (
                "an emitter needs assets, the globs of the asset names or URIs it may emit to, "
                'e.g. assets = ["orders*"]'
            )
        if any(not glob for glob in self.assets):
            return "an asset glob must not be empty"
        return None

    @property
    def digest(self) -> bytes:
        """The SHA-256 digest of its token."""
        if self.token_sha256 is not None:
            return bytes.fromhex(self.token_sha256)
        return token_digest(self.token or "")  # one of the two is given: checked above

    def principal(self) -> Principal:
        return Principal(self.name, Role(self.role), self.assets or ())


class ApiSettings(_Section):
    """The REST API the daemon serves under ``/api/v1``.

    Its callers are the bearers of ``tokens`` (each an admin) and the ``principals``, each with
    its role. Without either the API is open, so it must listen on a loopback address;
    ``port = 0`` picks a free port (the daemon logs it as ``api_listening``). With
    ``tls_certfile`` and ``tls_keyfile`` it serves HTTPS only; with ``tls_client_ca`` too, only
    to clients presenting a certificate that CA signed (mutual TLS, which authenticates no
    principal: tokens still decide who may do what).
    """

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    principals: tuple[PrincipalSettings, ...] = ()
    # Validated even when left out: an open API must not listen beyond this host.
    tokens: Annotated[tuple[str, ...], NoDecode] = Field(default=(), validate_default=True)

    @field_validator("principals")
    @classmethod
    def _principals_differ(
        cls, principals: tuple[PrincipalSettings, ...]
    ) -> tuple[PrincipalSettings, ...]:
        for what, key in (("name", _name), ("token", _digest)):
            first: dict[object, int] = {}
            for index, principal in enumerate(principals):
                earlier = first.setdefault(key(principal), index)
                if earlier != index:
                    raise _entry_error(
                        "api_principals",
                        f"entries [{earlier}] ({principals[earlier].name!r}) and [{index}] "
                        f"({principal.name!r}) have one {what}: each principal needs its own",
                    )
        return principals

    @field_validator("tokens", mode="before")
    @classmethod
    def _from_text(cls, tokens: object) -> object:
        # TRIGGERER_API__TOKENS holds a JSON list ["a","b"] or plain text a,b.
        if not isinstance(tokens, str):
            return tokens
        if tokens.lstrip().startswith("["):
            return json.loads(tokens)
        return tuple(token.strip() for token in tokens.split(","))

    @field_validator("tokens")
    @classmethod
    def _open_only_on_loopback(
        cls, tokens: tuple[str, ...], info: ValidationInfo
    ) -> tuple[str, ...]:
        if any(not token.strip() for token in tokens):
            raise PydanticCustomError("api_tokens", "a token must not be empty")
        if "principals" not in info.data:
            return tokens  # the principals' own error says what is wrong
        principals: tuple[PrincipalSettings, ...] = info.data["principals"]
        by_digest = {principal.digest: index for index, principal in enumerate(principals)}
        for number, token in enumerate(tokens, start=1):
            index = by_digest.get(token_digest(token))
            if index is not None:
                raise _entry_error(
                    "api_tokens",
                    f"token {number} is also the token of api.principals[{index}] "
                    f"({principals[index].name!r}): each caller needs its own",
                )
        host = info.data.get("host", "")
        if (
            not tokens
            and not principals
            and info.data.get("enabled", True)
            and not is_loopback(host)
        ):
            raise PydanticCustomError(
                "api_open",
                "the API would be open to the network on host '{host}': set tokens or "
                "principals, or listen on a loopback address such as 127.0.0.1",
                {"host": host},
            )
        return tokens

    # TLS: PEM files, checked when the settings are read (unless the API is off), so that a bad
    # one stops the daemon before it starts; a CLI verb reading these settings reads them too.
    tls_certfile: Path | None = None
    # Validated even when left out: a certificate needs its key, and the key a certificate.
    tls_keyfile: Path | None = Field(default=None, validate_default=True)
    tls_client_ca: Path | None = None

    @field_validator("tls_certfile")
    @classmethod
    def _a_certificate(cls, certfile: Path | None, info: ValidationInfo) -> Path | None:
        if certfile is not None and info.data.get("enabled", True):
            _tls_file(tls.check_certificates, certfile)
        return certfile

    @field_validator("tls_keyfile")
    @classmethod
    def _the_certificates_key(cls, keyfile: Path | None, info: ValidationInfo) -> Path | None:
        if "tls_certfile" not in info.data:  # the certificate's own error says it
            return keyfile
        certfile = info.data["tls_certfile"]
        if certfile is None and keyfile is not None:
            raise PydanticCustomError(
                "api_tls", "a key without its certificate: set tls_certfile too, or neither"
            )
        if certfile is not None and keyfile is None:
            raise PydanticCustomError(
                "api_tls",
                "HTTPS with the certificate {certfile} needs its private key: set tls_keyfile "
                "too, or neither",
                {"certfile": str(certfile)},
            )
        if keyfile is not None and certfile is not None and info.data.get("enabled", True):
            _tls_file(tls.check_key, keyfile, certfile)
        return keyfile

    @field_validator("tls_client_ca")
    @classmethod
    def _clients_ca(cls, client_ca: Path | None, info: ValidationInfo) -> Path | None:
        if client_ca is None:
            return client_ca
        if info.data.get("tls_certfile", ...) is None:
            raise PydanticCustomError(
                "api_tls",
                "mutual TLS needs HTTPS: set tls_certfile and tls_keyfile too, or remove it",
            )
        if info.data.get("enabled", True):
            _tls_file(tls.check_certificates, client_ca)
        return client_ca

    @property
    def is_open(self) -> bool:
        """Whether no token is configured: anyone who reaches the API may use it."""
        return not self.tokens and not self.principals


def _tls_file(check: Callable[..., None], *files: Path) -> None:
    """``check(*files)``; its error as the setting's, which ``load_settings`` shows with the key
    and the file."""
    try:
        check(*files)
    except tls.TlsFileError as error:
        raise PydanticCustomError("api_tls", "{problem}", {"problem": str(error)}) from None


def _name(principal: PrincipalSettings) -> object:
    return principal.name


def _digest(principal: PrincipalSettings) -> object:
    return principal.digest


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SparkSettings(_Section):
    """Where runs execute. Combinations that would fail every run are refused at start."""

    mode: Literal["local", "classic", "connect", "submit"] = "local"
    master: str = "local[*]"
    # Validated even when left out: "connect" mode needs it.
    remote: str | None = Field(default=None, validate_default=True)
    conf: dict[str, str] = {}
    logs_dir: Path = HOME / "logs"

    @field_validator("master")
    @classmethod
    def _master_is_named(cls, master: str, info: ValidationInfo) -> str:
        if not master.strip() and info.data.get("mode") in ("local", "classic", "submit"):
            raise PydanticCustomError(
                "spark_master",
                "a Spark master is required in 'local', 'classic' and 'submit' mode, e.g. "
                "local[*], spark://host:7077, k8s://https://host:6443 or yarn",
            )
        return master

    @field_validator("remote")
    @classmethod
    def _remote_is_a_connect_url(cls, remote: str | None, info: ValidationInfo) -> str | None:
        if remote is None:
            if info.data.get("mode") == "connect":
                raise PydanticCustomError(
                    "spark_remote",
                    "'connect' mode needs the Spark Connect server's address, sc://host:port",
                )
            return remote
        if not _is_connect_url(remote):
            raise PydanticCustomError("spark_remote", "must be a Spark Connect URL, sc://host:port")
        return remote

    @field_validator("conf")
    @classmethod
    def _conf_agrees_with_the_other_keys(cls, conf: dict[str, str]) -> dict[str, str]:
        for key, setting in (("spark.master", "master"), ("spark.remote", "remote")):
            if key in conf:
                raise PydanticCustomError(
                    "spark_conf",
                    "set [spark] {setting} instead of the conf key {key}",
                    {"setting": setting, "key": key},
                )
        if conf.get("spark.submit.deployMode", "client") != "client":
            raise PydanticCustomError(
                "spark_conf",
                "spark.submit.deployMode must be 'client': a run's driver is a child process "
                "of the daemon, which hands it the run and reads back its outlets",
            )
        return conf


def _is_connect_url(text: str) -> bool:
    """``sc://host[:port][/;params]``, what ``SparkSession.builder.remote`` accepts."""
    url = urlsplit(text)
    try:
        url.port  # noqa: B018 - raises ValueError when the port is not a number
    except ValueError:
        return False
    return url.scheme == "sc" and bool(url.hostname)


def default_parallelism() -> int:
    """One run per core, and at most one per 2 GiB of memory (a run's Spark driver and Python
    take about that), at least one."""
    cores = os.cpu_count() or 1
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(cores, int(memory_gib // 2)))


MIB = 1024 * 1024


class RunsSettings(_Section):
    parallelism: int = Field(default_factory=default_parallelism, ge=1)
    # The most of a try's log the store keeps: its first quarter and last three quarters, the
    # middle cut (daemon/log_shipping.py). At least 4 KiB, at most 1 GiB.
    log_max_bytes: int = Field(default=4 * MIB, ge=4096, le=1024 * MIB)
    # Each pipeline's backlog (queued events and those of runs not started) past which the
    # watchers feeding only full pipelines stop fetching; a pipeline's max_backlog wins. None:
    # unbounded, every message is stored as it comes.
    max_backlog: int | None = Field(default=None, ge=1)


class DaemonSettings(_Section):
    heartbeat_interval_s: float = Field(default=5.0, gt=0, le=DAY_S)
    shutdown_grace_s: float = Field(default=30.0, ge=0, le=DAY_S)
    ingest_batch_size: int = Field(default=500, ge=1)
    restart_backoff_max_s: float = Field(default=60.0, gt=0, le=DAY_S)

    @property
    def dead_after_s(self) -> float:
        """An instance silent this long (three heartbeats) is dead: ``triggerer check`` fails,
        its runs run again elsewhere and its leases move."""
        return 3 * self.heartbeat_interval_s


class RetentionSettings(_Section):
    """How long the store keeps what it no longer needs; ``0`` days keeps that kind for ever."""

    events_days: int = Field(default=30, ge=0, le=MAX_RETENTION_DAYS)
    runs_days: int = Field(default=30, ge=0, le=MAX_RETENTION_DAYS)
    dead_letters_days: int = Field(default=30, ge=0, le=MAX_RETENTION_DAYS)
    # A year: the audit log answers "who changed this?" long after the events and runs have gone.
    audit_days: int = Field(default=365, ge=0, le=MAX_RETENTION_DAYS)
    interval_s: float = Field(default=600.0, gt=0, le=DAY_S)
    batch_size: int = Field(default=500, ge=1, le=10_000)


class LoggingSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["auto", "json", "console"] = "auto"


class ListenersSettings(_Section):
    plugins: tuple[str, ...] = ()
    max_pending_events: int = Field(default=10_000, ge=1)


OpenLineageTransport = Literal["http", "file", "kafka", "console"]


class OpenLineageSettings(_Section):
    """OpenLineage run events (START, COMPLETE, FAIL, ABORT) the daemon sends; off unless
    ``enabled``. Each transport needs its keys: ``url`` (http), ``path`` (file),
    ``bootstrap_servers`` (kafka)."""

    enabled: bool = False
    transport: OpenLineageTransport = "http"
    namespace: str = Field(default="triggerer", min_length=1)
    # Validated even when left out: the transport chosen needs them.
    url: str | None = Field(default=None, validate_default=True)
    endpoint: str = "api/v1/lineage"
    api_key: str | None = None
    path: Path | None = Field(default=None, validate_default=True)
    bootstrap_servers: str | None = Field(default=None, validate_default=True)
    topic: str = Field(default="openlineage", min_length=1)
    kafka_config: dict[str, str] = {}
    timeout_s: float = Field(default=5.0, gt=0, le=DAY_S)
    max_pending_events: int = Field(default=1_000, ge=1)

    @field_validator("url")
    @classmethod
    def _http_has_a_url(cls, url: str | None, info: ValidationInfo) -> str | None:
        if url is not None:
            parsed = urlsplit(url)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise PydanticCustomError(
                    "openlineage_url",
                    "must be an http(s) URL with a host, e.g. http://marquez:5000",
                )
        elif _needs(info, "http"):
            raise PydanticCustomError(
                "openlineage_url",
                "transport 'http' needs the backend's URL, e.g. http://marquez:5000",
            )
        return url

    @field_validator("path")
    @classmethod
    def _file_has_a_path(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        if path is None and _needs(info, "file"):
            raise PydanticCustomError(
                "openlineage_path",
                "transport 'file' needs the file the events are appended to, e.g. "
                "var/openlineage.jsonl",
            )
        if path is not None and path.is_dir():
            raise PydanticCustomError(
                "openlineage_path", "is a folder: name the file the events are appended to"
            )
        return path

    @field_validator("bootstrap_servers")
    @classmethod
    def _kafka_has_servers(cls, servers: str | None, info: ValidationInfo) -> str | None:
        if not _needs(info, "kafka"):
            return servers
        if not servers or not servers.strip():
            raise PydanticCustomError(
                "openlineage_kafka",
                "transport 'kafka' needs the brokers, e.g. kafka-1:9092,kafka-2:9092",
            )
        if importlib.util.find_spec("confluent_kafka") is None:
            raise PydanticCustomError(
                "openlineage_kafka",
                "transport 'kafka' needs confluent-kafka: "
                "pip install 'triggerer[openlineage-kafka]'",
            )
        return servers


def _needs(info: ValidationInfo, transport: OpenLineageTransport) -> bool:
    """Whether the OpenLineage settings validated so far send with ``transport``."""
    return bool(info.data.get("enabled")) and info.data.get("transport") == transport


class TracingSettings(_Section):
    """OpenTelemetry spans the daemon exports (docs/tracing.md): off with ``exporter = "none"``;
    ``"otlp"`` sends them over OTLP/HTTP (protobuf) to ``endpoint``."""

    exporter: Literal["none", "otlp"] = "none"
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    service_name: str = Field(default="triggerer", min_length=1)
    headers: dict[str, str] = {}
    timeout_s: float = Field(default=10.0, gt=0, le=DAY_S)
    export_delay_s: float = Field(default=5.0, gt=0, le=DAY_S)
    max_queued_spans: int = Field(default=2048, ge=1)
    max_links: int = Field(default=1000, ge=1)

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, endpoint: str) -> str:
        parsed = urlsplit(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise PydanticCustomError(
                "tracing_endpoint",
                "must be the http(s) URL of an OTLP/HTTP traces endpoint, e.g. "
                "http://127.0.0.1:4318/v1/traces",
            )
        return endpoint


class Settings(BaseSettings):
    """All settings; see ``config/triggerer.toml`` for what each key does."""

    model_config = SettingsConfigDict(
        env_prefix="TRIGGERER_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    database: DatabaseSettings = DatabaseSettings()
    pipelines: PipelinesSettings = PipelinesSettings()
    api: ApiSettings = ApiSettings()
    spark: SparkSettings = SparkSettings()
    runs: RunsSettings = RunsSettings()
    daemon: DaemonSettings = DaemonSettings()
    retention: RetentionSettings = RetentionSettings()
    logging: LoggingSettings = LoggingSettings()
    listeners: ListenersSettings = ListenersSettings()
    openlineage: OpenLineageSettings = OpenLineageSettings()
    tracing: TracingSettings = TracingSettings()
    connections: dict[str, dict[str, Any]] = {}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get(CONFIG_ENV)
        if path:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(path)))
        return tuple(sources)


def load_settings(path: str | Path | None = None) -> Settings:
    """Read settings from ``path`` (or ``TRIGGERER_CONFIG``) and the environment.

    A missing file, bad TOML or a bad value raises :class:`ConfigError`.
    """
    if path is not None:
        os.environ[CONFIG_ENV] = str(Path(path).resolve())
        current_settings.cache_clear()
    config_file = os.environ.get(CONFIG_ENV)
    if config_file and not Path(config_file).is_file():
        raise ConfigError(f"config file {config_file!r} does not exist")
    try:
        return Settings()
    except pydantic.ValidationError as error:
        raise ConfigError(_describe(error, config_file)) from None
    except SettingsError as error:  # a variable holding a list or a table that is not JSON
        raise ConfigError(_environment_error(error)) from None
    except ValueError as error:  # tomllib.TOMLDecodeError is a ValueError
        raise ConfigError(f"config file {config_file!r} is not valid TOML: {error}") from None
    except OSError as error:  # there, but not readable by this user
        raise ConfigError(f"config file {config_file!r} cannot be read: {error}") from None


def _environment_error(error: SettingsError) -> str:
    """What is wrong with the environment variable of a section, which pydantic-settings names
    only by the section's field (``error parsing value for field "api" ...``)."""
    field = re.search(r'for field "([^"]+)"', str(error))
    section = field.group(1) if field else "a section"
    variables = f"TRIGGERER_{section.upper()}__<KEY> or TRIGGERER_{section.upper()}"
    return (
        f"the environment sets [{section}] ({variables}) to a value that is not valid JSON, as "
        f"a list or a table must be there: {error.__cause__ or error}"
    )


@functools.cache
def current_settings() -> Settings:
    """The settings of this process, read once."""
    return load_settings()


# Triggers name their connections (triggerer.connections); these settings hold them.
connections.read_from(lambda: current_settings().connections)


def _describe(error: pydantic.ValidationError, config_file: str | None) -> str:
    where = f" in {config_file}" if config_file else ""
    lines = [f"invalid configuration{where}:"]
    for problem in error.errors():
        loc = problem["loc"]
        key = ".".join(str(part) for part in loc)
        env = "TRIGGERER_" + "__".join(str(part).upper() for part in loc)
        principal = loc[:2] == ("api", "principals")
        if principal:
            # An entry of the list by its index; the environment holds the whole list.
            key = "api.principals" + "".join(
                f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc[2:]
            )
            env = "TRIGGERER_API__PRINCIPALS"
        if problem["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown setting (from the file or {env})")
        # Never show a password, a token or a key.
        elif (
            principal
            or key in ("database.url", "api.tokens", "openlineage.api_key")
            or key.startswith("tracing.headers")
        ):
            lines.append(f"  {key}: {problem['msg']} (or set {env})")
        else:
            lines.append(f"  {key} = {problem['input']!r}: {problem['msg']} (or set {env})")
    return "\n".join(lines)
