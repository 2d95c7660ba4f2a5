"""A controller stall fences nobody (controller/liveness.py), and a broker that lost its
data is never counted in sync (controller/handlers.py, election.py); issue 13.

Sessions run on an injected clock: `h.run_for(s)` is the controller running (its
liveness loop notes the time every check interval), a bare `clock.advance(s)` is the
controller not running for `s` (SIGSTOP, a pause, a blocked loop).
"""

from __future__ import annotations

import logging

from controller.liveness import BrokerSessions
from protocol.errors import ErrorCode
from protocol.messages import ElectLeadersPartition
from protocol.messages import ElectLeadersRequest
from protocol.metadata_records import LEADER_RECOVERING
from protocol.metadata_records import NO_LEADER


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_after_a_stall_every_live_session_is_renewed_and_nobody_expires() -> None:
    clock = Clock()
    sessions = BrokerSessions(3.0, clock=clock)
    sessions.touch(1, 10)
    sessions.touch(2, 20)
    clock.now += 0.5  # a liveness check on time
    assert sessions.expired([(1, 10), (2, 20)]) == []
    clock.now += 0.2
    sessions.touch(2, 20)  # read between that check and the stall
    clock.now += 10.0  # the controller stalled: both heartbeated during it, unread
    assert sessions.expired([(1, 10), (2, 20)]) == []
    assert sessions.stalls == 1
    # The renewed session proves nothing: no new replicas on it until heard from.
    assert not sessions.heard_from(1, 10)
    sessions.touch(1, 10)  # its queued heartbeat is read
    assert sessions.heard_from(1, 10)
    # Broker 2's heartbeat never comes (it died during the stall): it is fenced one
    # session after the stall, broker 1 (heartbeating) is not.
    stalled_at = clock.now
    while (expired := sessions.expired([(1, 10), (2, 20)])) != [2]:
        assert expired == [] and clock.now - stalled_at < 3.0
        clock.now += sessions.check_interval_s
        sessions.touch(1, 10)
    assert clock.now - stalled_at >= 3.0


def test_a_session_that_ran_out_before_the_stall_is_not_renewed() -> None:
    clock = Clock()
    sessions = BrokerSessions(3.0, clock=clock)
    sessions.touch(1, 10)
    for _ in range(10):  # the controller runs 3.5 s; broker 1 is silent
        clock.now += 0.35
        sessions.observe()
    clock.now += 10.0
    assert sessions.expired([(1, 10)]) == [1]


def test_a_gap_shorter_than_the_stall_threshold_is_no_stall() -> None:
    clock = Clock()
    sessions = BrokerSessions(3.0, clock=clock)
    sessions.touch(1, 10)
    sessions.observe()
    for _ in range(5):
        clock.now += sessions.stall_threshold_s * 0.9  # a late but running loop
        sessions.observe()
    assert sessions.stalls == 0
    assert sessions.expired([(1, 10)]) == [1]


def test_a_controller_that_keeps_stalling_still_fences_a_dead_broker() -> None:
    """Bounded: the fresh session after a stall is given once per heartbeat; later
    stalls move the deadline by the stall minus one check interval."""
    clock = Clock()
    sessions = BrokerSessions(3.0, clock=clock)
    interval = sessions.check_interval_s
    sessions.touch(1, 10)  # alive: heartbeats after every stall
    sessions.touch(2, 20)  # dies now
    notes = 0
    while True:
        clock.now += 5.0  # stall
        notes += 1
        expired = sessions.expired([(1, 10), (2, 20)])
        assert 1 not in expired, f"the live broker was fenced after {notes} stalls"
        if expired == [2]:
            break
        sessions.touch(1, 10)
        assert notes <= 3.0 / interval + 1, "a dead broker outlived the bound"
    assert notes >= 3.0 / interval  # each stall spent one check interval of its session
    assert sessions.stalls == notes


