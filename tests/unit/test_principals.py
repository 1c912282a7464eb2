"""The permission model: what each role may do, an emitter's asset globs, the refusals' words,
and the principals known by their tokens."""

from __future__ import annotations

import itertools
import os
import pwd

import pytest

from triggerer.service.errors import Forbidden
from triggerer.service.principals import (
    ANONYMOUS,
    NAME_MAX_CHARS,
    ROLE_PERMISSIONS,
    Keyring,
    Permission,
    Principal,
    Role,
    cli_principal,
    reserved,
    token_digest,
    token_principal,
)
from triggerer.service.store.models import ID_LENGTH

READ, EMIT, OPERATE, AUDIT = (
    Permission.READ,
    Permission.EMIT,
    Permission.OPERATE,
    Permission.AUDIT,
)
EXPECTED = {
    Role.VIEWER: {READ},
    Role.EMITTER: {READ, EMIT},
    Role.OPERATOR: {READ, EMIT, OPERATE, AUDIT},
    Role.ADMIN: {READ, EMIT, OPERATE, AUDIT},
}
"""The role table of docs/api.md, written out."""


def principal(role: Role, assets: tuple[str, ...] = ()) -> Principal:
    return Principal(f"a-{role}", role, assets)


@pytest.mark.parametrize(("role", "permission"), list(itertools.product(Role, Permission)), ids=str)
def test_each_role_holds_exactly_the_permissions_of_the_table(
    role: Role, permission: Permission
) -> None:
    caller = principal(role, ("orders*",) if role is Role.EMITTER else ())
    holds = permission in EXPECTED[role]
    assert caller.may(permission) is holds
    assert (permission in ROLE_PERMISSIONS[role]) is holds
    if holds:
        caller.check(permission)
    else:
        with pytest.raises(Forbidden) as refused:
            caller.check(permission)
        message = str(refused.value)
        assert f"principal 'a-{role}' ({role})" in message
        assert f"the permission '{permission}'" in message
        holders = {
            Permission.EMIT: "emitter, operator and admin",
            Permission.OPERATE: "operator and admin",
            Permission.AUDIT: "operator and admin",
        }
        assert message.endswith(f"which {holders[permission]} hold")


def test_admin_holds_every_permission_there_is() -> None:
    assert ROLE_PERMISSIONS[Role.ADMIN] == frozenset(Permission)
    assert set(ROLE_PERMISSIONS) == set(Role)


@pytest.mark.parametrize("role", [Role.OPERATOR, Role.ADMIN])
def test_operators_and_admins_emit_to_every_asset(role: Role) -> None:
    caller = principal(role)
    assert caller.may_emit_to("customers", "s3://lake/customers")
    caller.check_emit("customers", "s3://lake/customers")


def test_a_viewer_emits_to_no_asset_and_is_told_it_lacks_emit() -> None:
    viewer = principal(Role.VIEWER)
    assert not viewer.may_emit_to("orders", "orders")
    with pytest.raises(Forbidden, match="lacks the permission 'emit' \\(create asset events\\)"):
        viewer.check_emit("orders", "orders")


@pytest.mark.parametrize(
    ("globs", "name", "uri", "allowed"),
    [
        (("orders*",), "orders", "orders", True),
        (("orders*",), "orders_eu", "orders_eu", True),
        (("orders*",), "customers", "customers", False),
        # The name or the URI: either matching is enough.
        (("orders*",), "orders", "s3://lake/sales/", True),
        (("s3://lake/sales/*",), "orders", "s3://lake/sales/2026/", True),
        (("s3://lake/sales/*",), "orders", "s3://lake/customers/", False),
        # Case-sensitive, as asset names and URIs are.
        (("orders*",), "Orders", "Orders", False),
        (("ORDERS",), "orders", "orders", False),
        # The whole text must match, not a part of it.
        (("orders",), "orders_eu", "orders_eu", False),
        (("orders",), "my_orders", "my_orders", False),
        # fnmatch: * across /, ? one character, [...] a class, [!...] its complement.
        (("s3://lake/*",), "x", "s3://lake/a/b/c", True),
        (("orders_??",), "orders_eu", "orders_eu", True),
        (("orders_??",), "orders_usa", "orders_usa", False),
        (("orders_[ae]*",), "orders_eu", "orders_eu", True),
        (("orders_[!ae]*",), "orders_eu", "orders_eu", False),
        (("orders_[!ae]*",), "orders_us", "orders_us", True),
        # Characters a regular expression would read are literal.
        (("a.b+(c)",), "a.b+(c)", "a.b+(c)", True),
        (("a.b",), "axb", "axb", False),
        # Several globs: any one.
        (("customers", "orders*"), "customers", "customers", True),
        (("customers", "orders*"), "invoices", "invoices", False),
        # Anything at all.
        (("*",), "anything", "x-any://where", True),
    ],
)
def test_an_emitter_emits_to_the_assets_its_globs_match_by_name_or_uri(
    globs: tuple[str, ...], name: str, uri: str, allowed: bool
) -> None:
    emitter = principal(Role.EMITTER, globs)
    assert emitter.may_emit_to(name, uri) is allowed
    if allowed:
        emitter.check_emit(name, uri)
    else:
        with pytest.raises(Forbidden):
            emitter.check_emit(name, uri)


