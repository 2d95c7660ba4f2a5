"""Broker lifecycle through the handlers: registration, heartbeats, unfencing,
session-timeout fencing, controlled shutdown, controller restart (real files, fake
clock)."""

from __future__ import annotations

from protocol.errors import ErrorCode
from protocol.messages import BrokerRegistrationRequest
from protocol.messages import DescribeClusterRequest
from protocol.messages import Listener
from protocol.messages import MetadataRequest
from protocol.metadata_records import NO_LEADER
from protocol.metadata_records import RegisterBrokerRecord


async def test_registration_epoch_is_the_record_offset(harness) -> None:
    h = harness
    r1 = await h.register(1)
    assert r1.error_code == 0 and r1.broker_epoch == 0 and r1.cluster_id == "test-cluster-id"
    r2 = await h.register(2)
    assert r2.broker_epoch == 1
    assert isinstance(h.writer.entries_from(1, 1)[0].record, RegisterBrokerRecord)  # type: ignore[index]
    broker = h.image.brokers[1]
    assert broker.fenced and broker.broker_epoch == 0


async def test_same_incarnation_gets_same_epoch(harness) -> None:
    h = harness
    first = await h.register(1)
    offset = h.image.last_offset
    again = await h.register(1, new_incarnation=False)
    assert again.broker_epoch == first.broker_epoch
    assert h.image.last_offset == offset  # no new record


async def test_new_incarnation_new_epoch_and_leaderships_bumped(harness) -> None:
    h = harness
    e1 = await h.start_broker(1)
    await h.start_broker(2)
    await h.create_assigned("t", [[1, 2], [2, 1]])
    before0, before1 = h.partition("t", 0), h.partition("t", 1)
    r = await h.register(1)  # broker 1 restarted
    assert r.broker_epoch > e1
    p0, p1 = h.partition("t", 0), h.partition("t", 1)
    # It led partition 0: leadership moved to 2, leader epoch bumped, 1 left the ISR.
    assert (p0.leader, p0.isr) == (2, [2])
    assert p0.leader_epoch == before0.leader_epoch + 1
    # It followed in partition 1: out of the ISR, leader epoch unchanged.
    assert (p1.leader, p1.isr, p1.leader_epoch) == (2, [2], before1.leader_epoch)
    assert p1.partition_epoch == before1.partition_epoch + 1
    assert h.image.brokers[1].fenced


async def test_new_incarnation_of_sole_replica_goes_leaderless_then_back(harness) -> None:
    h = harness
    await h.start_broker(1)
    await h.create_assigned("t", [[1]])
    r = await h.register(1)
    p = h.partition("t")
    assert (p.leader, p.isr, p.leader_epoch) == (NO_LEADER, [1], 1)
    beat = await h.heartbeat(1, r.broker_epoch)
    assert not beat.is_fenced
    p = h.partition("t")
    assert (p.leader, p.leader_epoch) == (1, 2)  # never reuses epoch 0


async def test_registration_errors(harness) -> None:
    h = harness
    bad = await h.register(1, cluster_id="someone-else")
    assert bad.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID
    assert "someone-else" in (bad.error_message or "")
    ok = await h.register(1, cluster_id="test-cluster-id")
    assert ok.error_code == 0
    no_listeners = await h.handlers.broker_registration(
        BrokerRegistrationRequest(broker_id=2, incarnation_id="x", listeners=[])
    )
    assert no_listeners.error_code == ErrorCode.INVALID_REQUEST
    bad_port = await h.handlers.broker_registration(
        BrokerRegistrationRequest(
            broker_id=2, incarnation_id="x", listeners=[Listener(name="P", host="h", port=0)]
        )
    )
    assert bad_port.error_code == ErrorCode.INVALID_REQUEST


async def test_a_fresh_controller_says_once_that_brokers_of_an_existing_cluster_knock(
    harness, caplog
) -> None:
    """A controller that formatted a new cluster id (its data dir was lost) refuses
    the brokers of the old cluster with ONE clear line, not one per retry."""
    h = harness
    h.handlers.new_cluster = True
    for _ in range(5):  # every broker retries at each heartbeat
        for broker_id in (1, 2, 3):
            refused = await h.register(broker_id, cluster_id="old-cluster")
            assert refused.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID
            assert refused.cluster_id == "test-cluster-id"
    lines = [r.getMessage() for r in caplog.records if "old-cluster" in r.getMessage()]
    assert len(lines) == 1, lines
    (line,) = lines
    assert "brokers of an existing cluster (id old-cluster) are knocking" in line
    assert "formatted a NEW cluster id test-cluster-id" in line
    assert "probably because its data directory was lost" in line
    assert "restore its data directory" in line
    assert not h.image.brokers  # nothing registered


