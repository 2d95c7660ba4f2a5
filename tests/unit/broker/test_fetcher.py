"""The follower fetcher against in-process leaders (replication_harness): catch-up,
epoch reconciliation before fetching, diverging epochs, fencing and back-off,
out-of-range, the high watermark on followers, leadership changes, and the unsafe
truncate-to-high-watermark switch showing the KIP-101 loss it guards against."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from replication_harness import LocalCluster
from replication_harness import batch

from broker.fetcher import Phase
from broker.partition import Role
from broker.storage.epoch_cache import EpochEntry
from broker.storage.epoch_cache import LeaderEpochCheckpointFile
from protocol.errors import ErrorCode


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    c = LocalCluster(tmp_path)
    yield c
    await c.close()


def entries(c: LocalCluster, node: int) -> list[tuple[int, int]]:
    return [tuple(e) for e in c.partition(node).log.epoch_cache.entries]


def seed_log(c: LocalCluster, node: int, *runs: tuple[int, int]) -> None:
    """Write `count` one-record batches at `epoch` for each (epoch, count), as a leader
    of that epoch would have (before the partition exists on the broker)."""
    lg = c.brokers[node].log_manager.get_or_create_log(("t", 0))
    for epoch, count in runs:
        for i in range(count):
            lg.append_as_leader(batch(f"e{epoch}-{i}".encode()), epoch)


async def test_followers_catch_up_with_identical_logs(cluster: LocalCluster) -> None:
    c = cluster
    await c.create_topic("t", replicas=[1, 2, 3])
    c.start()
    for i in range(5):
        r = await c.produce(1, f"v{i}".encode())
        assert r.error_code == 0 and r.base_offset == i
    await c.wait_until(lambda: all(c.partition(n).high_watermark == 5 for n in (1, 2, 3)))
    assert c.batches(2) == c.batches(1) == c.batches(3)
    assert entries(c, 2) == entries(c, 1) == [(0, 0)]
    # Followers fetch with their broker epoch and the leader's current epoch.
    leader = c.partition(1)
    assert leader.replica_states[2].broker_epoch == 102
    assert leader.replica_states[3].fetch_epoch == 0


async def test_acks_all_waits_for_every_isr_member(cluster: LocalCluster) -> None:
    c = cluster
    await c.create_topic("t", replicas=[1, 2, 3])
    c.start(1, 2)  # broker 3 never fetches
    r = await c.produce(1, b"x", timeout_ms=300)
    assert r.error_code == ErrorCode.REQUEST_TIMED_OUT
    assert c.partition(2).log_end_offset == 1  # replicated, not committed
    assert c.partition(1).high_watermark == 0
    c.start(3)
    r = await c.produce(1, b"y", timeout_ms=5000)
    assert r.error_code == 0 and r.base_offset == 1
    assert c.partition(1).high_watermark >= 2


async def test_acks_one_answers_after_the_local_append(cluster: LocalCluster) -> None:
    c = cluster
    await c.create_topic("t", replicas=[1, 2])
    r = await c.produce(1, b"x", acks=1)  # nobody fetches: still answered
    assert r.error_code == 0 and c.partition(1).high_watermark == 0


async def test_restarted_follower_keeps_uncommitted_tail_the_leader_has(
    cluster: LocalCluster,
) -> None:
    """KIP-101 scenario 1: the follower's HW lags its LEO; the leader has the whole
    tail, so the follower keeps it (a HW truncation would lose m2)."""
    c = cluster
    seed_log(c, 1, (0, 2))
    seed_log(c, 2, (0, 2))
    await c.create_topic("t", replicas=[1, 2], leader=1, leader_epoch=1)
    assert c.partition(2).high_watermark == 0
    c.start()
    await c.wait_until(lambda: _fetching(c, 2))
    assert c.partition(2).log_end_offset == 2
    await c.wait_until(lambda: c.partition(2).high_watermark == 2)
    assert c.batches(2) == c.batches(1)


def _fetching(c: LocalCluster, node: int) -> bool:
    state = c.brokers[node].rm.fetchers.state_of(("t", 0))
    return state is not None and state.phase is Phase.FETCHING


async def test_divergent_follower_truncates_to_the_largest_common_epoch(
    cluster: LocalCluster,
) -> None:
    """KIP-101 scenario 2 / KIP-279: the follower's epoch 2 tail never reached the
    leader, whose lineage went 0 -> 1 -> 3. Two rounds of OffsetsForLeaderEpoch."""
    c = cluster
    seed_log(c, 1, (0, 5), (1, 2), (3, 5))  # leader: 0-4 e0, 5-6 e1, 7-11 e3
    seed_log(c, 2, (0, 5), (2, 4))  # follower: 0-4 e0, 5-8 e2
    await c.create_topic("t", replicas=[1, 2], isr=[1], leader=1, leader_epoch=4)
    c.start()
    await c.wait_until(lambda: c.partition(2).log_end_offset == 12)
    assert c.batches(2) == c.batches(1)
    assert entries(c, 2) == [(0, 0), (1, 5), (3, 7)]
    assert entries(c, 1) == [(0, 0), (1, 5), (3, 7), (4, 12)]  # epoch 4 wrote nothing yet
    ofle = [r for r in c.requests if r[0] == 2 and r[2] == "OffsetForLeaderEpochRequest"]
    assert len(ofle) == 2
    # Caught up: the leader adds it back to the ISR.
    await c.wait_until(lambda: c.partition(1).isr == (1, 2), what="ISR expansion")


async def test_diverging_epoch_in_fetch_truncates(cluster: LocalCluster) -> None:
    """A follower already FETCHING (reconciliation skipped) learns of its divergence
    from the Fetch answer and truncates the same way."""
    c = cluster
    seed_log(c, 1, (0, 3), (2, 2))  # leader: 0-2 e0, 3-4 e2
    seed_log(c, 2, (0, 3), (1, 4))  # follower: 0-2 e0, 3-6 e1
    await c.create_topic("t", replicas=[1, 2], isr=[1], leader=1, leader_epoch=3)
    state = c.brokers[2].rm.fetchers.state_of(("t", 0))
    assert state is not None
    state.phase = Phase.FETCHING  # as if reconciled already
    c.start()
    await c.wait_until(lambda: c.partition(2).log_end_offset == 5 and c.batches(2) == c.batches(1))
    assert entries(c, 2) == [(0, 0), (2, 3)]
    assert not [r for r in c.requests if r[0] == 2 and r[2] == "OffsetForLeaderEpochRequest"]


async def test_high_watermark_applied_only_after_truncation(cluster: LocalCluster) -> None:
    c = cluster
    seed_log(c, 1, (0, 2))
    seed_log(c, 2, (0, 2), (1, 3))  # 3 records of epoch 1 the leader never got
    await c.create_topic("t", replicas=[1, 2], isr=[1], leader=1, leader_epoch=2)
    c.start()
    await c.wait_until(lambda: _fetching(c, 2))
    await c.wait_until(lambda: c.partition(2).high_watermark == 2)
    assert c.partition(2).log_end_offset == 2
    assert c.partition(2).high_watermark <= c.partition(2).log_end_offset


async def test_fenced_follower_backs_off_until_metadata_arrives(cluster: LocalCluster) -> None:
    """KIP-320: a follower with a stale epoch is refused (FENCED_LEADER_EPOCH), backs
    off, and fetches once its metadata shows the current epoch."""
    c = cluster
    await c.create_topic("t", replicas=[1, 2])
    # Broker 1 learns of a newer epoch that broker 2 has not seen yet.
    newer = msgspec.structs.replace(c.partitions[("t", 0)], leader_epoch=1, partition_epoch=1)
    await c.brokers[1].apply(newer)
    c.start()
    await c.produce(1, b"x", acks=1)
    await c.wait_until(
        lambda: sum(1 for r in c.requests if r[0] == 2) >= 3, what="retries with back-off"
    )
    assert c.partition(2).log_end_offset == 0
    state = c.brokers[2].rm.fetchers.state_of(("t", 0))
    # (An empty log has nothing to reconcile: it is refused in Fetch itself.)
    assert state is not None and state.failures >= 1 and state.leader_epoch == 0
    await c.brokers[2].apply(newer)
    await c.wait_until(lambda: c.partition(2).log_end_offset == 1)


async def test_connection_errors_back_off_and_recover(cluster: LocalCluster) -> None:
    c = cluster
    await c.create_topic("t", replicas=[1, 2])
    c.unreachable.add(1)
    c.start()
    await c.produce(1, b"x", acks=1)
    await c.wait_until(lambda: sum(1 for r in c.requests if r[0] == 2) >= 3)
    c.unreachable.clear()
    await c.wait_until(lambda: c.partition(2).log_end_offset == 1)


async def test_out_of_range_below_the_leader_log_start(cluster: LocalCluster) -> None:
    c = cluster
    seed_log(c, 1, (0, 6))
    lg = c.brokers[1].log_manager.get_log(("t", 0))
    assert lg is not None
    lg.roll()
    seed_log(c, 1, (0, 2))
    lg.delete_records_before(6)  # the leader's log now starts at 6
    seed_log(c, 2, (0, 2))  # the follower holds only 0-1
    await c.create_topic("t", replicas=[1, 2], isr=[1], leader=1, leader_epoch=1)
    c.start()
    await c.wait_until(lambda: c.partition(2).log_end_offset == 8)
    p2 = c.partition(2)
    assert p2.log_start_offset == 6 and c.batches(2) == c.batches(1)


async def test_new_leader_stops_fetching_and_fails_waiting_produces(
    cluster: LocalCluster,
) -> None:
    c = cluster
    await c.create_topic("t", replicas=[1, 2, 3])
    c.start(1, 2)
    r = await c.produce(1, b"a", acks=1)
    await c.wait_until(lambda: c.partition(2).log_end_offset == 1)
    waiting = asyncio.create_task(c.produce(1, b"b", timeout_ms=5000))
    await c.wait_until(lambda: c.partition(2).log_end_offset == 2)
    # Broker 2 takes over at epoch 1 (broker 1 follows it now).
    await c.elect("t", 2, isr=[1, 2, 3])
    r = await waiting
    assert r.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    p2 = c.partition(2)
    assert p2.role is Role.LEADER and c.brokers[2].rm.fetchers.state_of(("t", 0)) is None
    assert entries(c, 2) == [(0, 0), (1, 2)]
    # Its HW waits for every ISR member to fetch in epoch 1 (3 never does).
    assert p2.high_watermark <= 2
    c.start(3)
    await c.wait_until(lambda: p2.high_watermark == 2)
    r = await c.produce(2, b"c")
    assert r.error_code == 0 and r.base_offset == 2
    await c.wait_until(lambda: c.batches(1) == c.batches(2) == c.batches(3))
    assert entries(c, 1) == entries(c, 3) == [(0, 0), (1, 2)]


async def test_unsafe_truncate_to_high_watermark_loses_the_tail(tmp_path: Path) -> None:
    """The switch restores pre-KIP-101 behaviour: the follower cuts its uncommitted
    tail (which the leader has) on becoming follower."""
    c = LocalCluster(tmp_path, ids=(1,))
    try:
        c.add_broker(2, unsafe_truncate_to_high_watermark=True)
        c.broker_epochs[2] = 102
        seed_log(c, 1, (0, 2))
        seed_log(c, 2, (0, 2))
        await c.create_topic("t", replicas=[1, 2], leader=1, leader_epoch=1)
        c.unreachable.add(1)  # the leader dies right after (scenario 1)
        c.start()
        await c.wait_until(lambda: _fetching(c, 2))
        assert c.partition(2).log_end_offset == 0  # m1 and m2 gone from the follower
        assert not [r for r in c.requests if r[2] == "OffsetForLeaderEpochRequest"]
    finally:
        await c.close()


async def test_one_fetch_for_all_partitions_and_fair_turns(tmp_path: Path) -> None:
    """One Fetch carries every partition followed from a leader (the full fetch that
    opens its session; later ones name those whose position moved); batches larger than
    replica_fetch_max_bytes still flow for every partition (the partition that got
    data moves to the back, so each gets its 'at least one batch' turn)."""
    c = LocalCluster(tmp_path, ids=(1, 2), replica_fetch_max_bytes=1024)
    try:
        await c.create_topic("t", replicas=[1, 2], isr=[1])
        await c.create_topic("u", replicas=[1, 2], isr=[1])
        for _ in range(4):
            for topic in ("t", "u"):
                assert (await c.produce(1, b"x" * 3000, acks=1, topic=topic)).error_code == 0
        seen: list[tuple[int, int]] = []

        async def record(follower: int, leader: int, body: object) -> None:
            if type(body).__name__ == "FetchRequest":
                if body.session_epoch == 0:  # type: ignore[attr-defined]
                    assert len(body.topics) == 2  # type: ignore[attr-defined]
                seen.append(
                    (c.partition(2, "t").log_end_offset, c.partition(2, "u").log_end_offset)
                )

        c.on_request = record
        c.start()
        await c.wait_until(
            lambda: c.partition(2, "t").log_end_offset == 4 == c.partition(2, "u").log_end_offset
        )
        # "u" got batches before "t" was done: no partition waits for another.
        assert any(t < 4 and u > 0 for t, u in seen), seen
    finally:
        await c.close()


async def test_new_epoch_checkpoints_are_written_off_the_event_loop(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20 (10,000 partitions): a broker taking over leaderships, and a follower
    fetching the first batches of a new epoch, write the leader-epoch checkpoint on the
    epoch writer's threads, not on the event loop (py-spy found those fsync pairs were
    56-80% of each broker's busy time at 10,000 partitions); every replica's file still
    holds each epoch before its batches. Off (no epoch writer): the appends write them
    on the loop's thread."""
    writers: list[tuple[str, str]] = []
    real_write = LeaderEpochCheckpointFile.write

    def noted_write(self: LeaderEpochCheckpointFile, entries) -> None:  # type: ignore[no-untyped-def]
        writers.append((self.path.parent.parent.name, threading.current_thread().name))
        real_write(self, entries)

    monkeypatch.setattr(LeaderEpochCheckpointFile, "write", noted_write)
    c = cluster
    await c.create_topic("t", replicas=[1, 2, 3])
    c.start()
    assert (await c.produce(1, b"epoch-0")).error_code == 0
    await c.wait_until(lambda: all(c.partition(n).high_watermark == 1 for n in (1, 2, 3)))
    await c.elect("t", 2)
    await c.wait_until(lambda: c.partition(2).is_leader and c.partition(2).leader_epoch == 1)
    assert (await c.produce(2, b"epoch-1")).error_code == 0
    await c.wait_until(lambda: all(c.partition(n).high_watermark == 2 for n in (1, 2, 3)))
    on_loop = [
        (broker, thread) for broker, thread in writers if not thread.startswith("epoch-ckpt")
    ]
    assert not on_loop, f"checkpoints written on the event loop's thread: {on_loop}"
    for n in (1, 2, 3):
        on_disk = LeaderEpochCheckpointFile(c.partition(n).log.epoch_cache.path).read()
        assert on_disk == [EpochEntry(0, 0), EpochEntry(1, 1)], (n, on_disk)
