"""Asset URI and name rules: each accepted form, each rejection, password warnings, plugins."""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import PurePosixPath
from urllib.parse import SplitResult

import pytest

from triggerer import uri as uri_module
from triggerer.uri import (
    MAX_LENGTH,
    SCHEME_PLUGIN_GROUP,
    AssetUriWarning,
    InvalidAssetName,
    InvalidAssetUri,
    normalize_uri,
    validate_name,
)

PLUGIN_MODULE = "fake_triggerer_uri_plugins"


@pytest.fixture(autouse=True)
def _fresh_plugin_caches() -> Iterator[None]:
    """Each test discovers and loads scheme plugins afresh."""
    uri_module._scheme_entry_points.cache_clear()
    uri_module._scheme_plugin.cache_clear()
    yield
    uri_module._scheme_entry_points.cache_clear()
    uri_module._scheme_plugin.cache_clear()


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        # scheme-less identifiers: verbatim
        ("orders", "orders"),
        ("Orders", "Orders"),
        ("daily orders", "daily orders"),
        ("//example/asset", "//example/asset"),
        ("//Example/Asset#frag?", "//Example/Asset#frag?"),
        ("self", "self"),
        ("context", "context"),
        ("a" * MAX_LENGTH, "a" * MAX_LENGTH),
        ("1orders:x", "1orders:x"),
        # x- schemes: verbatim, in any case, even with a fragment or a password
        ("x-custom://Host/Path?b=1&a=2#frag", "x-custom://Host/Path?b=1&a=2#frag"),
        ("X-Custom://Host/Path", "X-Custom://Host/Path"),
        ("x-secret://user:pw@host/p", "x-secret://user:pw@host/p"),
        # s3: bucket required, bucket root is "/", key trailing slashes stripped
        ("s3://b", "s3://b/"),
        ("s3://b/", "s3://b/"),
        ("s3://b//", "s3://b/"),
        ("S3://Bucket/Key", "s3://Bucket/Key"),
        ("s3://b/k", "s3://b/k"),
        ("s3://b/k/", "s3://b/k"),
        ("s3://b/dir/k///", "s3://b/dir/k"),
        ("s3://b/dir//k", "s3://b/dir//k"),
        ("s3://b/k#frag", "s3://b/k"),
        ("s3://b#frag", "s3://b/"),
        ("s3://b/k?", "s3://b/k"),
        ("s3://b/k?b=2&a=1", "s3://b/k?a=1&b=2"),
        ("s3://b/k?a=2&c=3&a=1", "s3://b/k?a=2&a=1&c=3"),
        ("s3://b/k?&b&&a=1&", "s3://b/k?a=1&b"),
        ("s3://b/k?x=%2F&A=+", "s3://b/k?A=+&x=%2F"),
        ("s3://b/k/?v=1#f", "s3://b/k?v=1"),
        ("s3://user@b/k", "s3://user@b/k"),
        ("s3://user:@b/k", "s3://user@b/k"),
        ("s3://:@b/k", "s3://b/k"),
        # gs: like s3
        ("gs://b", "gs://b/"),
        ("GS://b/o/", "gs://b/o"),
        ("gs://b/o?generation=2#f", "gs://b/o?generation=2"),
        # file: absolute path, no host but localhost
        ("file:///abs/path", "file:///abs/path"),
        ("FILE:///Abs/Path", "file:///Abs/Path"),
        ("file:/abs/path", "file:///abs/path"),
        ("file://localhost/abs", "file:///abs"),
        ("file://LocalHost/abs", "file:///abs"),
        ("file:///", "file:///"),
        # file: trailing slashes go (Airflow's own URI tests expect the same), the root stays
        ("file:///dir/", "file:///dir"),
        ("file:///123/456/", "file:///123/456"),
        ("file:///dir//", "file:///dir"),
        ("file://localhost/dir/", "file:///dir"),
        ("file:/dir/?b=1&a=2#f", "file:///dir?a=2&b=1"),
        ("file:////", "file:///"),
        ("file:////share/x/", "file:////share/x"),
        ("file:///C:/data/x.csv", "file:///C:/data/x.csv"),
        ("file:///abs?b=1&a=2#f", "file:///abs?a=2&b=1"),
        ("file:////share/x", "file:////share/x"),
        # postgres: scheme unified, host required, port 5432 by default, db/schema/table
        ("postgres://h/db/s/t", "postgres://h:5432/db/s/t"),
        ("postgresql://h/db/s/t", "postgres://h:5432/db/s/t"),
        ("PostgreSQL://Host/DB/Schema/Table", "postgres://Host:5432/DB/Schema/Table"),
        ("postgres://h:5433/db/s/t", "postgres://h:5433/db/s/t"),
        ("postgres://h:05432/db/s/t", "postgres://h:5432/db/s/t"),
        ("postgres://h:/db/s/t", "postgres://h:5432/db/s/t"),
        ("postgres://u@h/db/s/t", "postgres://u@h:5432/db/s/t"),
        ("postgres://[::1]/db/s/t", "postgres://[::1]:5432/db/s/t"),
        ("postgres://[::1]:6543/db/s/t", "postgres://[::1]:6543/db/s/t"),
        ("postgres://h/db/s/t?sslmode=x&app=y#f", "postgres://h:5432/db/s/t?app=y&sslmode=x"),
        # http(s): host required, default port dropped, empty path is "/"
        ("https://Example.com", "https://Example.com/"),
        ("https://h:443/x", "https://h/x"),
        ("http://h:80/x", "http://h/x"),
        ("http://h:443/x", "http://h:443/x"),
        ("https://h:8443/X/", "https://h:8443/X/"),
        ("HTTP://h/p?b=1&a=2#top", "http://h/p?a=2&b=1"),
        ("https://u@h", "https://u@h/"),
        # other schemes: scheme lower-cased, the rest verbatim
        ("KAFKA://Broker:9092/Topic", "kafka://Broker:9092/Topic"),
        ("kafka://b1:9092,b2:9092/t1,t2#x", "kafka://b1:9092,b2:9092/t1,t2#x"),
        (
            "sqs://queue?region=eu-west-1&endpoint_url=x",
            "sqs://queue?region=eu-west-1&endpoint_url=x",
        ),
        ("BigQuery:proj.ds.Table", "bigquery:proj.ds.Table"),
        ("Orders:Daily", "orders:Daily"),
        ("localhost:8080", "localhost:8080"),
        ("a+b.c-d://x/Y?", "a+b.c-d://x/Y?"),
        ("s3x://b", "s3x://b"),
        ("triggerers://x", "triggerers://x"),
    ],
)
def test_normalize_uri_accepts(uri: str, expected: str) -> None:
    assert normalize_uri(uri) == expected