async def test_a_stall_longer_than_the_session_fences_no_broker(harness) -> None:
    """The chaos finding: after a stall the controller fenced every broker at once."""
    h = harness
    epochs = {b: await h.start_broker(b) for b in (1, 2, 3)}
    await h.create_assigned("t", [[1, 2, 3]], configs={"min.insync.replicas": "2"})
    before = h.partition("t")
    h.run_for(1.0)
    h.clock.advance(10.0)  # SIGSTOP ... SIGCONT; broker 1 died meanwhile
    assert await h.handlers.fence_expired_brokers() == []
    assert h.partition("t") == before
    for b in (2, 3):  # the heartbeats that waited in the sockets
        assert not (await h.heartbeat(b, epochs[b])).is_fenced
    for _ in range(int(h.config.session_timeout_s / 0.5) + 1):
        h.run_for(0.5)
        for b in (2, 3):
            await h.heartbeat(b, epochs[b])
        await h.handlers.fence_expired_brokers()
    assert [b for b in (1, 2, 3) if h.image.brokers[b].fenced] == [1]
    after = h.partition("t")
    assert (after.leader, after.isr) == (2, [2, 3])


async def _last_in_sync_is_1(h) -> dict[int, int]:
    """Brokers 1, 2, 3; every session runs out at once (the controller cut off from
    the brokers, say): the ISR of t-0 keeps only its leader, 1. Then 2 and 3 come back
    (unfenced, out of the ISR, with the data). Returns the broker epochs."""
    epochs = {b: await h.start_broker(b) for b in (1, 2, 3)}
    await h.create_assigned("t", [[1, 2, 3]], configs={"min.insync.replicas": "2"})
    await h.create_assigned("u", [[1, 2, 3]], configs={"unclean.leader.election.enable": "true"})
    h.run_for(h.config.session_timeout_s + 1)
    assert await h.handlers.fence_expired_brokers() == [1, 2, 3]
    for b in (2, 3):
        assert not (await h.heartbeat(b, epochs[b])).is_fenced
    p = h.partition("t")
    assert (p.leader, p.isr) == (NO_LEADER, [1])
    return epochs


async def test_a_last_in_sync_replica_back_with_an_empty_disk_is_not_elected(
    harness, caplog
) -> None:
    h = harness
    await _last_in_sync_is_1(h)
    before = h.partition("t")
    with caplog.at_level(logging.WARNING, logger="controller.handlers"):
        r = await h.register(1, empty_disk=True)
    assert r.error_code == 0
    p = h.partition("t")
    assert (p.leader, p.isr) == (NO_LEADER, [])
    assert p.partition_epoch == before.partition_epoch + 1
    assert "was the last in-sync replica of t-0" in caplog.text
    # Caught up on metadata and unfenced: still nobody is elected cleanly.
    assert not (await h.heartbeat(1, r.broker_epoch)).is_fenced
    p = h.partition("t")
    assert (p.leader, p.isr) == (NO_LEADER, [])
    assert h.handlers.unclean_elections == 1  # only u-0's, below
    # A topic that allows unclean elections gets one at once, from the replicas that
    # kept their data (the empty one is not usable yet while it registers).
    u = h.partition("u")
    assert (u.leader, u.isr, u.leader_recovery_state) == (2, [2], LEADER_RECOVERING)


async def test_a_last_in_sync_replica_back_with_its_data_leads_again(harness, caplog) -> None:
    """The unclean-shutdown case stays as it was (controller/election.py says why),
    with a warning."""
    h = harness
    await _last_in_sync_is_1(h)
    with caplog.at_level(logging.WARNING, logger="controller.handlers"):
        r = await h.register(1)  # its meta.properties names the cluster: data kept
    assert "restarted after an unclean shutdown and is still the last in-sync replica" in (
        caplog.text
    )
    assert h.partition("t").isr == [1]
    assert not (await h.heartbeat(1, r.broker_epoch)).is_fenced
    p = h.partition("t")
    assert (p.leader, p.isr) == (1, [1])


