"""The sans-I/O rule engine of the test-only fault controls."""

from __future__ import annotations

import pytest

from protocol.api import ApiKey
from protocol.fault_plan import ANY_API
from protocol.fault_plan import CONTROLLER_PEER_ID
from protocol.fault_plan import MAX_DELAY_MS
from protocol.fault_plan import MAX_RULES
from protocol.fault_plan import FaultPlan
from protocol.fault_plan import describe_rule
from protocol.fault_plan import peer_id_of
from protocol.messages import AlterPartitionRequest
from protocol.messages import ApiVersionsRequest
from protocol.messages import BrokerHeartbeatRequest
from protocol.messages import FaultControlRequest
from protocol.messages import FaultRule
from protocol.messages import FetchMetadataRequest
from protocol.messages import FetchRequest
from protocol.messages import ListOffsetsRequest
from protocol.messages import MetadataRequest
from protocol.messages import OffsetForLeaderEpochRequest

FETCH = int(ApiKey.FETCH)
ALTER = int(ApiKey.ALTER_PARTITION)


def rule(**kwargs: object) -> FaultRule:
    kwargs.setdefault("api_key", FETCH)
    kwargs.setdefault("action", "drop")
    return FaultRule(**kwargs)  # type: ignore[arg-type]


def test_no_rules_no_decision() -> None:
    assert FaultPlan().decide("in", FETCH, 1) is None


def test_match_on_direction_api_and_peer() -> None:
    plan = FaultPlan([rule(direction="in", peer_id=2)])
    assert plan.decide("out", FETCH, 2) is None
    assert plan.decide("in", ALTER, 2) is None
    assert plan.decide("in", FETCH, 3) is None
    decision = plan.decide("in", FETCH, 2)
    assert decision is not None and decision.action == "drop"


def test_any_peer_and_any_api() -> None:
    plan = FaultPlan([rule(api_key=ANY_API, action="delay", delay_ms=5)])
    for api in (FETCH, ALTER, int(ApiKey.METADATA)):
        decision = plan.decide("in", api, 7)
        assert decision is not None and decision.delay_ms == 5
    # FaultControl is never faulted, not even by a wildcard.
    assert plan.decide("in", int(ApiKey.FAULT_CONTROL), 7) is None


def test_first_matching_rule_wins() -> None:
    plan = FaultPlan(
        [rule(action="delay", delay_ms=10, peer_id=1), rule(action="hold"), rule(action="drop")]
    )
    assert plan.decide("in", FETCH, 1).action == "delay"  # type: ignore[union-attr]
    assert plan.decide("in", FETCH, 2).action == "hold"  # type: ignore[union-attr]


def test_remaining_is_consumed_and_exhausted_rules_dropped() -> None:
    plan = FaultPlan([rule(action="drop", remaining=2), rule(action="delay", delay_ms=1)])
    first = plan.decide("in", FETCH, 1)
    assert first is not None and first.action == "drop" and first.rule.remaining == 2
    assert plan.snapshot()[0].remaining == 1
    assert plan.decide("in", FETCH, 1).action == "drop"  # type: ignore[union-attr]
    assert len(plan) == 1
    # Now the second rule, which never runs out.
    for _ in range(5):
        assert plan.decide("in", FETCH, 1).action == "delay"  # type: ignore[union-attr]
    assert plan.snapshot()[0].remaining == -1


def test_snapshot_and_add_copy_the_rules() -> None:
    mine = rule(remaining=3)
    plan = FaultPlan([mine])
    plan.decide("in", FETCH, 1)
    assert mine.remaining == 3  # the caller's object is not touched
    snap = plan.snapshot()
    snap[0].remaining = 99
    assert plan.snapshot()[0].remaining == 2


def test_apply_clear_then_add() -> None:
    plan = FaultPlan([rule(action="drop")])
    plan.apply(FaultControlRequest(add_rules=[rule(action="hold", api_key=ALTER)]))
    assert [r.action for r in plan.snapshot()] == ["drop", "hold"]
    plan.apply(FaultControlRequest(clear=True, add_rules=[rule(action="delay", delay_ms=3)]))
    assert [r.action for r in plan.snapshot()] == ["delay"]
    plan.apply(FaultControlRequest(clear=True))
    assert plan.snapshot() == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (rule(action="explode"), "unknown fault action"),
        (rule(direction="sideways"), "unknown fault direction"),
        (rule(action="delay", delay_ms=-1), "delay_ms"),
        (rule(action="delay", delay_ms=MAX_DELAY_MS + 1), "delay_ms"),
        (rule(api_key=4242), "unknown api_key"),
        (rule(api_key=int(ApiKey.FAULT_CONTROL)), "FaultControl"),
        (rule(remaining=0), "remaining"),
        (rule(remaining=-5), "remaining"),
    ],
)
def test_invalid_rules_refused_atomically(bad: FaultRule, message: str) -> None:
    plan = FaultPlan([rule(action="hold")])
    with pytest.raises(ValueError, match=message):
        plan.apply(FaultControlRequest(clear=True, add_rules=[rule(), bad]))
    # Nothing changed: not even the clear.
    assert [r.action for r in plan.snapshot()] == ["hold"]


def test_rule_bound() -> None:
    plan = FaultPlan([rule() for _ in range(MAX_RULES)])
    with pytest.raises(ValueError, match="too many fault rules"):
        plan.apply(FaultControlRequest(add_rules=[rule()]))
    assert len(plan) == MAX_RULES
    # A clear in the same request makes room.
    plan.apply(FaultControlRequest(clear=True, add_rules=[rule()]))
    assert len(plan) == 1
    with pytest.raises(ValueError, match="too many"):
        FaultPlan([rule() for _ in range(MAX_RULES + 1)])


def test_peer_id_of_request_bodies() -> None:
    assert peer_id_of(FetchRequest(replica_id=3, topics=[])) == 3
    assert peer_id_of(FetchRequest(topics=[])) == -1  # a consumer
    assert peer_id_of(ListOffsetsRequest(replica_id=2, topics=[])) == 2
    assert peer_id_of(OffsetForLeaderEpochRequest(replica_id=4, topics=[])) == 4
    assert peer_id_of(AlterPartitionRequest(broker_id=1, broker_epoch=5, topics=[])) == 1
    assert peer_id_of(BrokerHeartbeatRequest(broker_id=6, broker_epoch=1)) == 6
    assert peer_id_of(FetchMetadataRequest(broker_id=8, from_offset=0)) == 8
    assert peer_id_of(MetadataRequest()) == -1
    assert peer_id_of(ApiVersionsRequest()) == -1


def test_controller_peer_id_is_a_valid_rule_target() -> None:
    plan = FaultPlan([rule(direction="out", api_key=ALTER, peer_id=CONTROLLER_PEER_ID)])
    assert plan.decide("out", ALTER, 1) is None
    assert plan.decide("out", ALTER, CONTROLLER_PEER_ID) is not None


def test_describe_rule_is_readable() -> None:
    text = describe_rule(rule(action="delay", delay_ms=250, peer_id=2, remaining=3))
    assert text == "delay 250 ms in FETCH peer 2 3 time(s)"
    assert describe_rule(rule(api_key=ANY_API)) == "drop in ANY_API any peer until cleared"