@pytest.mark.parametrize(
    "uri",
    [
        "orders",
        "s3://B/k/",
        "gs://b",
        "file:/abs",
        "file:///123/456/",
        "file:////",
        "postgresql://h/db/s/t?b=1&a=2",
        "https://h:443",
        "KAFKA://b/t",
    ],
)
def test_normalize_uri_is_idempotent(uri: str) -> None:
    once = normalize_uri(uri)
    assert normalize_uri(once) == once


@pytest.mark.parametrize(
    ("uri", "rule"),
    [
        ("", "is empty"),
        (" ", "is blank"),
        ("\t\n", "is blank"),
        ("café", "non-ASCII character 'é' at index 3: percent-encode it as %C3%A9"),
        ("s3://b/\N{SNOWMAN}", "non-ASCII character"),
        ("a\nb", "control character '\\n' at index 1"),
        ("s3://b/k\t", "control character '\\t'"),
        ("x\x7f", "control character '\\x7f'"),
        (" orders", "leading or trailing whitespace: write 'orders'"),
        ("orders ", "leading or trailing whitespace: write 'orders'"),
        ("triggerer://x", "reserved scheme 'triggerer'"),
        ("TRIGGERER:x", "reserved scheme 'triggerer'"),
        ("triggerer:", "reserved scheme 'triggerer'"),
        ("airflow://x", "reserved scheme 'airflow'"),
        ("Airflow:x", "reserved scheme 'airflow'"),
        ("s3://", "needs a bucket: write s3://<bucket>/<key>"),
        ("s3:///k", "needs a bucket"),
        ("s3:b/k", "needs a bucket"),
        ("s3://u@/k", "needs a bucket"),
        ("s3://b:9000/k", "has a port, which a bucket does not take"),
        ("gs://", "needs a bucket: write gs://<bucket>/<key>"),
        ("file:rel/path", "has a relative path: write file:///<absolute path>"),
        ("file:", "has no path"),
        ("file://", "has no path"),
        ("file://localhost", "has no path"),
        ("file://data/x.csv", "has the host 'data'"),
        ("file://data/x.csv", "for example file:///data/x.csv"),
        ("file://u@localhost/x", "has the host 'u@localhost'"),
        ("file://localhost:1/x", "has the host"),
        ("postgres://", "needs a host"),
        ("postgres:///db/s/t", "needs a host"),
        ("postgres://h", "exactly a database, schema and table"),
        ("postgres://h/db", "exactly a database, schema and table"),
        ("postgres://h/db/s", "exactly a database, schema and table"),
        ("postgres://h/db/s/t/u", "exactly a database, schema and table"),
        ("postgres://h/db/s/t/", "exactly a database, schema and table"),
        ("postgres://h/db//t", "exactly a database, schema and table"),
        ("postgresql://h/db", "write postgres://<host>[:<port>]/<database>/<schema>/<table>"),
        ("postgres://h:0/db/s/t", "port '0': a port is a number from 1 to 65535"),
        ("postgres://h:65536/db/s/t", "port '65536'"),
        ("postgres://h:abc/db/s/t", "port 'abc'"),
        ("postgres://h:1:2/db/s/t", "port '1:2'"),
        ("postgres://[::1]x/db/s/t", "after the IPv6 host [::1]"),
        ("http://[::1/x", "cannot be parsed"),
        ("https://", "needs a host: write https://<host>[:<port>]/<path>"),
        ("http:///x", "needs a host"),
        ("http://h:http/x", "port 'http'"),
    ],
)
def test_normalize_uri_rejects(uri: str, rule: str) -> None:
    with pytest.raises(InvalidAssetUri) as caught:
        normalize_uri(uri)
    message = str(caught.value)
    assert message.startswith(f"asset URI {uri!r} ")
    assert rule in message


