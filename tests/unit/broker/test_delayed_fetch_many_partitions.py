"""A parked fetch of many partitions re-checks only the partition a notify names
(issue 20 item 5). A follower's fetch watches every partition it follows from a
leader, thousands with 10,000 partitions; each append, high-watermark move or ISR
answer notifies one of them. Checking the whole fetch on each was quadratic: a
broker taking over 3,333 partitions spent ~57 s in it before it applied the metadata
that made it leader. Switched off (try_complete_key = the full check), the count of
partition checks below is partitions squared."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from broker_harness import partition_state

from broker.delayed import Purgatory
from broker.delayed_requests import DelayedFetch
from broker.delayed_requests import DelayedProduce
from broker.delayed_requests import _FetchWatch
from broker.partition import Partition
from broker.storage.log import Log
from broker.storage.log import LogConfig
from protocol.record_batch import encode_batch

PARTITIONS = 40


class CountingFetch(DelayedFetch):
    checks = 0

    def _check(self, w: _FetchWatch) -> int | None:
        CountingFetch.checks += 1
        return super()._check(w)


@pytest.fixture
def leaders(tmp_path: Path) -> Iterator[list[Partition]]:
    out = []
    for i in range(PARTITIONS):
        log = Log.open(tmp_path / f"t-{i}", LogConfig(), had_clean_shutdown=True)
        p = Partition("t", i, "T", log, node_id=1)
        p.make_leader(replace(partition_state(1, 0), partition=i), now_ms=0)
        out.append(p)
    yield out
    for p in out:
        p.log.close()


async def test_a_notify_checks_only_its_partition(leaders: list[Partition]) -> None:
    purgatory = Purgatory("fetch")
    watches = [_FetchWatch(p, p.log_end_offset) for p in leaders]
    fetch = CountingFetch(watches, min_bytes=1, have_bytes=0, to_leo=True)
    waiter = asyncio.create_task(purgatory.wait(fetch, 10))
    await asyncio.sleep(0)
    CountingFetch.checks = 0
    for p in leaders:  # e.g. an ISR answer for each: nothing readable
        purgatory.notify(p.tp)
    assert not waiter.done()
    assert CountingFetch.checks == PARTITIONS  # not PARTITIONS ** 2

    leaders[PARTITIONS // 2].append_as_leader(encode_batch([(None, b"v")]))
    purgatory.notify(leaders[PARTITIONS // 2].tp)
    assert await asyncio.wait_for(waiter, 1) is True


async def test_a_role_change_of_one_partition_answers_the_fetch(leaders: list[Partition]) -> None:
    purgatory = Purgatory("fetch")
    fetch = DelayedFetch(
        [_FetchWatch(p, 0) for p in leaders], min_bytes=1 << 20, have_bytes=0, to_leo=True
    )
    waiter = asyncio.create_task(purgatory.wait(fetch, 10))
    await asyncio.sleep(0)
    leaders[5].make_follower(replace(partition_state(2, 1), partition=5))
    purgatory.notify(leaders[5].tp)
    assert await asyncio.wait_for(waiter, 1) is True


async def test_bytes_add_up_over_partitions(leaders: list[Partition]) -> None:
    """min_bytes counts what every partition has readable, kept as a running sum."""
    purgatory = Purgatory("fetch")
    batch = encode_batch([(None, b"v" * 100)])
    fetch = DelayedFetch(
        [_FetchWatch(p, 0) for p in leaders], min_bytes=3 * len(batch), have_bytes=0, to_leo=True
    )
    waiter = asyncio.create_task(purgatory.wait(fetch, 10))
    await asyncio.sleep(0)
    for i in (1, 2):
        leaders[i].append_as_leader(batch)
        purgatory.notify(leaders[i].tp)
        purgatory.notify(leaders[i].tp)  # notified twice: counted once
    assert not waiter.done()
    leaders[3].append_as_leader(batch)
    purgatory.notify(leaders[3].tp)
    assert await asyncio.wait_for(waiter, 1) is True


async def test_an_acks_all_produce_decides_per_partition(leaders: list[Partition]) -> None:
    purgatory = Purgatory("produce")
    waits = [(p, 1, p.leader_generation) for p in leaders[:3]]
    produce = DelayedProduce(waits)
    waiter = asyncio.create_task(purgatory.wait(produce, 10))
    await asyncio.sleep(0)
    for p in leaders[:3]:
        p.make_follower(replace(partition_state(2, 1), partition=p.index))
        purgatory.notify(p.tp)
    assert await asyncio.wait_for(waiter, 1) is True
    assert produce.outcomes == [produce.outcomes[0]] * 3 and produce.outcomes[0] is not None
