"""ISR rules (broker/isr.py) and the leader's ISR changes through AlterPartition with
broker epochs (KIP-903), over in-process brokers and a fake controller; acks=all and
min.insync.replicas along the way."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from broker_harness import Harness
from replication_harness import LocalCluster

from broker.alter_partition import AlterPartitionManager
from broker.alter_partition import IsrChange
from broker.delayed_requests import mono_ms
from broker.isr import ReplicaState
from broker.isr import caught_up_for_expand
from broker.isr import ineligibility
from broker.isr import isr_with_epochs
from broker.isr import out_of_sync_replicas
from broker.metadata_image import BrokerInfo
from protocol.errors import ErrorCode
from protocol.messages import AlterPartitionPartitionResult
from protocol.messages import AlterPartitionResponse
from protocol.messages import AlterPartitionTopicResult
from protocol.messages import BrokerState
from runtime.peer_rpc import RpcConnectionError

# ---------------------------------------------------------------------- pure rules


def fetched(state: ReplicaState, offset: int, leader_leo: int, now: int, epoch: int = 0) -> None:
    state.update(
        broker_epoch=7, fetch_offset=offset, leader_epoch=epoch, leader_leo=leader_leo, now_ms=now
    )


def test_caught_up_time_follows_kafka() -> None:
    s = ReplicaState(2)
    fetched(s, 10, 10, now=100)  # at the leader's LEO
    assert s.last_caught_up_time_ms == 100
    fetched(s, 10, 15, now=200)  # the leader grew meanwhile: not caught up now...
    assert s.last_caught_up_time_ms == 100
    fetched(s, 15, 20, now=300)  # ...but it reached the LEO of its previous fetch (15)
    assert s.last_caught_up_time_ms == 200
    assert s.is_caught_up(20, now_ms=600, lag_ms=400)
    assert not s.is_caught_up(20, now_ms=601, lag_ms=400)
    assert s.is_caught_up(15, now_ms=10_000, lag_ms=400)  # LEO equal: idle, in sync


def test_out_of_sync_replicas() -> None:
    states = {2: ReplicaState(2), 3: ReplicaState(3)}
    fetched(states[2], 10, 10, now=1000)
    fetched(states[3], 5, 10, now=1000)  # behind since it started
    assert out_of_sync_replicas((1, 2, 3), 1, states, 10, now_ms=1300, lag_ms=500) == [3]
    assert out_of_sync_replicas((1, 2), 1, states, 12, now_ms=1600, lag_ms=500) == [2]
    assert out_of_sync_replicas((1, 4), 1, states, 12, now_ms=0, lag_ms=500) == [4]  # unknown


def test_caught_up_for_expand() -> None:
    s = ReplicaState(3)
    fetched(s, 8, 10, now=1, epoch=2)
    ok = {"leader_epoch": 2, "high_watermark": 8, "epoch_start_offset": 6}
    assert caught_up_for_expand(s, **ok)
    assert not caught_up_for_expand(s, **{**ok, "high_watermark": 9})  # below the HW
    # The HW has not reached the start of the leader's epoch yet (DESIGN section 7).
    assert not caught_up_for_expand(s, **{**ok, "epoch_start_offset": 9})
    assert not caught_up_for_expand(s, **{**ok, "leader_epoch": 3})  # fetched in epoch 2


def test_ineligibility_by_broker_epoch() -> None:
    def broker(epoch: int, fenced: bool = False) -> BrokerInfo:
        return BrokerInfo(3, epoch, "inc", (), None, fenced)

    assert ineligibility(3, 40, broker(40)) is None
    assert "fenced" in (ineligibility(3, 40, broker(40, fenced=True)) or "")
    assert "not registered" in (ineligibility(3, 40, None) or "")
    assert "broker epoch" in (ineligibility(3, -1, broker(40)) or "")
    assert "metadata says 41" in (ineligibility(3, 40, broker(41)) or "")


def test_isr_with_epochs() -> None:
    states = {2: ReplicaState(2, broker_epoch=52), 3: ReplicaState(3)}
    assert isr_with_epochs((1, 2, 3), 1, 51, states) == [
        BrokerState(broker_id=1, broker_epoch=51),
        BrokerState(broker_id=2, broker_epoch=52),
        BrokerState(broker_id=3, broker_epoch=-1),
    ]


# ---------------------------------------------------------------------- the manager


async def test_alter_partition_manager_batches_retries_and_drops_stale() -> None:
    sent = []
    fail = [1]
    gate = asyncio.Event()

    async def send(request):
        sent.append(request)
        await gate.wait()
        if fail[0]:
            fail[0] -= 1
            raise RpcConnectionError("down")
        return AlterPartitionResponse(
            topics=[
                AlterPartitionTopicResult(
                    topic_name=t.topic_name,
                    partitions=[
                        AlterPartitionPartitionResult(
                            partition_index=d.partition_index,
                            isr=[s.broker_id for s in d.new_isr_with_epochs],
                            leader_epoch=d.leader_epoch,
                            partition_epoch=d.partition_epoch + 1,
                        )
                        for d in t.partitions
                    ],
                )
                for t in request.topics
            ]
        )

    results = {}
    m = AlterPartitionManager(node_id=1, broker_epoch=lambda: 9, send=send, max_backoff_s=0.05)
    m.start()

    def change(index: int, current=lambda: True) -> IsrChange:
        return IsrChange(
            tp=("t", index),
            leader_epoch=0,
            partition_epoch=3,
            new_isr_with_epochs=[BrokerState(broker_id=1, broker_epoch=9)],
            leader_recovery_state=0,
            on_result=lambda e, r, i=index: results.__setitem__(i, (e, r)),
            is_current=current,
        )

    assert m.submit(change(0))
    await asyncio.sleep(0.01)  # in flight now
    assert not m.submit(change(0))  # one at a time per partition
    assert m.submit(change(1))
    assert m.submit(change(2, current=lambda: False))  # superseded before it is sent
    gate.set()
    async with asyncio.timeout(5):
        while len(results) < 2:
            await asyncio.sleep(0.01)
    await m.close()
    # The first request failed; the retry carries it with the one queued meanwhile,
    # and not the superseded one.
    assert sent[0].broker_epoch == 9 and len(sent) == 2
    assert sorted(d.partition_index for d in sent[1].topics[0].partitions) == [0, 1]
    assert results[0][0] == ErrorCode.NONE and results[0][1].partition_epoch == 4
    assert results[1][0] == ErrorCode.NONE and 2 not in results


# ---------------------------------------------------------------------- end to end


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    c = LocalCluster(tmp_path)
    yield c
    await c.close()


async def test_lagging_follower_leaves_and_rejoins_the_isr(cluster: LocalCluster) -> None:
    c = cluster
    await c.create_topic("t", replicas=[1, 2, 3], configs={"min.insync.replicas": "2"})
    c.start()
    assert (await c.produce(1, b"a")).error_code == 0
    c.paused.add(3)  # broker 3 stops fetching (SIGSTOP)
    for i in range(3):
        assert (await c.produce(1, f"b{i}".encode())).error_code == 0  # ISR 2 >= min 2
        await asyncio.sleep(0.05)
    leader = c.partition(1)
    await c.wait_until(lambda: leader.isr == (1, 2), timeout=5, what="shrink")
    shrink = c.controller.requests[-1].topics[0].partitions[0]
    assert [(s.broker_id, s.broker_epoch) for s in shrink.new_isr_with_epochs] == [
        (1, 101),
        (2, 102),
    ]
    await c.wait_until(lambda: c.partition(2).isr == (1, 2), what="metadata")
    assert leader.partition_epoch == c.partitions[("t", 0)].partition_epoch == 1
    c.paused.clear()
    await c.wait_until(lambda: leader.isr == (1, 2, 3), timeout=5, what="expand")
    expand = c.controller.requests[-1].topics[0].partitions[0]
    assert [(s.broker_id, s.broker_epoch) for s in expand.new_isr_with_epochs] == [
        (1, 101),
        (2, 102),
        (3, 103),
    ]
    assert c.partition(3).log_end_offset == leader.log_end_offset == 4


async def test_acks_all_and_min_insync_replicas(cluster: LocalCluster) -> None:
    c = cluster
    await c.create_topic("t", replicas=[1, 2, 3], configs={"min.insync.replicas": "3"})
    c.start()
    assert (await c.produce(1, b"a")).error_code == 0
    # A follower stops: the waiting produce completes once the ISR shrinks (HW moves)
    # with NOT_ENOUGH_REPLICAS_AFTER_APPEND: written, but under min ISR.
    c.paused.add(3)
    r = await c.produce(1, b"b", timeout_ms=10_000)
    assert r.error_code == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    assert c.partition(1).isr == (1, 2)
    # Now refused before the append; acks=1 still works.
    leo = c.partition(1).log_end_offset
    r = await c.produce(1, b"c")
    assert r.error_code == ErrorCode.NOT_ENOUGH_REPLICAS
    assert c.partition(1).log_end_offset == leo
    assert (await c.produce(1, b"c", acks=1)).error_code == 0


async def test_stale_broker_epoch_in_fetch_keeps_a_replica_out(cluster: LocalCluster) -> None:
    """KIP-903: the follower fetches with a broker epoch the leader's metadata does not
    have (a rebooted incarnation the leader has not seen yet): it is not proposed."""
    c = cluster
    await c.create_topic("t", replicas=[1, 2, 3], isr=[1, 2])
    c.brokers[3].rm.fetchers.broker_epoch = lambda: 999
    c.start()
    await c.produce(1, b"a")
    leader = c.partition(1)
    await c.wait_until(lambda: c.partition(3).log_end_offset == 1)
    await asyncio.sleep(0.3)
    assert leader.isr == (1, 2) and leader.replica_states[3].broker_epoch == 999
    assert not c.controller.requests


async def test_ineligible_replica_reverts_and_retries(cluster: LocalCluster) -> None:
    c = cluster
    await c.create_topic("t", replicas=[1, 2, 3], isr=[1, 2])
    c.controller.refuse = ErrorCode.INELIGIBLE_REPLICA
    c.start()
    await c.produce(1, b"a")
    leader = c.partition(1)
    await c.wait_until(lambda: len(c.controller.requests) >= 1)
    await c.wait_until(lambda: leader.pending_isr is None)
    assert leader.isr == (1, 2)
    c.controller.refuse = None
    await c.wait_until(lambda: leader.isr == (1, 2, 3), timeout=5)
    assert len(c.controller.requests) >= 2


async def test_invalid_update_version_waits_for_metadata(cluster: LocalCluster) -> None:
    c = cluster
    await c.create_topic("t", replicas=[1, 2, 3], isr=[1, 2])
    # The controller's state moved on (another change the leader has not seen).
    cur = c.partitions[("t", 0)]
    c.partitions[("t", 0)] = type(cur)(
        topic_id=cur.topic_id,
        partition_id=0,
        replicas=list(cur.replicas),
        isr=[1, 2],
        leader=1,
        leader_epoch=0,
        partition_epoch=5,
    )
    c.start()
    await c.produce(1, b"a")
    leader = c.partition(1)
    await c.wait_until(lambda: leader.pending_isr is not None and leader.pending_isr.refused_ms)
    assert leader.maximal_isr == (1, 2, 3) and leader.isr == (1, 2)
    n = len(c.controller.requests)
    await asyncio.sleep(0.3)
    assert len(c.controller.requests) == n  # not retried while waiting for metadata
    await c.publish(c.partitions[("t", 0)])  # the metadata log catches up
    await c.wait_until(lambda: leader.isr == (1, 2, 3), timeout=5)
    assert leader.partition_epoch == 6


async def test_network_errors_are_retried(cluster: LocalCluster) -> None:
    c = cluster
    await c.create_topic("t", replicas=[1, 2, 3], isr=[1, 2])
    c.controller.fail_network = 2
    c.start()
    await c.produce(1, b"a")
    await c.wait_until(lambda: c.partition(1).isr == (1, 2, 3), timeout=5)
    assert len(c.controller.requests) == 3


async def test_pending_expand_holds_the_hw_until_answered(cluster: LocalCluster) -> None:
    c = cluster
    await c.create_topic("t", replicas=[1, 2, 3], isr=[1, 2])
    c.controller.hold = asyncio.Event()
    c.start()
    await c.produce(1, b"a")
    leader = c.partition(1)
    await c.wait_until(lambda: leader.pending_isr is not None)
    assert leader.maximal_isr == (1, 2, 3)
    c.paused.add(3)  # the joining replica stops fetching
    r = await c.produce(1, b"b", timeout_ms=300)
    assert r.error_code == ErrorCode.REQUEST_TIMED_OUT  # 3 counts, and lacks the batch
    c.controller.hold.set()
    await c.wait_until(lambda: leader.isr == (1, 2, 3))


async def test_acks_all_survives_an_epoch_bump_of_the_same_leader(
    cluster: LocalCluster,
) -> None:
    c = cluster
    await c.create_topic("t", replicas=[1, 2])
    c.start(1)  # broker 2 does not fetch yet
    waiting = asyncio.create_task(c.produce(1, b"x", timeout_ms=5000))
    await asyncio.sleep(0.05)
    await c.elect("t", 1)  # the controller re-elects broker 1 at epoch 1
    assert c.partition(1).leader_epoch == 1 and not waiting.done()
    c.start(2)
    r = await asyncio.wait_for(waiting, 5)
    assert r.error_code == ErrorCode.NONE and r.base_offset == 0


async def test_acks_all_is_not_answered_by_a_later_leadership(cluster: LocalCluster) -> None:
    """Deposed, then leader again: the batch may have been truncated in between, so
    the waiting produce fails (NOT_LEADER_OR_FOLLOWER) even if the HW passes it."""
    c = cluster
    await c.create_topic("t", replicas=[1, 2])
    waiting = asyncio.create_task(c.produce(1, b"x", timeout_ms=5000))
    await asyncio.sleep(0.05)
    await c.elect("t", 2)
    await c.elect("t", 1)
    r = await asyncio.wait_for(waiting, 5)
    assert r.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER


async def test_a_slow_delta_still_gives_followers_a_full_lag_window(tmp_path: Path) -> None:
    """Found at 10,000 partitions: creating a delta's replicas took longer than
    replica.lag.time.max.ms, the new leaders dated their followers' last catch-up to
    the delta's start, and the first ISR check shrank every ISR to the leader alone
    (the failover that followed found partitions with no one to elect). The window
    starts when the broker takes the lead (Kafka's makeLeader)."""
    lag_ms = 200
    h = Harness(tmp_path / "b1", 1, replica_lag_time_max_ms=lag_ms)
    try:
        sync_new_logs = h.log_manager.sync_new_logs

        def slow_sync() -> None:
            time.sleep(lag_ms * 1.5 / 1000)  # many replicas created by this delta
            sync_new_logs()

        h.log_manager.sync_new_logs = slow_sync  # type: ignore[method-assign]
        await h.create_topic("t", 1, leader=1, replicas=[1, 2, 3])
        p = h.rm.partitions[("t", 0)]
        assert p.is_leader
        assert p.out_of_sync_replicas(mono_ms(), lag_ms) == []
    finally:
        await h.close()