def test_too_long_uri_is_named_by_its_start_and_length() -> None:
    too_long = "s3://b/" + "k" * (MAX_LENGTH - 6)
    with pytest.raises(InvalidAssetUri) as caught:
        normalize_uri(too_long)
    message = str(caught.value)
    assert message.startswith(f"asset URI {too_long[:80]!r}... ({MAX_LENGTH + 1} characters)")
    assert f"longer than {MAX_LENGTH} characters" in message


def test_uri_that_normalises_beyond_the_limit_is_rejected() -> None:
    within = "postgres://h/db/s/" + "t" * (MAX_LENGTH - len("postgres://h/db/s/"))
    assert len(within) == MAX_LENGTH
    with pytest.raises(InvalidAssetUri, match=r"normalises to .* longer than 1500 characters"):
        normalize_uri(within)


def test_invalid_asset_uri_is_a_value_error() -> None:
    assert issubclass(InvalidAssetUri, ValueError)
    assert issubclass(AssetUriWarning, UserWarning)


def test_non_str_uri_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="asset URI must be a str, not PurePosixPath"):
        normalize_uri(PurePosixPath("/abs"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("uri", "expected", "redacted"),
    [
        ("s3://user:s3cret@b/k", "s3://user@b/k", "s3://user:***@b/k"),
        ("s3://:s3cret@b/k", "s3://b/k", "s3://:***@b/k"),
        ("S3://user:s3cret@b", "s3://user@b/", "s3://user:***@b"),
        (
            "postgresql://u:s3cret@h/d/s/t",
            "postgres://u@h:5432/d/s/t",
            "postgresql://u:***@h/d/s/t",
        ),
        ("https://u:s3cret@h/x", "https://u@h/x", "https://u:***@h/x"),
        (
            "kafka://u:s3cret@b1:9092,b2:9092/t",
            "kafka://u@b1:9092,b2:9092/t",
            "kafka://u:***@b1:9092,b2:9092/t",
        ),
        ("KAFKA://u:s3:cret@b/t#f", "kafka://u@b/t#f", "kafka://u:***@b/t#f"),
        ("s3://u:s3cret@@b/k", "s3://u@b/k", "s3://u:***@b/k"),
    ],
)
def test_password_is_dropped_with_a_warning(uri: str, expected: str, redacted: str) -> None:
    with pytest.warns(AssetUriWarning, match="password") as caught:
        normalized = normalize_uri(uri)
    assert normalized == expected
    message = str(caught[0].message)
    assert message.startswith(f"asset URI {redacted!r} has a password in it")
    assert "s3cret" not in message
    assert "stored in clear text" in message
    assert caught[0].filename == __file__, "the warning points at the caller"


def test_error_after_a_dropped_password_does_not_show_it() -> None:
    with (
        pytest.warns(AssetUriWarning, match="password"),
        pytest.raises(InvalidAssetUri, match="has the host") as caught,
    ):
        normalize_uri("file://u:s3cret@localhost/x")
    assert str(caught.value).startswith("asset URI 'file://u:***@localhost/x' ")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    "uri", ["s3://user@b/k", "s3://user:@b/k", "x-vault://u:pw@h/p", "orders:u:pw@x"]
)
def test_no_warning_without_a_password_to_drop(uri: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        normalize_uri(uri)


def test_reserved_scheme_error_does_not_show_the_password() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidAssetUri, match="reserved scheme") as caught:
            normalize_uri("triggerer://u:s3cret@h/x")
    assert "'triggerer://u:***@h/x'" in str(caught.value)
    assert "s3cret" not in str(caught.value)