async def test_heartbeat_stale_epoch(harness) -> None:
    h = harness
    r = await h.register(1)
    assert (await h.heartbeat(1, r.broker_epoch + 1)).error_code == ErrorCode.STALE_BROKER_EPOCH
    assert (await h.heartbeat(9, 0)).error_code == ErrorCode.STALE_BROKER_EPOCH
    r2 = await h.register(1)
    old = await h.heartbeat(1, r.broker_epoch)
    assert old.error_code == ErrorCode.STALE_BROKER_EPOCH
    assert (await h.heartbeat(1, r2.broker_epoch)).error_code == 0


async def test_unfenced_only_once_caught_up(harness) -> None:
    h = harness
    r = await h.register(1)
    behind = await h.heartbeat(1, r.broker_epoch, offset=r.broker_epoch - 1)
    assert behind.is_fenced and not behind.is_caught_up
    assert h.image.brokers[1].fenced
    caught = await h.heartbeat(1, r.broker_epoch, offset=r.broker_epoch)
    assert not caught.is_fenced and caught.is_caught_up
    assert not h.image.brokers[1].fenced


async def test_session_timeout_fences_and_moves_leadership(harness) -> None:
    h = harness
    e1 = await h.start_broker(1)
    e2 = await h.start_broker(2)
    e3 = await h.start_broker(3)
    await h.create_assigned("t", [[1, 2, 3], [3, 1, 2]])
    await h.create_assigned("solo", [[3]])
    p0, p1 = h.partition("t", 0), h.partition("t", 1)
    h.run_for(3.0)
    await h.heartbeat(1, e1)
    await h.heartbeat(2, e2)
    assert await h.handlers.fence_expired_brokers() == []
    h.run_for(1.5)  # broker 3: 4.5 s without a heartbeat > 4 s
    assert await h.handlers.fence_expired_brokers() == [3]
    assert h.image.brokers[3].fenced
    n0, n1, n2 = h.partition("t", 0), h.partition("t", 1), h.partition("solo", 0)
    assert (n0.leader, n0.isr, n0.leader_epoch) == (1, [1, 2], p0.leader_epoch)
    assert n0.partition_epoch == p0.partition_epoch + 1
    # 3 led partition 1: first ISR member in replica order takes over.
    assert (n1.leader, n1.isr, n1.leader_epoch) == (1, [1, 2], p1.leader_epoch + 1)
    # Sole replica: leaderless, stays in the ISR.
    assert (n2.leader, n2.isr) == (NO_LEADER, [3])
    # Fenced broker's heartbeat (same epoch) unfences it again and it leads 2 again.
    beat = await h.heartbeat(3, e3)
    assert not beat.is_fenced
    assert h.partition("solo").leader == 3
    assert h.partition("solo").leader_epoch == n2.leader_epoch + 1
    # It does not rejoin the other ISRs by itself: that is the leader's AlterPartition.
    assert h.partition("t", 1).isr == [1, 2]


async def test_all_brokers_expire_in_one_batch(harness) -> None:
    h = harness
    for b in (1, 2):
        await h.start_broker(b)
    await h.create_assigned("t", [[1, 2]])
    p = h.partition("t")
    h.run_for(10)
    assert await h.handlers.fence_expired_brokers() == [1, 2]
    n = h.partition("t")
    # One record for both: leader gone, the last leader kept in the ISR, epochs bumped once.
    assert (n.leader, n.isr) == (NO_LEADER, [1])
    assert (n.leader_epoch, n.partition_epoch) == (p.leader_epoch + 1, p.partition_epoch + 1)


