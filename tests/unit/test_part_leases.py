"""The fair share of a shareable trigger's parts (Kinesis shards): which parts a daemon takes
and gives up in a round (:func:`triggerer.service.daemon.part_leases.plan`), and that rounds of
several daemons, in any order, end with every part held and each daemon holding its share."""

from __future__ import annotations

import random

import pytest

from triggerer.service.daemon.part_leases import lease_prefix, plan, tenure

SHARDS = [f"shardId-{n:012d}" for n in range(4)]


def test_alone_a_daemon_takes_every_part() -> None:
    done = plan("a", SHARDS, {}, {"a"})
    assert done.take == set(SHARDS)
    assert not done.give_up


def test_a_daemon_takes_free_parts_only_up_to_its_share() -> None:
    done = plan("b", SHARDS, {}, {"a", "b"})
    assert done.take == set(SHARDS[:2])


def test_a_daemon_over_its_share_gives_up_the_rest_when_another_joins() -> None:
    holders = dict.fromkeys(SHARDS, "a")
    done = plan("a", SHARDS, holders, {"a", "b"})
    assert done.give_up == set(SHARDS[2:])
    assert not done.take
    # ... and the newcomer takes them in its next round.
    holders = dict.fromkeys(SHARDS[:2], "a")
    assert plan("b", SHARDS, holders, {"a", "b"}).take == set(SHARDS[2:])


def test_parts_of_a_dead_daemon_are_free_once_its_rows_expire() -> None:
    """A holder is live by its row; an expired row is not in ``holders``: its part is free."""
    holders = dict.fromkeys(SHARDS[:2], "a")  # b's two rows expired
    done = plan("a", SHARDS, holders, {"a"})
    assert done.take == set(SHARDS[2:])


def test_a_holder_without_a_member_row_still_counts() -> None:
    """A part row renewed while its member row is not yet read still makes a live daemon."""
    holders = dict.fromkeys(SHARDS[:2], "b")
    assert plan("a", SHARDS, holders, {"a"}).take == set(SHARDS[2:])


def test_no_part_is_taken_past_the_floor_while_another_member_is_below_it() -> None:
    # 4 parts, 3 daemons: share 2, floor 1; c holds none.
    holders = {SHARDS[0]: "a", SHARDS[1]: "a", SHARDS[2]: "b"}
    assert plan("b", SHARDS, holders, {"a", "b", "c"}).take == set()
    assert plan("c", SHARDS, holders, {"a", "b", "c"}).take == {SHARDS[3]}


def test_with_no_part_free_a_daemon_over_the_floor_gives_up_for_a_needy_member() -> None:
    holders = {SHARDS[0]: "a", SHARDS[1]: "a", SHARDS[2]: "b", SHARDS[3]: "b"}
    done = plan("a", SHARDS, holders, {"a", "b", "c"})
    assert done.give_up == {SHARDS[1]}


def test_no_parts_no_work() -> None:
    assert plan("a", [], {}, {"a", "b"}) == plan("a", [], {}, {"a"})
    assert not plan("a", [], {}, {"a"}).take


def _round(me: str, parts: list[str], holders: dict[str, str], members: set[str]) -> None:
    done = plan(me, parts, holders, members)
    for part in done.give_up:
        del holders[part]
    for part in done.take:
        holders[part] = me


@pytest.mark.parametrize("seed", range(40))
def test_rounds_in_any_order_end_with_every_part_held_and_shares_fair(seed: int) -> None:
    shuffled = random.Random(seed)  # noqa: S311 - a reproducible order, not a secret
    parts = [f"p{n}" for n in range(shuffled.randint(1, 12))]
    members = {f"d{n}" for n in range(shuffled.randint(1, 5))}
    # Any start: parts held by members, by daemons gone (already expired: not there), or free.
    holders = {
        part: owner for part in parts if (owner := shuffled.choice([*members, None])) is not None
    }
    for _ in range(12):
        order = sorted(members)
        shuffled.shuffle(order)
        for me in order:
            _round(me, parts, holders, members)
    assert set(holders) == set(parts)
    counts = [sum(owner == member for owner in holders.values()) for member in members]
    assert max(counts) - min(counts) <= 1


def test_lease_names_stay_within_the_column_and_tenures_are_microseconds() -> None:
    from datetime import UTC, datetime

    assert lease_prefix("kinesis/s/app/") == "kinesis/s/app/"
    long = "kinesis/" + "s" * 128 + "/" + "a" * 200 + "/"
    assert lease_prefix(long).startswith("parts/")
    assert len(lease_prefix(long)) < 60
    at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert tenure(at) == str(int(at.timestamp()) * 1_000_000 + 678901)
