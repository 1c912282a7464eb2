"""The messages of a source this process had delivered (:mod:`watchers.redeliveries`): pure
bookkeeping, no broker."""

from __future__ import annotations

from watchers.redeliveries import DeliveredHere, delivered_here


def test_a_delivery_says_whether_the_process_had_one_before() -> None:
    here = DeliveredHere(limit=10)
    assert here.note(["a", "b"]) == [False, False]
    assert here.note(["b", "c", "a"]) == [True, False, True]
    assert here.note(["c", "c"]) == [True, True]


def test_only_the_latest_deliveries_are_kept_each_delivery_making_one_the_latest() -> None:
    here = DeliveredHere(limit=3)
    here.note(["a", "b", "c"])
    here.note(["a"])  # delivered again: now the latest, "b" the oldest
    here.note(["d"])
    assert here.note(["b"]) == [False]  # gone to make room; noted again now
    assert here.note(["a", "d", "b"]) == [True, True, True]
    assert here.note(["c"]) == [False]


async def test_the_triggers_of_one_source_in_one_loop_share_what_was_delivered() -> None:
    first = delivered_here("nats one-source-of-this-test", limit=5)
    first.note([7])
    again = delivered_here("nats one-source-of-this-test", limit=8)
    assert again is first
    assert again.limit == 8  # the latest trigger's options hold
    assert again.note([7]) == [True]
    assert delivered_here("nats another-source-of-this-test", limit=5).note([7]) == [False]
