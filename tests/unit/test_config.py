"""Settings from the TOML file and ``TRIGGERER_<SECTION>__<KEY>``, and named connections."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from triggerer.connections import UnknownConnection, get_connection
from triggerer.service.config import CONFIG_ENV, ConfigError, current_settings, load_settings
from triggerer.service.principals import Principal, Role, token_digest


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("TRIGGERER_") and name != "TRIGGERER_HOME":
            monkeypatch.delenv(name)
    # Recorded by monkeypatch, so the value load_settings(path) writes is undone afterwards.
    monkeypatch.setenv(CONFIG_ENV, "")
    current_settings.cache_clear()
    yield
    current_settings.cache_clear()


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "triggerer.toml"
    path.write_text(text)
    return path


def test_defaults_without_a_file() -> None:
    settings = load_settings()
    assert settings.database.url.startswith("sqlite:///")
    assert settings.database.url.endswith("triggerer.db")
    assert settings.pipelines.dir.name == "pipelines"
    assert (settings.api.host, settings.api.port, settings.api.tokens) == ("127.0.0.1", 8080, ())
    assert (settings.spark.mode, settings.spark.master, settings.spark.remote) == (
        "local",
        "local[*]",
        None,
    )
    assert settings.spark.conf == {}
    assert settings.listeners.plugins == ()
    assert settings.connections == {}


def test_file_values(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        """
        [database]
        url = "postgresql://127.0.0.1/test"
        [pipelines]
        dir = "/srv/pipelines"
        [api]
        port = 9000
        tokens = ["t1", "t2"]
        [spark]
        mode = "submit"
        master = "spark://127.0.0.1:7077"
        conf = { "spark.executor.memory" = "2g" }
        """,
    )
    settings = load_settings(path)
    assert settings.database.url == "postgresql://127.0.0.1/test"
    assert settings.pipelines.dir == Path("/srv/pipelines")
    assert (settings.api.port, settings.api.tokens) == (9000, ("t1", "t2"))
    assert (settings.spark.mode, settings.spark.master) == ("submit", "spark://127.0.0.1:7077")
    assert settings.spark.conf == {"spark.executor.memory": "2g"}


def test_file_named_by_triggerer_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _toml(tmp_path, "[api]\nport = 9100\n")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    assert load_settings().api.port == 9100
    assert current_settings().api.port == 9100


def test_env_overrides_the_file_and_keeps_its_other_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _toml(tmp_path, '[spark]\nmode = "submit"\nmaster = "spark://h:7077"\n')
    monkeypatch.setenv("TRIGGERER_SPARK__MODE", "connect")
    monkeypatch.setenv("TRIGGERER_SPARK__REMOTE", "sc://h:15002")
    monkeypatch.setenv("TRIGGERER_API__PORT", "9200")
    settings = load_settings(path)
    assert settings.spark.mode == "connect"
    assert settings.spark.master == "spark://h:7077"
    assert settings.api.port == 9200


def test_bad_value_names_key_value_and_allowed_values(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[spark]\nmode = "cluster"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert "spark.mode" in message
    assert "'cluster'" in message
    for allowed in ("local", "classic", "connect", "submit"):
        assert allowed in message
    assert "TRIGGERER_SPARK__MODE" in message


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("[daemon]\nheartbeat_interval_s = inf", "daemon.heartbeat_interval_s", "finite"),
        ("[daemon]\nheartbeat_interval_s = 1e12", "daemon.heartbeat_interval_s", "86400"),
        ("[daemon]\nshutdown_grace_s = nan", "daemon.shutdown_grace_s", "finite"),
        ("[pipelines]\nreload_interval_s = 1e300", "pipelines.reload_interval_s", "86400"),
        ("[daemon]\nrestart_backoff_max_s = -inf", "daemon.restart_backoff_max_s", "finite"),
    ],
)
def test_times_must_be_finite_and_at_most_a_day(
    tmp_path: Path, text: str, key: str, problem: str
) -> None:
    with pytest.raises(ConfigError, match=rf"{key} = .*{problem}"):
        load_settings(_toml(tmp_path, text + "\n"))


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("notaurl", "unsupported database URL 'notaurl'"),
        ("mysql://u:secret@h/db", "unsupported database URL 'mysql://u:***@h/db'"),
        ("postgresql://u:secret@h:99999/db", "port 99999 is not a port (1 to 65535)"),
    ],
)
def test_database_url_must_be_one_the_store_takes(
    monkeypatch: pytest.MonkeyPatch, url: str, problem: str
) -> None:
    monkeypatch.setenv("TRIGGERER_DATABASE__URL", url)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert f"database.url: Value error, {problem}" in str(info.value)
    assert "secret" not in str(info.value)


def test_unreadable_file_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _toml(tmp_path, "[daemon]\n")

    def unreadable(*_: object, **__: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Path, "open", unreadable)  # root reads any file: say it cannot
    with pytest.raises(ConfigError, match=r"cannot be read: \[Errno 13\] Permission denied"):
        load_settings(path)


@pytest.mark.parametrize(
    ("spark", "key", "value", "allowed"),
    [
        ('mode = "connect"', "spark.remote", "None", "sc://host:port"),
        (
            'mode = "connect"\nremote = "127.0.0.1:15002"',
            "spark.remote",
            "'127.0.0.1:15002'",
            "sc://",
        ),
        ('mode = "local"\nremote = "sc://h:port"', "spark.remote", "'sc://h:port'", "sc://"),
        ('mode = "submit"\nmaster = " "', "spark.master", "' '", "spark://host:7077"),
        ('mode = "local"\nmaster = ""', "spark.master", "''", "local[*]"),
        ('mode = "classic"\nmaster = ""', "spark.master", "''", "local[*]"),
        ("conf = { 'spark.master' = 'yarn' }", "spark.conf", "'spark.master'", "[spark] master"),
        (
            'mode = "submit"\nconf = { "spark.submit.deployMode" = "cluster" }',
            "spark.conf",
            "'cluster'",
            "must be 'client'",
        ),
    ],
)
def test_spark_settings_that_would_fail_every_run_are_config_errors(
    tmp_path: Path, spark: str, key: str, value: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(_toml(tmp_path, f"[spark]\n{spark}\n"))
    message = str(info.value)
    assert f"{key} = " in message
    assert value in message
    assert allowed in message


def test_spark_settings_that_fit_together(tmp_path: Path) -> None:
    connect = load_settings(
        _toml(tmp_path, '[spark]\nmode = "connect"\nremote = "sc://h/;token=t"')
    )
    assert connect.spark.remote == "sc://h/;token=t"
    # The master is not used in connect mode.
    assert load_settings(
        _toml(tmp_path, '[spark]\nmode = "connect"\nremote = "sc://h:1"\nmaster = ""')
    )


def test_bad_env_value_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIGGERER_API__PORT", "70000")
    with pytest.raises(ConfigError, match=r"api\.port") as info:
        load_settings()
    assert "70000" in str(info.value)


def test_an_env_value_that_is_not_json_names_the_variable_not_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The way principals reach a container: a JSON list in the environment.
    monkeypatch.setenv("TRIGGERER_API__PRINCIPALS", '[{"name": ')
    with pytest.raises(ConfigError) as info:
        load_settings(_toml(tmp_path, "[api]\nport = 9000\n"))
    message = str(info.value)
    assert message.startswith("the environment sets [api] (TRIGGERER_API__<KEY>")
    assert "not valid JSON" in message
    assert "TOML" not in message


@pytest.mark.parametrize(
    ("text", "key"),
    [("[spark]\nmasterr = 'local'\n", "spark.masterr"), ("[sparkk]\nmode = 'local'\n", "sparkk")],
)
def test_unknown_key_is_a_config_error(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match="unknown setting") as info:
        load_settings(_toml(tmp_path, text))
    assert key in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_settings(missing)
    assert str(missing) in str(info.value)


def test_bad_toml_is_a_config_error(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[spark\nmode = \n")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_settings(path)
    assert str(path) in str(info.value)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_current_settings_is_read_once() -> None:
    assert current_settings() is current_settings()


# --- connections ----------------------------------------------------------------------------


def test_get_connection_returns_the_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _toml(tmp_path, '[connections.kafka]\nbootstrap = "a:9092"\nuser = "u"\n')
    monkeypatch.setenv(CONFIG_ENV, str(path))
    assert get_connection("kafka") == {"bootstrap": "a:9092", "user": "u"}


def test_get_connection_returns_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV, str(_toml(tmp_path, '[connections.kafka]\nuser = "u"\n')))
    get_connection("kafka")["user"] = "changed"
    assert get_connection("kafka") == {"user": "u"}


def test_connection_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _toml(tmp_path, '[connections.kafka]\nbootstrap = "a:9092"\nuser = "u"\n')
    monkeypatch.setenv(CONFIG_ENV, str(path))
    monkeypatch.setenv("TRIGGERER_CONNECTIONS__KAFKA__BOOTSTRAP", "b:9092")
    monkeypatch.setenv("TRIGGERER_CONNECTIONS__SQS__REGION", "eu-west-1")
    current_settings.cache_clear()
    assert get_connection("kafka") == {"bootstrap": "b:9092", "user": "u"}
    assert get_connection("sqs") == {"region": "eu-west-1"}


def test_unknown_connection_names_it_and_the_known_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _toml(tmp_path, "[connections.kafka]\nuser = 'u'\n[connections.sqs]\nregion = 'x'\n")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    with pytest.raises(UnknownConnection) as info:
        get_connection("warehouse")
    message = str(info.value)
    assert "'warehouse'" in message
    assert "known: kafka, sqs" in message
    assert isinstance(info.value, KeyError)


def test_unknown_connection_without_any_configured() -> None:
    with pytest.raises(UnknownConnection, match="none are configured"):
        get_connection("kafka")


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "::", "api.example.com"])  # noqa: S104 - refused
def test_an_api_open_beyond_loopback_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    monkeypatch.setenv("TRIGGERER_API__HOST", host)
    with pytest.raises(ConfigError, match="the API would be open to the network") as info:
        load_settings()
    assert repr(host) in str(info.value)
    monkeypatch.setenv("TRIGGERER_API__TOKENS", "s3cret")
    assert load_settings().api.host == host
    monkeypatch.setenv("TRIGGERER_API__ENABLED", "false")
    monkeypatch.delenv("TRIGGERER_API__TOKENS")
    assert load_settings().api.enabled is False


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_an_open_api_may_listen_on_loopback(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    monkeypatch.setenv("TRIGGERER_API__HOST", host)
    assert load_settings().api.tokens == ()


SECRET = "pr1ncipal-s3cret"  # noqa: S105 - a token the tests configure, never shown
SECRET_SHA256 = hashlib.sha256(SECRET.encode()).hexdigest()


def _principals(*entries: str, api: str = "") -> str:
    """A config file's text: ``[api]`` with ``api`` and an ``[[api.principals]]`` per entry."""
    return f"[api]\n{api}\n" + "".join(f"[[api.principals]]\n{entry}\n" for entry in entries)