async def test_unclean_election_only_when_topic_allows(harness) -> None:
    h = harness
    e1 = await h.start_broker(1)
    await h.start_broker(2)
    await h.create_assigned("clean", [[1, 2]])
    await h.create_assigned("dirty", [[1, 2]], configs={"unclean.leader.election.enable": "true"})
    # Shrink both ISRs to [1] (leader 1), then broker 1 dies.
    from protocol.messages import AlterPartitionPartition
    from protocol.messages import AlterPartitionRequest
    from protocol.messages import AlterPartitionTopic
    from protocol.messages import BrokerState

    for name in ("clean", "dirty"):
        p = h.partition(name)
        resp = await h.handlers.alter_partition(
            AlterPartitionRequest(
                broker_id=1,
                broker_epoch=e1,
                topics=[
                    AlterPartitionTopic(
                        topic_name=name,
                        partitions=[
                            AlterPartitionPartition(
                                partition_index=0,
                                leader_epoch=p.leader_epoch,
                                new_isr_with_epochs=[BrokerState(broker_id=1, broker_epoch=e1)],
                                partition_epoch=p.partition_epoch,
                            )
                        ],
                    )
                ],
            )
        )
        assert resp.topics[0].partitions[0].error_code == 0
    h.run_for(3)
    await h.heartbeat(2, h.image.brokers[2].broker_epoch)
    h.run_for(2)
    assert await h.handlers.fence_expired_brokers() == [1]
    assert h.partition("clean").leader == NO_LEADER
    dirty = h.partition("dirty")
    assert (dirty.leader, dirty.isr, dirty.leader_recovery_state) == (2, [2], 1)
    assert h.handlers.unclean_elections == 1


async def test_controlled_shutdown(harness) -> None:
    h = harness
    e1 = await h.start_broker(1)
    await h.start_broker(2)
    await h.create_assigned("t", [[1, 2]])
    before = h.partition("t")
    resp = await h.heartbeat(1, e1, want_shut_down=True)
    assert resp.should_shut_down and resp.is_fenced
    after = h.partition("t")
    assert (after.leader, after.isr, after.leader_epoch) == (2, [2], before.leader_epoch + 1)
    assert h.image.brokers[1].fenced
    # Not unfenced again by a later heartbeat of the same incarnation.
    again = await h.heartbeat(1, e1)
    assert again.is_fenced and again.should_shut_down
    # A restart (new registration) is a fresh start.
    r = await h.register(1)
    assert not (await h.heartbeat(1, r.broker_epoch)).is_fenced


async def test_want_fence(harness) -> None:
    h = harness
    e1 = await h.start_broker(1)
    resp = await h.heartbeat(1, e1, want_fence=True)
    assert resp.is_fenced and h.image.brokers[1].fenced


async def test_restart_keeps_state_fresh_sessions_and_never_reuses_epochs(harness) -> None:
    h = harness
    e1 = await h.start_broker(1)
    e2 = await h.start_broker(2)
    await h.create_assigned("t", [[1, 2]])
    h.run_for(3.5)
    epochs_before = {b: h.image.brokers[b].broker_epoch for b in (1, 2)}
    part_before = h.partition("t")
    await h.reopen()  # controller restart
    assert {b: h.image.brokers[b].broker_epoch for b in (1, 2)} == epochs_before
    assert not h.image.brokers[1].fenced and not h.image.brokers[2].fenced
    assert h.partition("t") == part_before
    h.run_for(3.5)  # 7 s since the last heartbeat, 3.5 s since the restart
    assert await h.handlers.fence_expired_brokers() == []
    last = h.image.last_offset
    r = await h.register(1)  # broker 1 restarts too
    assert r.broker_epoch > last > max(e1, e2)
    assert h.partition("t").leader_epoch > part_before.leader_epoch


async def test_describe_cluster_and_metadata(harness) -> None:
    h = harness
    await h.start_broker(1)
    await h.register(2)  # fenced
    await h.create_assigned("t", [[1, 2]])
    desc = await h.handlers.describe_cluster(DescribeClusterRequest())
    assert desc.controller_id == 0 and desc.cluster_id == "test-cluster-id"
    assert [(b.broker_id, b.is_fenced, b.port) for b in desc.brokers] == [
        (1, False, 9101),
        (2, True, 9102),
    ]
    assert desc.metadata_offset == h.image.last_offset
    only_live = await h.handlers.describe_cluster(
        DescribeClusterRequest(include_fenced_brokers=False)
    )
    assert [b.broker_id for b in only_live.brokers] == [1]
    md = await h.handlers.metadata(MetadataRequest())
    assert [b.node_id for b in md.brokers] == [1]
    assert md.controller_id == 0
    (topic,) = md.topics
    (part,) = topic.partitions
    assert (part.leader_id, part.replica_nodes, part.isr_nodes, part.offline_replicas) == (
        1,
        [1, 2],
        [1],
        [2],
    )
    missing = await h.handlers.metadata(MetadataRequest(topics=["nope"]))
    assert missing.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
