"""Finding the active controller from a DescribeQuorum answer (runtime/active_controller.py):
a controller that listens on a wildcard address (0.0.0.0 in a container) is reached
where it was asked, never at the wildcard, which no one can dial."""

from __future__ import annotations

from protocol.messages import DescribeQuorumResponse
from protocol.messages import QuorumVoterState
from runtime.active_controller import ActiveController


def answer(
    node_id: int, leader_id: int, voters: dict[int, tuple[str, int]]
) -> DescribeQuorumResponse:
    return DescribeQuorumResponse(
        node_id=node_id,
        leader_id=leader_id,
        leader_epoch=3,
        voters=[QuorumVoterState(replica_id=v, host=h, port=p) for v, (h, p) in voters.items()],
    )


def test_a_leader_answering_for_itself_is_reached_where_it_was_asked() -> None:
    single = answer(0, 0, {0: ("0.0.0.0", 9093)})  # a quorum of one in a container
    assert ActiveController._leader_endpoint(single, ("controller", 9093)) == ("controller", 9093)


def test_another_voter_named_leader_is_reached_at_its_listed_address() -> None:
    quorum = {1: ("c1", 9093), 2: ("c2", 9093), 3: ("c3", 9093)}
    assert ActiveController._leader_endpoint(answer(1, 2, quorum), ("c1", 9093)) == ("c2", 9093)


def test_a_wildcard_or_unknown_leader_address_is_not_used() -> None:
    wild = {1: ("c1", 9093), 2: ("0.0.0.0", 9093)}
    assert ActiveController._leader_endpoint(answer(1, 2, wild), ("c1", 9093)) is None
    assert ActiveController._leader_endpoint(answer(1, -1, wild), ("c1", 9093)) is None
