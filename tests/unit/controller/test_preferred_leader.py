"""Preferred leaders (Kafka's auto.leader.rebalance.enable and ElectLeaders PREFERRED):
after a broker's leaderships moved away (it died, it shut down) and it is back in
sync, the leaderships go back to it, so the load does not stay piled on the brokers
that survived. Invariant: a leadership moves only to a replica in the ISR, with the
leader epoch bumped; a replica not in sync never leads by this path."""

from __future__ import annotations

from pathlib import Path

from protocol.api import ELECTION_PREFERRED
from protocol.errors import ErrorCode
from tests.unit.controller.test_controller_alter_partition import alter
from tests.unit.controller.test_controller_stall import elect


async def broker_1_left_and_came_back(h) -> dict[int, int]:
    """Brokers 1-3, topic t (replicas [1, 2, 3]); broker 1 shut down (2 leads) and
    registered again: unfenced, not in the ISR yet."""
    epochs = {b: await h.start_broker(b) for b in (1, 2, 3)}
    await h.create_assigned("t", [[1, 2, 3]])
    await h.heartbeat(1, epochs[1], want_shut_down=True)
    t0 = h.partition("t")
    assert (t0.leader, t0.isr) == (2, [2, 3])
    epochs[1] = await h.start_broker(1)
    return epochs


async def test_the_preferred_replica_leads_again_once_in_sync(make_harness, tmp_path: Path) -> None:
    h = await make_harness(tmp_path / "c")
    epochs = await broker_1_left_and_came_back(h)
    # Out of sync: neither the rebalance nor an operator moves the leadership to it.
    assert await h.handlers.rebalance_leaders() == 0
    (refused,) = (await elect(h, ("t", 0, -1), election_type=ELECTION_PREFERRED)).results
    assert refused.error_code == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    assert "broker 1, is not in sync" in (refused.error_message or "")
    assert h.partition("t").leader == 2
    # The leader takes it back into the ISR: the next check gives it its leadership.
    response = await alter(h, [(2, epochs[2]), (3, epochs[3]), (1, epochs[1])], broker_id=2)
    assert response.error_code == 0
    before = h.partition("t")
    assert await h.handlers.rebalance_leaders() == 1
    after = h.partition("t")
    assert (after.leader, after.isr) == (1, before.isr)
    assert after.leader_epoch == before.leader_epoch + 1  # fences the old leader's writes
    assert await h.handlers.rebalance_leaders() == 0  # balanced: nothing more
    (again,) = (await elect(h, ("t", 0, -1), election_type=ELECTION_PREFERRED)).results
    assert again.error_code == ErrorCode.ELECTION_NOT_NEEDED


async def test_an_operator_elects_preferred_leaders_of_every_partition(
    make_harness, tmp_path: Path
) -> None:
    """ElectLeaders PREFERRED naming no partition means all of them (Kafka's null)."""
    h = await make_harness(tmp_path / "c")
    epochs = await broker_1_left_and_came_back(h)
    await h.create_assigned("u", [[2, 3, 1]])
    await alter(h, [(2, epochs[2]), (3, epochs[3]), (1, epochs[1])], broker_id=2)
    response = await elect(h, election_type=ELECTION_PREFERRED)
    outcome = {(r.topic, r.partition): (r.error_code, r.leader) for r in response.results}
    assert outcome == {("t", 0): (0, 1), ("u", 0): (ErrorCode.ELECTION_NOT_NEEDED, 2)}
    (unknown,) = (await elect(h, ("nope", 0, -1), election_type=ELECTION_PREFERRED)).results
    assert unknown.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_a_small_imbalance_is_left_alone(make_harness, tmp_path: Path) -> None:
    """leader.imbalance.per.broker.percentage (10%): broker 1 is preferred for 20
    partitions; while more than 2 of them are led elsewhere, the check moves back
    every one that is in sync; 2 of 20 led elsewhere is within the allowance."""
    h = await make_harness(tmp_path / "c", leader_imbalance_per_broker_percentage=10)
    epochs = {b: await h.start_broker(b) for b in (1, 2)}
    await h.create_assigned("t", [[1, 2]] * 20)
    await h.heartbeat(1, epochs[1], want_shut_down=True)
    assert {h.partition("t", p).leader for p in range(20)} == {2}
    epochs[1] = await h.start_broker(1)
    for p in range(18):  # back in sync: all but two
        assert (
            await alter(h, [(2, epochs[2]), (1, epochs[1])], broker_id=2, partition=p)
        ).error_code == 0
    assert await h.handlers.rebalance_leaders() == 18
    assert [h.partition("t", p).leader for p in range(20)] == [1] * 18 + [2, 2]
    for p in (18, 19):
        assert (
            await alter(h, [(2, epochs[2]), (1, epochs[1])], broker_id=2, partition=p)
        ).error_code == 0
    assert await h.handlers.rebalance_leaders() == 0  # 2 of 20: allowed
    assert h.partition("t", 19).leader == 2
