"""``[tracing]``: off unless an exporter is chosen, its endpoint checked, its headers (which
may hold an API key) never shown in an error."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from triggerer.service.config import CONFIG_ENV, ConfigError, current_settings, load_settings


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("TRIGGERER_") and name != "TRIGGERER_HOME":
            monkeypatch.delenv(name)
    monkeypatch.setenv(CONFIG_ENV, "")  # undoes what load_settings(path) sets
    current_settings.cache_clear()
    yield
    current_settings.cache_clear()


def _load(tmp_path: Path, text: str) -> object:
    config = tmp_path / "triggerer.toml"
    config.write_text(f"[tracing]\n{text}\n")
    return load_settings(config).tracing


def test_tracing_is_off_by_default() -> None:
    tracing = load_settings().tracing
    assert (tracing.exporter, tracing.endpoint) == ("none", "http://127.0.0.1:4318/v1/traces")
    assert (tracing.service_name, tracing.headers, tracing.export_delay_s) == ("triggerer", {}, 5.0)


def test_otlp_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIGGERER_TRACING__EXPORTER", "otlp")
    tracing = _load(
        tmp_path,
        'endpoint = "https://collector:4318/v1/traces"\nheaders = {x-api-key = "k"}\n'
        "export_delay_s = 0.5\nmax_links = 5000",
    )
    assert tracing == load_settings().tracing.model_copy(
        update={
            "exporter": "otlp",
            "endpoint": "https://collector:4318/v1/traces",
            "headers": {"x-api-key": "k"},
            "export_delay_s": 0.5,
            "max_links": 5000,
        }
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('exporter = "jaeger"', "tracing.exporter = 'jaeger': Input should be 'none' or 'otlp'"),
        (
            'endpoint = "collector:4318"',
            "tracing.endpoint = 'collector:4318': must be the http(s) URL of an OTLP/HTTP "
            "traces endpoint, e.g. http://127.0.0.1:4318/v1/traces",
        ),
        ("export_delay_s = 0", "tracing.export_delay_s = 0: Input should be greater than 0"),
        ("max_links = 0", "tracing.max_links = 0: Input should be greater than or equal to 1"),
    ],
)
def test_a_bad_tracing_setting_is_named(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        _load(tmp_path, text)
    assert message in str(raised.value)


def test_the_headers_are_never_shown(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tracing\.headers") as raised:
        _load(tmp_path, 'headers = {x-api-key = ["s3cr3t-key"]}')
    assert "s3cr3t" not in str(raised.value)
