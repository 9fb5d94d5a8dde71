"""The memory tier: its pure region accounting (sidecar.cache.tier_regions) and
the memfd it keeps (sidecar.cache.memory_tier): bounded by its size whatever
the load, refills in fresh pages, pinned regions never evicted."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from pathlib import Path

import pytest

from sidecar.cache.ident import BlockIdent
from sidecar.cache.memory_tier import MemoryTier
from sidecar.cache.tier_regions import (
    DOOMED,
    FILLING,
    FREE,
    LIVE,
    RELEASING,
    Claimed,
    Key,
    RegionTable,
    TierCounts,
)

MiB = 1024 * 1024
GiB = 1024 * MiB


def key(block: int, chunk: int = 0, name: str = "k", generation: int = 1) -> Key:
    return (BlockIdent("b", name, "e", block), generation, chunk)


def claim(table: RegionTable, which: Key) -> Claimed | None:
    """A region for ``which``, offered twice if the first offer to a full
    table is declined (admission: the second offer gets in)."""
    return table.claim(which) or table.claim(which)


def fill(table: RegionTable, which: Key, length: int = 100) -> int:
    claimed = claim(table, which)
    assert claimed is not None
    assert table.publish(claimed.region, which, length)
    return claimed.region


# The pure accounting.


def test_free_regions_are_claimed_before_anything_is_evicted() -> None:
    table = RegionTable(3, 4096)
    regions = [fill(table, key(i)) for i in range(3)]
    assert sorted(regions) == [0, 1, 2]
    assert table.counts.evictions == 0 and table.held_regions == 3
    claimed = claim(table, key(3))
    assert claimed is not None and claimed.evicted == key(0)  # the oldest, never hit
    assert key(0) not in table and table.state(claimed.region) == FILLING
    assert table.counts.evictions == 1


def test_a_full_table_admits_a_chunk_the_second_time_it_is_offered() -> None:
    """Filling a region costs fresh pages: a replay larger than the tier would
    pay that for every chunk and keep none. The first offer to a full table is
    declined; a second one within about the table's size of refusals, or one
    the policy's ghost remembers, takes a victim's place."""
    table = RegionTable(2, 4096)
    fill(table, key(0))
    fill(table, key(1))
    assert table.claim(key(2)) is None and table.counts.declined == 1
    for block in range(3, 6):  # a scan: each offered once, none admitted
        assert table.claim(key(block)) is None
    assert table.counts.evictions == 0 and key(0) in table and key(1) in table
    # key(2) was declined four refusals ago: more than the table's two regions.
    assert table.claim(key(2)) is None
    claimed = table.claim(key(5))  # offered again right after: admitted
    assert claimed is not None and claimed.evicted == key(0)
    assert table.publish(claimed.region, key(5), 10)
    # key(0) left the small FIFO into the ghost: offered again, it is admitted at once.
    again = table.claim(key(0))
    assert again is not None and again.evicted == key(1)


def test_a_chunk_landing_from_the_origin_is_no_offer_to_a_full_table() -> None:
    """A replay larger than the tier: each chunk lands from the origin, then its
    reader reads it once. Neither is a sign of reuse, so nothing is admitted
    and no region is refilled for a chunk never read again; a second read is."""
    table = RegionTable(2, 4096)
    fill(table, key(0))
    fill(table, key(1))
    for block in range(2, 6):
        assert table.claim(key(block), read=False) is None  # landed
        assert table.claim(key(block)) is None  # its first read
    assert table.counts.evictions == 0 and key(0) in table and key(1) in table
    claimed = table.claim(key(5))  # read again soon after: admitted
    assert claimed is not None and claimed.evicted == key(0)
    # Landing twice is still no offer.
    assert table.publish(claimed.region, key(5), 10)
    assert table.claim(key(9), read=False) is None
    assert table.claim(key(9), read=False) is None


def test_a_chunk_read_again_by_its_first_reader_is_no_second_offer() -> None:
    """A Kafka consumer's next fetch resumes in the chunk its previous one
    ended in: one reader reading a chunk twice is no sign of reuse, and a
    full table admits nothing for it. Another reader's read is (as is one
    whose reader is unknown, and a chunk refused for want of a victim)."""
    table = RegionTable(2, 4096)
    fill(table, key(0))
    fill(table, key(1))
    for _ in range(3):
        assert table.claim(key(2), reader=7) is None
    assert table.counts.evictions == 0 and table.counts.declined == 3
    claimed = table.claim(key(2), reader=8)
    assert claimed is not None and claimed.evicted == key(0)
    assert table.publish(claimed.region, key(2), 10)
    assert table.claim(key(3), reader=7) is None
    assert not table.could_claim(key(3), reader=7)  # asked on the loop: the same answer
    assert table.could_claim(key(3))  # a reader not named: admitted as before
    # Refused (every region pinned by a send): admitted at the next offer,
    # that same reader's too.
    held = [table.find(key(1)), table.find(key(2))]
    assert table.claim(key(4), reader=7) is None  # declined: its first offer
    assert table.claim(key(4), reader=8) is None and table.counts.refused == 1
    for found in held:
        assert found is not None
        table.unpin(found[0])
    assert table.claim(key(4), reader=8) is not None


def test_a_chunk_read_again_by_its_last_reader_is_no_reuse_to_the_policy() -> None:
    """Eviction as admission: a chunk its one reader reads twice (a fetch
    resuming in the chunk the previous one ended in) leaves from the small
    FIFO like a chunk read once; one read by two readers, or twice by readers
    not named, has proved reuse and stays."""
    table = RegionTable(10, 4096)
    for block in range(10):
        fill(table, key(block))

    def read(which: Key, reader: int | None) -> None:
        found = table.find(which, reader)
        assert found is not None
        table.unpin(found[0])

    read(key(0), 1)
    read(key(0), 1)
    read(key(1), 1)
    read(key(1), 2)
    read(key(3), None)
    read(key(3), None)
    evicted = []
    for block in range(20, 23):
        assert table.claim(key(block), reader=5) is None  # its first offer
        claimed = table.claim(key(block), reader=6)  # another reader's: admitted
        assert claimed is not None
        assert table.publish(claimed.region, key(block), 100)
        evicted.append(claimed.evicted)
    assert evicted == [key(0), key(2), key(4)]


def warm_fill(table: RegionTable, which: Key) -> Claimed:
    claimed = table.claim(which, read=False, warm=True)
    assert claimed is not None
    assert table.publish(claimed.region, which, 100, warm=True)
    return claimed


def test_a_warmed_chunk_enters_a_full_table_and_stays_until_it_is_read() -> None:
    """A warm-up lands its chunks ahead of a planned replay: admitted even to a
    full table (a landing for anyone else is no offer), and never a victim
    before the replay has read it, whatever else is read meanwhile."""
    table = RegionTable(4, 4096)
    for block in range(4):
        fill(table, key(block))
    warmed = warm_fill(table, key(10))
    assert warmed.evicted == key(0) and table.protected_regions == 1
    assert table.protected_bytes == 100  # its length, as published
    for block in range(20, 40):  # a busy tier: every other chunk comes and goes
        fill(table, key(block))
    assert table.counts.evictions == 1 + 20
    assert key(10) in table and table.protected_regions == 1
    assert table.find(key(10)) is not None  # the replay reads it: no longer held
    table.unpin(warmed.region)
    assert table.protected_regions == 0 and table.protected_bytes == 0
    # Read, it is a chunk like any other: the next victim of a table where it
    # is the oldest of the small FIFO.
    small = RegionTable(2, 4096)
    region = warm_fill(small, key(10)).region
    fill(small, key(11))
    assert small.find(key(10)) is not None
    small.unpin(region)
    claimed = claim(small, key(12))
    assert claimed is not None and claimed.evicted == key(10)


def test_warmed_chunks_hold_at_most_half_the_table_the_oldest_lapsing_first() -> None:
    table = RegionTable(4, 4096)
    for block in range(4):
        warm_fill(table, key(block))
    assert table.protected_regions == 2  # of four regions: the disk's share
    # The two newest are held; the two oldest are victims like any chunk.
    first = table.claim(key(10), read=False, warm=True)
    second = table.claim(key(11), read=False, warm=True)
    assert first is not None and second is not None
    assert {first.evicted, second.evicted} == {key(0), key(1)}


def test_a_chunk_held_already_is_protected_as_a_warmed_one_until_read() -> None:
    """A warm-up of a block cached before: the chunk the table holds is kept
    as one landing for a warm-up is, within the same share, the newest
    protection last to lapse."""
    table = RegionTable(4, 4096)
    for block in range(4):
        fill(table, key(block))
    assert table.protectable_regions == 2
    assert not table.protect(key(9))  # not held: nothing to keep
    assert table.protect(key(0)) and table.protect(key(1))
    assert table.protectable_regions == 0 and table.protected_bytes == 200
    assert table.protect(key(0))  # again: now the newest, key(1) the oldest
    claimed = table.claim(key(10), read=False, warm=True)
    assert claimed is not None and claimed.evicted not in (key(0), key(1))
    assert table.publish(claimed.region, key(10), 100, warm=True)
    # The share is full: the newest warm-up's chunk took the oldest protection.
    for block in range(20, 30):  # churn
        fill(table, key(block))
    assert key(0) in table and key(10) in table
    for read, protected in ((key(1), 2), (key(0), 1), (key(10), 0)):
        found = table.find(read)  # a read of key(1) ends no protection: it had none
        assert found is not None
        table.unpin(found[0])
        assert table.protected_regions == protected
    assert table.protectable_regions == 2
    assert not RegionTable(1, 4096).protect(key(0))  # one region protects nothing


def test_a_forgotten_warmed_chunk_holds_no_share() -> None:
    table = RegionTable(4, 4096)
    warm_fill(table, key(0, name="gone"))
    warm_fill(table, key(1))
    assert table.protected_regions == 2
    assert len(table.forget_object("b", "gone")) == 1
    assert table.protected_regions == 1


def test_a_pinned_region_is_never_the_victim() -> None:
    table = RegionTable(2, 4096)
    fill(table, key(0))
    fill(table, key(1))
    first = table.find(key(0))
    second = table.find(key(1))
    assert first is not None and second is not None
    assert claim(table, key(2)) is None and table.counts.refused == 1
    table.unpin(second[0])
    claimed = table.claim(key(2))
    assert claimed is not None and claimed.evicted == key(1)
    assert key(0) in table


def test_could_claim_answers_as_claim_would_and_counts_the_offer_once() -> None:
    """Asked ahead of a fill (on the event loop, to spare a chunk the trip to a
    thread): a chunk a full table would decline, or admit with every region
    pinned, is counted and remembered as ``claim`` would; one it may take
    changes nothing, and ``claim`` then takes it."""
    table = RegionTable(2, 4096)
    assert table.could_claim(key(0)) and table.counts == TierCounts()
    fill(table, key(0))
    fill(table, key(1))
    assert not table.could_claim(key(9), read=False)  # landed: no offer
    assert not table.could_claim(key(2)) and table.counts.declined == 2
    first, second = table.find(key(0)), table.find(key(1))
    assert first is not None and second is not None
    assert table.find(key(1)) is not None  # a second send of the same region
    counts = TierCounts(**vars(table.counts))
    # Admitted (its second offer), but every region is pinned: no victim.
    assert not table.could_claim(key(2)) and table.counts.refused == counts.refused + 1
    table.unpin(second[0])
    assert not table.could_claim(key(2))  # still pinned by the other send
    table.unpin(second[0])
    counts = TierCounts(**vars(table.counts))
    assert table.could_claim(key(2)) and table.counts == counts
    claimed = table.claim(key(2))
    assert claimed is not None and claimed.evicted == key(1)
    assert table.publish(claimed.region, key(2), 10)
    # Both regions pinned, then purged: neither live nor free, no victim.
    third = table.find(key(2))
    assert third is not None
    assert table.forget_object("b", "k") == []  # doomed until their sends end
    refused = table.counts.refused
    assert not table.could_claim(key(3)) and not table.could_claim(key(3))
    assert table.counts.refused == refused + 1
    for region in (first[0], third[0]):
        assert table.unpin(region)
        table.released(region)  # the caller punched its pages out
    assert table.could_claim(key(3))


def test_the_declined_chunks_stay_bounded_while_every_region_is_pinned() -> None:
    """Chunks the ghost admits while every region is being sent from find no
    victim and are remembered for their next offer: the record of declined
    chunks must still hold no more than one a region."""
    table = RegionTable(4, 4096)
    for block in range(4):
        fill(table, key(block))
    for block in range(10, 14):  # each admitted at its second offer, evicting 0..3
        claimed = claim(table, key(block))
        assert claimed is not None and claimed.evicted == key(block - 10)
        assert table.publish(claimed.region, key(block), 10)
    for block in range(10, 14):
        assert table.find(key(block)) is not None  # every region pinned
    for block in range(20, 24):  # declined once each: the record is full
        assert table.claim(key(block)) is None
    refused = table.counts.refused
    for block in range(4):  # those in the ghost: admitted, but no region to take
        assert table.claim(key(block)) is None
    assert table.counts.refused > refused
    assert len(table._declined) <= table.regions


def test_a_region_being_filled_is_neither_found_nor_evicted() -> None:
    table = RegionTable(1, 4096)
    claimed = table.claim(key(0))
    assert claimed is not None
    assert table.find(key(0)) is None and table.counts.misses == 1
    assert claim(table, key(1)) is None
    table.abandon(claimed.region)
    assert table.state(claimed.region) == FREE and table.held_regions == 0


def test_the_same_chunk_published_twice_keeps_the_first() -> None:
    table = RegionTable(2, 4096)
    first, second = table.claim(key(0)), table.claim(key(0))
    assert first is not None and second is not None
    assert table.publish(first.region, key(0), 10)
    assert not table.publish(second.region, key(0), 10)
    table.abandon(second.region)
    assert len(table) == 1 and table.counts.inserts == 1


def test_scan_resistance_chunks_read_again_outlive_a_scan() -> None:
    """S3-FIFO, as on the disk: chunks read again survive a one-pass scan,
    even one whose every chunk is read once."""
    table = RegionTable(10, 4096)
    hot = [key(i, name="hot") for i in range(5)]
    for which in hot:
        fill(table, which)
        for _ in range(2):  # the first read is the one it came for; then a reuse
            found = table.find(which)
            assert found is not None
            table.unpin(found[0])
    for i in range(100):
        claimed = claim(table, key(i, name="scan"))
        assert claimed is not None
        assert claimed.evicted is None or claimed.evicted[0].key != "hot"
        assert table.publish(claimed.region, key(i, name="scan"), 100)
        found = table.find(key(i, name="scan"))
        assert found is not None
        table.unpin(found[0])
    assert all(which in table for which in hot)


def test_a_chunk_forgotten_while_pinned_is_freed_when_its_send_ends() -> None:
    table = RegionTable(2, 4096)
    region = fill(table, key(0))
    other = fill(table, key(0, name="other"))
    found = table.find(key(0))
    assert found is not None
    assert table.forget(lambda held: held[0].key == "k") == []
    assert table.state(region) == DOOMED and key(0) not in table
    assert claim(table, key(1)) is not None  # the other one: the doomed region is not
    assert table.state(other) == FILLING
    assert table.unpin(region)
    assert table.state(region) == RELEASING
    table.released(region)
    assert table.state(region) == FREE


def test_a_purge_finds_the_objects_chunks_of_every_version() -> None:
    table = RegionTable(8, 4096)
    mine = [fill(table, (BlockIdent("b", "k", etag, block), 1, 0))
            for etag, block in (("e1", 0), ("e1", 1), ("e2", 0))]
    theirs = [fill(table, key(0, name="other")), fill(table, (BlockIdent("c", "k", "e1", 0), 1, 0))]
    assert sorted(table.forget_object("b", "k")) == sorted(mine)
    assert table.forget_object("b", "k") == []
    assert len(table) == 2 and all(table.state(region) == LIVE for region in theirs)


def test_a_forgotten_region_is_claimable_only_once_its_pages_are_out() -> None:
    """Between forget (or the last unpin of a doomed region) and the caller's
    punch, no writer may have the region: its fill would be punched away."""
    table = RegionTable(1, 4096)
    region = fill(table, key(0))
    assert table.forget(lambda held: held[0].block == 0) == [region]
    assert table.state(region) == RELEASING
    assert table.claim(key(1)) is None and table.claim(key(1)) is None
    assert table.held_regions == 1
    table.released(region)
    claimed = table.claim(key(1))
    assert claimed is not None and claimed.region == region and claimed.evicted is None
    with pytest.raises(ValueError, match="state"):
        table.released(region)


def test_bad_calls_are_refused() -> None:
    table = RegionTable(1, 4096)
    with pytest.raises(ValueError, match="not pinned"):
        table.unpin(0)
    claimed = table.claim(key(0))
    assert claimed is not None
    with pytest.raises(ValueError, match="4097 bytes"):
        table.publish(claimed.region, key(0), 4097)
    assert table.publish(claimed.region, key(0), 4096)
    assert table.state(claimed.region) == LIVE
    with pytest.raises(ValueError, match="state"):
        table.abandon(claimed.region)
    with pytest.raises(ValueError, match="at least one region"):
        RegionTable(0, 4096)


def test_accounting_holds_under_random_operations() -> None:
    """Whatever the order of claims, sends and purges: no region is in two
    states, live bytes never exceed the regions, pinned regions stay."""
    rng = random.Random(31)
    table = RegionTable(8, 4096)
    pinned: list[tuple[int, Key]] = []
    for _ in range(3000):
        action = rng.random()
        if action < 0.5:
            which = key(rng.randrange(40))
            claimed = table.claim(which)
            if claimed is not None:
                assert all(claimed.region != region for region, _ in pinned)
                if not table.publish(claimed.region, which, rng.randrange(1, 4097)):
                    table.abandon(claimed.region)
        elif action < 0.8:
            which = key(rng.randrange(40))
            found = table.find(which)
            if found is not None:
                pinned.append((found[0], which))
        elif action < 0.95 and pinned:
            region, _ = pinned.pop(rng.randrange(len(pinned)))
            if table.unpin(region):
                table.released(region)  # the caller punched its pages out
        elif action < 0.975:
            gone = rng.randrange(40)
            for region in table.forget(lambda held: held[0].block == gone):  # noqa: B023
                table.released(region)
        else:
            for region in table.forget_object("b", "k"):
                table.released(region)
            assert len(table) == 0
        assert table.live_bytes <= table.regions * table.region_size
        others = sum(1 for r in range(8) if table.state(r) in (FREE, FILLING, DOOMED))
        assert len(table) + others == 8
        for region, _ in pinned:
            assert table.state(region) in (LIVE, DOOMED)
        assert table._pinned_live == sum(
            1 for r in range(8) if table.state(r) == LIVE and table.pins(r))


# The memfd.


def test_the_tier_keeps_and_gives_back_verified_bytes() -> None:
    tier = MemoryTier(4 * MiB, MiB)
    try:
        data = os.urandom(MiB - 100)
        assert tier.put(key(0), data)
        assert not tier.put(key(0), data)  # held already
        piece = tier.slice(key(0), 10, 5000)
        assert piece is not None and len(piece) == 4990
        assert bytes(piece.view()) == data[10:5000]
        assert os.pread(piece.file, piece.count, piece.offset) == data[10:5000]
        piece.release()
        piece.release()  # idempotent
        assert tier.slice(key(1), 0, 1) is None
        assert tier.counts.hits == 1 and tier.counts.misses == 1
        with pytest.raises(ValueError, match="outside"):
            tier.slice(key(0), 0, MiB)
        releasing = tier.forget_object("b", "k")
        assert key(0) not in tier and tier.resident_bytes() == MiB  # not punched yet
        tier.release(releasing)
        assert tier.resident_bytes() == 0
    finally:
        tier.close()


def test_a_full_tier_takes_a_warm_up_landing_and_sends_it_unchanged() -> None:
    tier = MemoryTier(2 * MiB, MiB)
    try:
        assert tier.put(key(0), b"a" * 100) and tier.put(key(1), b"b" * 100)
        assert not tier.put(key(2), b"c" * 100, read=False)  # a read-ahead landing
        assert tier.put(key(3), b"d" * 100, read=False, warm=True)
        held = tier.slice(key(3), 0, 100)
        assert held is not None and bytes(held.view()) == b"d" * 100
        held.release()
    finally:
        tier.close()


def test_a_tier_the_memory_refuses_declines_the_chunk_and_raises_nothing() -> None:
    """A failed fill or punch is the tier's own business: put says no, the
    disk and the fetch never hear of it. A region whose old pages could not
    be punched out is kept out of use rather than filled in place."""
    tier = MemoryTier(MiB, MiB)
    writable = tier.fd
    # The same file, read-only: pwrite and fallocate fail (EBADF) in the kernel.
    tier.fd = os.open(f"/proc/self/fd/{writable}", os.O_RDONLY)
    try:
        assert not tier.put(key(0), b"x" * 100)  # the fill failed: region given back
        assert tier.held_bytes() == 0
        tier.fd, read_only = writable, tier.fd
        assert tier.put(key(0), b"x" * 100)
        tier.fd = read_only
        assert not tier.put(key(1), b"y" * 100)  # a full tier declines a first offer
        assert not tier.put(key(1), b"y" * 100)  # admitted; its victim's punch failed
        assert key(0) not in tier and key(1) not in tier
        tier.fd = writable
        assert not tier.put(key(2), b"z" * 100) and not tier.put(key(2), b"z" * 100)
        assert tier.held_bytes() == MiB  # withheld for good
    finally:
        tier.fd = writable
        os.close(read_only)
        tier.close()


def test_refused_fills_are_logged_once_until_a_chunk_is_kept_again(
        caplog: pytest.LogCaptureFixture) -> None:
    """Memory short refuses every chunk offered (thousands a second in a
    catch-up): one warning for the run of refusals, not one a chunk."""
    tier = MemoryTier(4 * MiB, MiB)
    writable = tier.fd
    # The same file, read-only: pwrite fails (EBADF) in the kernel.
    read_only = os.open(f"/proc/self/fd/{writable}", os.O_RDONLY)
    try:
        with caplog.at_level(logging.WARNING, logger="sidecar.cache.memory_tier"):
            tier.fd = read_only
            assert not any(tier.put(key(n), b"x" * 100) for n in range(3))
            tier.fd = writable
            assert tier.put(key(3), b"x" * 100)
            tier.fd = read_only
            assert not any(tier.put(key(n), b"x" * 100) for n in range(4, 6))
        refusals = [r.getMessage() for r in caplog.records if "not kept" in r.getMessage()]
        assert len(refusals) == 2, refusals
        assert "Bad file descriptor" in refusals[0]
    finally:
        tier.fd = writable
        os.close(read_only)
        tier.close()


def test_the_file_is_sealed_against_resizing() -> None:
    tier = MemoryTier(2 * MiB, MiB)
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(tier.fd, 64 * MiB)
        with pytest.raises(PermissionError):
            os.ftruncate(tier.fd, 0)
        with pytest.raises(PermissionError):
            os.pwrite(tier.fd, b"x", 2 * MiB)
        assert os.fstat(tier.fd).st_size == 2 * MiB
    finally:
        tier.close()


def test_memory_used_never_exceeds_the_tier_size_under_concurrent_load() -> None:
    """Four threads put, one sends and purges: the kernel's count of the
    file's pages never passes the tier's size, nor what the table holds."""
    tier = MemoryTier(6 * MiB, MiB)
    stop = threading.Event()
    errors: list[BaseException] = []
    worst = [0]

    def putter(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                tier.put(key(rng.randrange(12)), os.urandom(rng.randrange(1, MiB + 1)))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=putter, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    try:
        rng = random.Random(7)
        deadline = time.monotonic() + 20
        # Until the putters have evicted and refilled regions many times over.
        while tier.counts.evictions < 60:
            assert time.monotonic() < deadline, "the putters evicted too little"
            piece = tier.slice(key(rng.randrange(12)), 0, 1)
            resident = tier.resident_bytes()
            worst[0] = max(worst[0], resident)
            assert resident <= tier.size_bytes
            if piece is not None:
                piece.release()
            if rng.random() < 0.05:
                gone = rng.randrange(12)
                tier.forget(lambda held: held[0].block == gone)  # noqa: B023 (called at once)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors
    assert worst[0] > 0
    # At rest, the pages held are those of the live chunks, page-rounded.
    assert tier.resident_bytes() <= tier.held_bytes() <= tier.size_bytes
    tier.close()


def test_chunks_put_while_others_are_forgotten_keep_their_bytes() -> None:
    """One thread forgets objects (their regions punched out) while another
    puts chunks: every chunk published reads back as put, never punched to
    zeros after the fact by a forget that freed its region first."""
    region = 64 * 1024
    tier = MemoryTier(16 * region, region)
    stop = threading.Event()
    errors: list[BaseException] = []

    def forgetter() -> None:
        try:
            round_ = 0
            while not stop.is_set():
                round_ += 1
                for chunk in range(8):
                    tier.put(key(0, chunk, name=f"gone-{round_}"), b"g" * region)
                tier.forget(lambda held: held[0].key == f"gone-{round_}")  # noqa: B023
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=forgetter)
    thread.start()
    checked = corrupt = 0
    deadline = time.monotonic() + 30
    try:
        for number in range(20_000):
            if checked >= 2000:
                break
            assert time.monotonic() < deadline, f"only {checked} chunks checked"
            which = key(number, name="kept")
            body = bytes([number % 251 + 1]) * region
            if not tier.put(which, body):
                continue
            piece = tier.slice(which, 0, region)
            assert piece is not None
            try:
                checked += 1
                corrupt += os.pread(piece.file, region, piece.offset) != body
            finally:
                piece.release()
            tier.forget(lambda held: held == which)  # noqa: B023 (called at once)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert checked >= 2000
    assert corrupt == 0, f"{corrupt} of {checked} chunks changed after they were published"
    tier.close()


def test_an_evicted_region_is_refilled_in_fresh_pages() -> None:
    """A page taken by reference before the eviction keeps the old bytes:
    the refill does not write over it (what keeps queued sends intact)."""
    tier = MemoryTier(MiB, MiB)
    try:
        old = b"o" * MiB
        assert tier.put(key(0), old)
        piece = tier.slice(key(0), 0, MiB)
        assert piece is not None
        # A pipe stands in for a socket: vmsplice-free, splice takes the page
        # cache pages of the memfd by reference, as sendfile into a socket does.
        read_end, write_end = os.pipe()
        try:
            os.set_blocking(write_end, False)
            moved = os.splice(tier.fd, write_end, 65536, offset_src=piece.offset)
            piece.release()
            assert not tier.put(key(1), b"n" * MiB)  # a full tier declines a first offer
            assert tier.put(key(1), b"n" * MiB)  # evicts key(0), same region
            assert key(0) not in tier
            assert os.read(read_end, moved) == old[:moved]
        finally:
            os.close(read_end)
            os.close(write_end)
    finally:
        tier.close()


def test_a_reserve_takes_the_pages_and_leaves_the_chunks_held_as_they_are() -> None:
    tier = MemoryTier(4 * MiB, MiB)
    try:
        held = os.urandom(MiB)
        assert tier.put(key(0), held)
        sending = tier.slice(key(0), 0, MiB)  # a send under way from its region
        assert sending is not None and tier.resident_bytes() == MiB
        assert tier.reserve(0, 4 * MiB) == 4 * MiB
        assert tier.resident_bytes() == 4 * MiB
        assert bytes(sending.view()) == held
        sending.release()
        fresh = os.urandom(MiB)
        assert tier.put(key(1), fresh)
        found = tier.slice(key(1), 0, MiB)
        assert found is not None and os.pread(found.file, MiB, found.offset) == fresh
        found.release()
        assert tier.resident_bytes() == 4 * MiB  # the put took no page more
    finally:
        tier.close()


def test_a_reserve_is_clipped_to_the_file_and_does_nothing_once_closed() -> None:
    tier = MemoryTier(4 * MiB, MiB)
    assert tier.reserve(3 * MiB, 64 * MiB) == MiB
    assert tier.reserve(4 * MiB, MiB) == 0 and tier.reserve(-MiB, MiB) == 0
    assert tier.resident_bytes() == MiB
    tier.close()
    assert tier.reserve(0, MiB) == 0


def test_a_tier_of_size_zero_is_none_and_too_small_a_one_is_refused() -> None:
    assert MemoryTier.create(0, MiB) is None
    with pytest.raises(ValueError, match="one chunk"):
        MemoryTier(MiB - 1, MiB)


def test_a_tier_larger_than_the_memory_here_is_refused_before_its_table_is_built() -> None:
    """Its file and mapping would be made (address space only), and a table of
    millions of regions takes seconds: a mistyped size fails at once instead."""
    from sidecar.cache.memory_tier import memory_bytes

    region = 4 * MiB
    too_big = (memory_bytes() // region + 1) * region
    with pytest.raises(OSError, match="bytes of memory this machine or container has"):
        MemoryTier(too_big, region)


def test_the_cgroup_limits_are_read_up_the_tree_for_v2_and_v1(tmp_path: Path) -> None:
    """A unit's own memory.max may be "max" while its slice has a limit: every
    ancestor counts. v1's memory controller keeps it in memory.limit_in_bytes."""
    from sidecar.cache.memory_tier import cgroup_limits

    unit = tmp_path / "system.slice" / "sidecar.service"
    unit.mkdir(parents=True)
    (unit / "memory.max").write_text("max\n")
    (tmp_path / "system.slice" / "memory.max").write_text(f"{8 * GiB}\n")
    assert cgroup_limits(["0::/system.slice/sidecar.service"], tmp_path) == [8 * GiB]
    pod = tmp_path / "memory" / "kubepods" / "pod1"
    pod.mkdir(parents=True)
    (pod / "memory.limit_in_bytes").write_text(f"{2 * GiB}\n")
    assert cgroup_limits(["4:memory:/kubepods/pod1", "3:cpu,cpuacct:/kubepods/pod1",
                          "not a cgroup line"], tmp_path) == [2 * GiB]
    assert cgroup_limits(["0::/"], tmp_path / "none") == []
