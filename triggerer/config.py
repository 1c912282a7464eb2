"""Typed settings: ``config/triggerer.toml`` overridden by ``TRIGGERER_<SECTION>__<KEY>``.

The file is the one given with ``--config`` or in ``TRIGGERER_CONFIG``; without one the
embedded defaults apply (SQLite and pipelines under ``~/.triggerer``, local Spark).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

CONFIG_ENV = "TRIGGERER_CONFIG"
HOME = Path(os.environ.get("TRIGGERER_HOME", Path.home() / ".triggerer"))


class ConfigError(ValueError):
    """A setting has a bad value; the message names the key, the value and what is allowed."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseSettings(_Section):
    url: str = f"sqlite:///{HOME / 'triggerer.db'}"


class PipelinesSettings(_Section):
    dir: Path = HOME / "pipelines"
    reload_interval_s: float = Field(default=1.0, gt=0)


class ApiSettings(_Section):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    tokens: tuple[str, ...] = ()


class SparkSettings(_Section):
    mode: Literal["local", "connect", "submit"] = "local"
    master: str = "local[*]"
    remote: str | None = None
    conf: dict[str, str] = {}
    logs_dir: Path = HOME / "logs"


class DaemonSettings(_Section):
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    ingest_batch_size: int = Field(default=500, ge=1)
    restart_backoff_max_s: float = Field(default=60.0, gt=0)

    @property
    def dead_after_s(self) -> float:
        """An instance silent this long (three heartbeats) is dead: ``triggerer check`` fails,
        its runs run again elsewhere and its leases move."""
        return 3 * self.heartbeat_interval_s


class LoggingSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["auto", "json", "console"] = "auto"


class ListenersSettings(_Section):
    plugins: tuple[str, ...] = ()


class Settings(BaseSettings):
    """All settings; see ``config/triggerer.toml`` for what each key does."""

    model_config = SettingsConfigDict(
        env_prefix="TRIGGERER_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    database: DatabaseSettings = DatabaseSettings()
    pipelines: PipelinesSettings = PipelinesSettings()
    api: ApiSettings = ApiSettings()
    spark: SparkSettings = SparkSettings()
    daemon: DaemonSettings = DaemonSettings()
    logging: LoggingSettings = LoggingSettings()
    listeners: ListenersSettings = ListenersSettings()
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
    except ValueError as error:  # tomllib.TOMLDecodeError is a ValueError
        raise ConfigError(f"config file {config_file!r} is not valid TOML: {error}") from None


@functools.cache
def current_settings() -> Settings:
    """The settings of this process, read once."""
    return load_settings()


def _describe(error: pydantic.ValidationError, config_file: str | None) -> str:
    where = f" in {config_file}" if config_file else ""
    lines = [f"invalid configuration{where}:"]
    for problem in error.errors():
        key = ".".join(str(part) for part in problem["loc"])
        env = "TRIGGERER_" + "__".join(str(part).upper() for part in problem["loc"])
        if problem["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown setting (from the file or {env})")
        else:
            lines.append(f"  {key} = {problem['input']!r}: {problem['msg']} (or set {env})")
    return "\n".join(lines)