# Names


@pytest.mark.parametrize(
    "name",
    [
        "orders",
        "Orders",
        "daily orders",
        "s3://b/k",
        "selfish",
        "Self",
        "CONTEXT",
        "a" * MAX_LENGTH,
    ],
)
def test_validate_name_accepts_and_returns_unchanged(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("", "is empty: give 1 to 1500 printable ASCII characters"),
        ("   ", "is blank"),
        ("a" * (MAX_LENGTH + 1), "longer than 1500 characters"),
        ("naïve", "non-ASCII character 'ï' at index 2: give 1 to 1500 printable ASCII"),
        ("a\tb", "control character '\\t' at index 1"),
        ("\x00", "control character '\\x00'"),
        (" orders", "leading or trailing whitespace: write 'orders'"),
        (
            "self",
            "is reserved (so are ['context', 'self']): choose another name, e.g. 'self_asset'",
        ),
        ("context", "is reserved"),
    ],
)
def test_validate_name_rejects(name: str, rule: str) -> None:
    with pytest.raises(InvalidAssetName) as caught:
        validate_name(name)
    message = str(caught.value)
    shown = repr(name) if len(name) <= 120 else repr(name[:80])
    assert message.startswith(f"asset name {shown}")
    assert rule in message
    assert issubclass(InvalidAssetName, ValueError)


def test_non_str_name_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="asset name must be a str, not int: 3"):
        validate_name(3)  # type: ignore[arg-type]


# Scheme plugins


def _kafka_lower_topic(parts: SplitResult) -> SplitResult:
    return parts._replace(path=parts.path.lower())


def _record(parts: SplitResult) -> SplitResult:
    _seen.append(parts)
    return parts


_seen: list[SplitResult] = []


def _reject(parts: SplitResult) -> SplitResult:
    raise ValueError("a topic is required: write kafka://<brokers>/<topic>")


def _reject_itself(parts: SplitResult) -> SplitResult:
    raise InvalidAssetUri("the plugin's own message")


def _not_a_split(parts: SplitResult) -> str:
    return "kafka://nope"


def _too_long(parts: SplitResult) -> SplitResult:
    return parts._replace(path="/" + "t" * MAX_LENGTH)


