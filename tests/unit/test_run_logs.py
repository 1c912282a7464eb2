"""What the store keeps of a run's log (the shipper's plan within ``[runs] log_max_bytes``) and
how a reader puts the chunks back together, gaps included: pure logic, replayed here byte by
byte against a file that grows as a run's log does."""

from __future__ import annotations

import itertools

import pytest

from triggerer.service.runs.log_shipping import CHUNK_MAX_BYTES, Kept, Shipment
from triggerer.service.runs.stored_logs import assemble, cut_line


class Store:
    """The chunks of one try as the store would hold them, written by applying shipments."""

    def __init__(self) -> None:
        self.chunks: dict[int, tuple[int, bytes]] = {}

    def apply(self, shipment: Shipment, log: bytes, shipped_to: int) -> None:
        """Write ``shipment`` of what ``log`` gained after byte ``shipped_to``."""
        for chunk in shipment.chunks:
            start = shipped_to + chunk.start
            self.chunks[chunk.seq] = (chunk.position, log[start : start + chunk.length])
        if shipment.drop is not None:
            first, last = shipment.drop
            for seq in range(first, last + 1):
                del self.chunks[seq]

    def rows(self) -> list[tuple[int, bytes]]:
        return [self.chunks[seq] for seq in sorted(self.chunks)]

    def size(self) -> int:
        return sum(len(data) for _, data in self.chunks.values())


def ship_growing(log: bytes, steps: list[int], max_bytes: int) -> tuple[Store, Kept]:
    """Ship ``log`` as a file that gains ``steps`` bytes at each tick, then the rest at the
    final flush."""
    store, kept, shipped = Store(), Kept.within(max_bytes), 0
    for step in steps:
        added = min(step, len(log) - shipped)
        shipment = kept.ship(added)
        store.apply(shipment, log, shipped)
        kept, shipped = shipment.kept, shipped + added
    shipment = kept.ship(len(log) - shipped, final=True)
    store.apply(shipment, log, shipped)
    return store, shipment.kept


def lines(count: int) -> bytes:
    return b"".join(f"line {n:05d} of the run's log\n".encode() for n in range(count))


def test_a_log_within_the_cap_is_kept_whole_in_one_chunk_a_tick() -> None:
    log = lines(100)

    store, kept = ship_growing(log, [700, 0, 900], max_bytes=1 << 20)

    assert assemble(store.rows()) == log.decode()
    assert len(store.chunks) == 3  # one a tick that gained anything, and the final one
    assert kept.written == len(log)


def test_a_try_that_printed_nothing_has_one_empty_chunk() -> None:
    shipment = Kept.within(4096).ship(0, final=True)

    assert [(c.position, c.length) for c in shipment.chunks] == [(0, 0)]
    assert shipment.kept.ship(0, final=True).chunks == ()  # once
    assert Kept.within(4096).ship(0).chunks == ()  # not while it runs


@pytest.mark.parametrize(
    "steps",
    [
        [10_000_000],  # all at once: the middle is skipped, never read
        [3_000] * 400,  # a steady trickle: the tail's oldest chunks deleted as new ones come
        [50, 70_000, 1, 200_000, 333, 9_999],
        [14_700] * 10 + [13],  # bursts past the tail, then a last short line
    ],
)
def test_a_log_past_the_cap_keeps_its_start_and_its_end_and_says_what_was_cut(
    steps: list[int],
) -> None:
    log = lines(40_000)  # 1.2 MB
    max_bytes = 64 * 1024

    store, kept = ship_growing(log, steps, max_bytes)

    text = assemble(store.rows())
    assert store.size() <= max_bytes
    kept_head = log[: kept.head].decode()
    assert kept.head == max_bytes // 4
    head, marker, rest = text.partition("[triggerer: ")
    assert head == kept_head + ("" if kept_head.endswith("\n") else "\n")
    marker_line, _, kept_tail = (marker + rest).partition("\n")
    assert kept_tail.startswith("line ")  # from a whole line on
    assert log.decode().endswith(kept_tail)
    # The tail is its three quarters of the cap, less at most a chunk and a line.
    tail_max = max_bytes * 3 // 4
    assert tail_max - kept.chunk_max - 40 <= len(kept_tail) <= tail_max
    assert marker_line + "\n" == cut_line(len(log) - kept.head - len(kept_tail))
    assert kept.written == len(log)


def test_a_cap_line_names_the_size_cut() -> None:
    assert cut_line(12).startswith("[triggerer: 12 bytes of this log cut here")
    assert cut_line(5 * 1024 * 1024 + 1).startswith("[triggerer: 5.0 MiB of this log cut")


def test_assembling_decodes_what_a_chunk_boundary_split() -> None:
    text = "café ✓ naïve\n".encode()

    rows = [(0, text[:4]), (4, text[4:7]), (7, text[7:])]  # é and ✓ split between chunks

    assert assemble(rows) == "café ✓ naïve\n"


def test_a_try_started_again_goes_on_after_what_its_first_attempt_shipped() -> None:
    first = lines(3000)  # 90 KB, past the cap
    store, kept = ship_growing(first, [20_000] * 5, max_bytes=32 * 1024)
    rows = [(seq, position, len(data)) for seq, (position, data) in sorted(store.chunks.items())]

    again = Kept.within(32 * 1024, rows)

    assert (again.written, again.head, again.next_seq) == (
        kept.written,
        kept.head,
        kept.next_seq,
    )
    assert sum(length for _, length in again.tail) == sum(length for _, length in kept.tail)
    second = b"attempt two\n" * 5000
    shipment = again.ship(len(second), final=True)
    store.apply(shipment, second, 0)
    text = assemble(store.rows())
    assert text.startswith(first.decode()[:100])
    assert text.endswith("attempt two\n")
    assert store.size() <= 32 * 1024


def test_chunks_are_at_most_the_chunk_size_and_positions_are_consecutive_in_the_head() -> None:
    shipment = Kept.within(64 << 20).ship(3 * CHUNK_MAX_BYTES + 5)

    assert [c.length for c in shipment.chunks] == [CHUNK_MAX_BYTES] * 3 + [5]
    assert Kept.within(16384).chunk_max == 768  # a sixteenth of a small cap's tail
    assert all(
        later.position == earlier.position + earlier.length
        for earlier, later in itertools.pairwise(shipment.chunks)
    )