def test_principals_with_their_roles_tokens_digests_and_globs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIGGERER_API__HOST", "0.0.0.0")  # noqa: S104 - principals are tokens
    text = _principals(
        'name = "dashboard"\nrole = "viewer"\ntoken = "v"',
        f'name = "orders-feed"\nrole = "emitter"\ntoken_sha256 = "{SECRET_SHA256.upper()}"\n'
        'assets = ["orders*", "s3://lake/sales/*"]',
        'name = "on-call"\nrole = "operator"\ntoken = "o"',
        'name = "platform"\nrole = "admin"\ntoken = "a"',
        api='tokens = ["t"]',
    )
    api = load_settings(_toml(tmp_path, text)).api
    assert [entry.principal() for entry in api.principals] == [
        Principal("dashboard", Role.VIEWER),
        Principal("orders-feed", Role.EMITTER, ("orders*", "s3://lake/sales/*")),
        Principal("on-call", Role.OPERATOR),
        Principal("platform", Role.ADMIN),
    ]
    assert api.principals[0].digest == token_digest("v")
    assert api.principals[1].digest == token_digest(SECRET)
    assert (api.tokens, api.is_open) == (("t",), False)


TOKEN = f'token = "{SECRET}"'


@pytest.mark.parametrize(
    ("name", "fields", "problem"),
    [
        ("x", f'role = "superuser"\n{TOKEN}', "role 'superuser' is not a role: viewer, emitter"),
        ("x", f'role = "Viewer"\n{TOKEN}', "role 'Viewer' is not a role"),
        ("x", f'role = "emitter"\n{TOKEN}', "an emitter needs assets"),
        ("x", f'role = "emitter"\nassets = []\n{TOKEN}', "an emitter needs assets"),
        ("x", f'role = "emitter"\nassets = ["a*", ""]\n{TOKEN}', "glob must not be empty"),
        ("x", f'role = "viewer"\nassets = ["a*"]\n{TOKEN}', "only an emitter takes assets"),
        ("x", f'role = "operator"\nassets = []\n{TOKEN}', "only an emitter takes assets"),
        ("x", 'role = "viewer"', "give its token as token or as token_sha256"),
        (
            "x",
            f'role = "viewer"\n{TOKEN}\ntoken_sha256 = "{SECRET_SHA256}"',
            "give its token as token or as token_sha256",
        ),
        ("x", 'role = "viewer"\ntoken = " "', "the token must not be empty"),
        ("x", 'role = "viewer"\ntoken_sha256 = "abc"', "token_sha256 must be 64 hex digits"),
        ("x", f'role = "viewer"\ntoken_sha256 = "{"g" * 64}"', "must be 64 hex digits"),
        ("api-token-1", f'role = "viewer"\n{TOKEN}', "the name is one the daemon gives"),
        ("cli:root", f'role = "viewer"\n{TOKEN}', "the name is one the daemon gives"),
        ("anonymous", f'role = "viewer"\n{TOKEN}', "the name is one the daemon gives"),
        ("n" * 251, f'role = "viewer"\n{TOKEN}', "longer than 250 characters"),
    ],
)
def test_a_bad_principal_is_a_config_error_naming_the_entry(
    tmp_path: Path, name: str, fields: str, problem: str
) -> None:
    text = _principals('name = "fine"\nrole = "viewer"\ntoken = "f"', f'name = "{name}"\n{fields}')
    with pytest.raises(ConfigError) as info:
        load_settings(_toml(tmp_path, text))
    message = str(info.value)
    assert f"api.principals[1]: principal {name!r}: " in message
    assert problem in message
    assert "TRIGGERER_API__PRINCIPALS" in message
    assert SECRET not in message