async def test_an_empty_disk_leaves_every_isr_and_its_leaderships(harness) -> None:
    h = harness
    await h.start_broker(1)
    await h.start_broker(2)
    await h.create_assigned("t", [[1, 2], [2, 1]])
    r = await h.register(1, empty_disk=True)
    assert r.error_code == 0
    t0, t1 = h.partition("t", 0), h.partition("t", 1)
    assert (t0.leader, t0.isr) == (2, [2])
    assert (t1.leader, t1.isr) == (2, [2])


async def elect(h, *partitions: tuple[str, int, int], election_type: int = 1):
    """ElectLeaders for (topic, partition, replica) triples; the response."""
    return await h.handlers.elect_leaders(
        ElectLeadersRequest(
            election_type=election_type,
            partitions=[
                ElectLeadersPartition(topic=t, partition=p, replica=r) for t, p, r in partitions
            ],
        )
    )


async def test_an_operator_elects_a_replica_that_kept_its_data(harness) -> None:
    """The way back for a partition stranded with an empty ISR: an unclean election
    that takes the replica which lost its data last, or the replica named."""
    h = harness
    await _last_in_sync_is_1(h)
    r = await h.register(1, empty_disk=True)
    assert not (await h.heartbeat(1, r.broker_epoch)).is_fenced  # 1: first, up, empty
    response = await elect(h, ("t", 0, -1))
    assert response.error_code == 0
    (result,) = response.results
    t0 = h.partition("t")
    assert (result.error_code, result.leader, result.leader_epoch) == (0, 2, t0.leader_epoch)
    assert (t0.leader, t0.isr, t0.leader_recovery_state) == (2, [2], LEADER_RECOVERING)
    # Asked again: it has a leader now.
    (again,) = (await elect(h, ("t", 0, -1))).results
    assert (again.error_code, again.leader) == (ErrorCode.ELECTION_NOT_NEEDED, 2)
    assert "has a leader: broker 2" in (again.error_message or "")


async def test_an_operator_may_name_the_replica_to_elect(harness) -> None:
    h = harness
    await _last_in_sync_is_1(h)
    await h.register(1, empty_disk=True)
    (result,) = (await elect(h, ("t", 0, 3))).results
    assert (result.error_code, result.leader) == (0, 3)
    assert (h.partition("t").leader, h.partition("t").isr) == (3, [3])


async def test_elect_leaders_says_what_is_wrong(harness) -> None:
    h = harness
    epochs = await _last_in_sync_is_1(h)
    await h.register(1, empty_disk=True)
    bad_type = await elect(h, ("t", 0, -1), election_type=7)
    assert bad_type.error_code == ErrorCode.INVALID_REQUEST
    assert "preferred (0) or unclean (1)" in (bad_type.error_message or "")
    assert (await elect(h)).error_code == ErrorCode.INVALID_REQUEST
    results = (await elect(h, ("nope", 0, -1), ("u", 0, -1), ("t", 5, -1), ("u", 0, 2))).results
    codes = [(r.error_code, r.error_message or "") for r in results]
    assert codes[0] == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "nope-0 does not exist")
    assert codes[1][0] == ErrorCode.ELECTION_NOT_NEEDED  # u-0 got its unclean election
    assert codes[2][0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert codes[3] == (ErrorCode.INVALID_REQUEST, "u-0 is listed twice")
    (not_a_replica,) = (await elect(h, ("t", 0, 7))).results
    assert not_a_replica.error_code == ErrorCode.INVALID_REQUEST
    assert "broker 7 holds no replica of t-0" in (not_a_replica.error_message or "")
    (fenced,) = (await elect(h, ("t", 0, 1))).results  # registered, not caught up yet
    assert fenced.error_code == ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE
    assert "broker 1 is down or fenced" in (fenced.error_message or "")
    assert h.partition("t").leader == NO_LEADER  # nothing was elected
    # Every replica down: nobody to elect.
    for b in (2, 3):
        await h.heartbeat(b, epochs[b], want_shut_down=True)
    (result,) = (await elect(h, ("t", 0, -1))).results
    assert result.error_code == ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE
    assert "no replica of t-0 is up" in (result.error_message or "")