@pytest.fixture
def install_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Serve ``(scheme, attribute of the fake plugin module or module:attribute)`` entry points."""
    module = types.ModuleType(PLUGIN_MODULE)
    for function in (_kafka_lower_topic, _record, _reject, _reject_itself, _not_a_split):
        setattr(module, function.__name__, function)
    module._too_long = _too_long  # type: ignore[attr-defined]
    module.not_callable = 42  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, PLUGIN_MODULE, module)
    registered: list[tuple[str, str]] = []
    calls: list[str] = []

    def fake_entry_points(*, group: str) -> list[EntryPoint]:
        calls.append(group)
        return [
            EntryPoint(
                name=name, value=value if ":" in value else f"{PLUGIN_MODULE}:{value}", group=group
            )
            for name, value in registered
        ]

    monkeypatch.setattr(uri_module, "entry_points", fake_entry_points)
    _seen.clear()
    yield registered
    assert all(group == SCHEME_PLUGIN_GROUP for group in calls)
    assert len(calls) <= 1, "entry points are discovered once"


def test_plugin_normalises_its_scheme(install_plugins: list[tuple[str, str]]) -> None:
    install_plugins.append(("kafka", "_kafka_lower_topic"))
    assert (
        normalize_uri("KAFKA://Broker:9092/Orders?b=1&a=2#f")
        == "kafka://Broker:9092/orders?a=2&b=1"
    )


def test_plugin_gets_the_common_normalisation(install_plugins: list[tuple[str, str]]) -> None:
    install_plugins.append(("kafka", "_record"))
    with pytest.warns(AssetUriWarning, match="password"):
        assert normalize_uri("Kafka://u:pw@B/T?z=1&a=2#frag") == "kafka://u@B/T?a=2&z=1"
    assert _seen == [SplitResult("kafka", "u@B", "/T", "a=2&z=1", "")]


def test_plugin_entry_point_name_is_case_insensitive(
    install_plugins: list[tuple[str, str]],
) -> None:
    install_plugins.append(("Kafka", "_kafka_lower_topic"))
    assert normalize_uri("kafka://b/T") == "kafka://b/t"


def test_plugin_value_error_becomes_invalid_asset_uri(
    install_plugins: list[tuple[str, str]],
) -> None:
    install_plugins.append(("kafka", "_reject"))
    with pytest.raises(InvalidAssetUri) as caught:
        normalize_uri("kafka://b")
    assert str(caught.value) == (
        f"asset URI 'kafka://b' is rejected by the 'kafka' scheme plugin {PLUGIN_MODULE}:_reject: "
        "a topic is required: write kafka://<brokers>/<topic>"
    )
    assert isinstance(caught.value.__cause__, ValueError)


def test_plugin_invalid_asset_uri_passes_through(install_plugins: list[tuple[str, str]]) -> None:
    install_plugins.append(("kafka", "_reject_itself"))
    with pytest.raises(InvalidAssetUri, match=r"^the plugin's own message$"):
        normalize_uri("kafka://b/t")


def test_plugin_must_return_a_split_result(install_plugins: list[tuple[str, str]]) -> None:
    install_plugins.append(("kafka", "_not_a_split"))
    with pytest.raises(TypeError, match=r"returned 'kafka://nope' .* must return a urllib"):
        normalize_uri("kafka://b/t")


def test_plugin_must_be_callable(install_plugins: list[tuple[str, str]]) -> None:
    install_plugins.append(("kafka", "not_callable"))
    with pytest.raises(
        TypeError, match=r"'kafka' loads .*:not_callable = 42, which is not callable"
    ):
        normalize_uri("kafka://b/t")


def test_plugin_result_is_held_to_the_length_limit(
    install_plugins: list[tuple[str, str]],
) -> None:
    install_plugins.append(("kafka", "_too_long"))
    with pytest.raises(InvalidAssetUri, match="'kafka://b/t' normalises to"):
        normalize_uri("kafka://b/t")


def test_plugins_load_lazily_and_once(
    install_plugins: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    install_plugins.extend(
        [("kafka", "_kafka_lower_topic"), ("broken", "no_such_triggerer_plugin_module:f")]
    )
    assert normalize_uri("kafka://b/T") == "kafka://b/t"
    # Loaded once: the fake module can no longer be imported, and its scheme still works.
    monkeypatch.delitem(sys.modules, PLUGIN_MODULE)
    assert normalize_uri("kafka://b/U") == "kafka://b/u"
    # A broken plugin fails only the URIs of its own scheme, when first needed.
    assert normalize_uri("s3://b") == "s3://b/"
    with pytest.raises(ModuleNotFoundError, match="no_such_triggerer_plugin_module"):
        normalize_uri("broken://x")


@pytest.mark.parametrize("scheme", ["s3", "postgresql", "FILE", "triggerer", "airflow", "x-mine"])
def test_plugin_cannot_take_a_builtin_or_reserved_scheme(
    install_plugins: list[tuple[str, str]], scheme: str
) -> None:
    install_plugins.append((scheme, "_reject"))
    # Plugins are discovered with the first URI whose scheme is not built in.
    with pytest.warns(AssetUriWarning, match=f"ignoring .* entry point {scheme!r}"):
        assert normalize_uri("kafka://b/T") == "kafka://b/T"
    assert normalize_uri("s3://b/k/") == "s3://b/k"
    assert normalize_uri("postgresql://h/d/s/t") == "postgres://h:5432/d/s/t"
    assert normalize_uri("file:/x") == "file:///x"
    assert normalize_uri("x-mine://A") == "x-mine://A"
    with pytest.raises(InvalidAssetUri, match="reserved scheme"):
        normalize_uri("triggerer://x")


def test_second_plugin_for_a_scheme_is_ignored_with_a_warning(
    install_plugins: list[tuple[str, str]],
) -> None:
    install_plugins.extend([("kafka", "_kafka_lower_topic"), ("kafka", "_reject")])
    with pytest.warns(AssetUriWarning, match=r"_kafka_lower_topic already handles the scheme"):
        assert normalize_uri("kafka://b/T") == "kafka://b/t"


def test_unknown_scheme_without_a_plugin_is_verbatim(
    install_plugins: list[tuple[str, str]],
) -> None:
    install_plugins.append(("kafka", "_reject"))
    assert normalize_uri("SQS://Queue?b=1&a=2#f") == "sqs://Queue?b=1&a=2#f"


def test_real_entry_point_discovery_leaves_builtins_alone() -> None:
    assert normalize_uri("s3://b") == "s3://b/"
    assert normalize_uri("x-none://A") == "x-none://A"