def test_an_emitter_without_globs_emits_to_no_asset() -> None:
    assert not principal(Role.EMITTER).may_emit_to("orders", "orders")
    assert not principal(Role.EMITTER).may_emit_to("", "")


def test_an_emitters_refusal_names_it_the_asset_and_its_globs() -> None:
    emitter = Principal("orders-feed", Role.EMITTER, ("orders*", "s3://lake/sales/*"))
    with pytest.raises(Forbidden) as refused:
        emitter.check_emit("customers", "customers")
    assert str(refused.value) == (
        "principal 'orders-feed' (emitter) lacks the permission 'emit' on asset 'customers': "
        "it may emit only to the assets whose name or URI matches 'orders*', "
        "'s3://lake/sales/*'"
    )
    with pytest.raises(Forbidden, match=r"on asset 'report' \(URI 's3://lake/report/'\)"):
        emitter.check_emit("report", "s3://lake/report/")


def test_the_principals_the_daemon_gives_are_admins() -> None:
    assert (ANONYMOUS.name, ANONYMOUS.role) == ("anonymous", Role.ADMIN)
    assert token_principal(0) == Principal("api-token-1", Role.ADMIN)
    assert token_principal(2).name == "api-token-3"
    cli = cli_principal()
    assert cli == Principal(f"cli:{pwd.getpwuid(os.geteuid()).pw_name}", Role.ADMIN)


def test_the_cli_is_named_by_its_uid_not_by_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("USER", "mallory")
    monkeypatch.setenv("LOGNAME", "mallory")
    assert cli_principal().name != "cli:mallory"

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)  # a container's arbitrary uid
    assert cli_principal().name == f"cli:uid{os.geteuid()}"


def test_a_principals_longest_name_fits_the_audit_logs_actor() -> None:
    assert NAME_MAX_CHARS == ID_LENGTH


@pytest.mark.parametrize(
    ("name", "taken"),
    [
        ("anonymous", True),
        ("api-token-1", True),
        ("api-token-12", True),
        ("cli:alice", True),
        ("cli:", True),
        ("api-token-x", False),
        ("api-token-", False),
        ("Anonymous", False),
        ("dashboard", False),
        ("orders-feed", False),
    ],
)
def test_the_names_the_daemon_gives_are_reserved(name: str, taken: bool) -> None:
    assert reserved(name) is taken


def test_the_token_digest_is_sha256_as_sha256sum_prints_it() -> None:
    # printf %s s3cret | sha256sum
    assert (
        token_digest("s3cret").hex()
        == "1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0"
    )


def test_a_keyring_finds_each_principal_by_its_token_and_none_by_another() -> None:
    viewer = Principal("dashboard", Role.VIEWER)
    emitter = Principal("orders-feed", Role.EMITTER, ("orders*",))
    keyring = Keyring([(token_digest("v-token"), viewer), (token_digest("e-token"), emitter)])
    assert not keyring.open
    assert keyring.bearer("v-token") == viewer
    assert keyring.bearer("e-token") == emitter
    for other in ("", "v-token ", "V-TOKEN", "e-toke", "wrong"):
        assert keyring.bearer(other) is None
    assert Keyring([]).open
    assert Keyring([]).bearer("anything") is None