def test_a_principals_name_with_a_control_character_is_a_config_error(tmp_path: Path) -> None:
    text = _principals(f'name = "on\\tcall"\nrole = "viewer"\n{TOKEN}')
    with pytest.raises(ConfigError, match=r"principal 'on\\tcall': the name holds a control"):
        load_settings(_toml(tmp_path, text))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            _principals('role = "viewer"\ntoken = "v"'),
            "api.principals[0].name: Field required",
        ),
        (
            _principals('name = " "\nrole = "viewer"\ntoken = "v"'),
            "api.principals[0]: the name must not be empty",
        ),
        (
            _principals('name = "x"\nrole = "viewer"\ntoken = "v"\ntokn = "w"'),
            "api.principals[0].tokn: unknown setting",
        ),
        (
            _principals(
                'name = "a"\nrole = "viewer"\ntoken = "v"',
                'name = "b"\nrole = "viewer"\ntoken = "w"',
                'name = "a"\nrole = "operator"\ntoken = "o"',
            ),
            "api.principals: entries [0] ('a') and [2] ('a') have one name",
        ),
        (
            _principals(
                f'name = "a"\nrole = "viewer"\ntoken = "{SECRET}"',
                f'name = "b"\nrole = "operator"\ntoken_sha256 = "{SECRET_SHA256}"',
            ),
            "api.principals: entries [0] ('a') and [1] ('b') have one token",
        ),
        (
            _principals(
                'name = "a"\nrole = "viewer"\ntoken = "v"',
                f'name = "b"\nrole = "viewer"\ntoken_sha256 = "{SECRET_SHA256}"',
                api=f'tokens = ["t", "{SECRET}"]',
            ),
            "api.tokens: token 2 is also the token of api.principals[1] ('b')",
        ),
    ],
)
def test_principals_clashing_or_incomplete_are_config_errors_naming_the_entries(
    tmp_path: Path, text: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(_toml(tmp_path, text))
    assert problem in str(info.value)
    assert SECRET not in str(info.value)


def test_principals_from_the_environment_replace_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _toml(tmp_path, _principals('name = "file"\nrole = "viewer"\ntoken = "f"'))
    entries = [{"name": "ci", "role": "emitter", "token": SECRET, "assets": ["orders*"]}]
    monkeypatch.setenv("TRIGGERER_API__PRINCIPALS", json.dumps(entries))
    [entry] = load_settings(path).api.principals
    assert entry.principal() == Principal("ci", Role.EMITTER, ("orders*",))
    assert entry.digest == token_digest(SECRET)
    monkeypatch.setenv("TRIGGERER_API__PRINCIPALS", json.dumps([{**entries[0], "role": "root"}]))
    with pytest.raises(ConfigError, match=r"api.principals\[0\]: principal 'ci': role 'root'"):
        load_settings(path)


def test_principals_are_tokens_to_the_open_api_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIGGERER_API__HOST", "0.0.0.0")  # noqa: S104 - refused without tokens
    with pytest.raises(ConfigError, match="set tokens or principals"):
        load_settings()
    entries = [{"name": "dashboard", "role": "viewer", "token": SECRET}]
    monkeypatch.setenv("TRIGGERER_API__PRINCIPALS", json.dumps(entries))
    api = load_settings().api
    assert (api.host, api.tokens, api.is_open) == ("0.0.0.0", (), False)  # noqa: S104


@pytest.mark.parametrize(("text", "tokens"), [("a, b", ("a", "b")), ('["a", "b,c"]', ("a", "b,c"))])
def test_api_tokens_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, text: str, tokens: tuple[str, ...]
) -> None:
    monkeypatch.setenv("TRIGGERER_API__TOKENS", text)
    assert load_settings().api.tokens == tokens


def test_an_empty_api_token_is_refused_without_showing_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRIGGERER_API__TOKENS", "s3cret,")
    with pytest.raises(ConfigError, match="a token must not be empty") as info:
        load_settings()
    assert "s3cret" not in str(info.value)
