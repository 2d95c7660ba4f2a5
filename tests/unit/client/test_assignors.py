"""The partition assignors give what Kafka's give (the examples of Kafka's RangeAssignor
and RoundRobinAssignor documentation), so a group keeps the same assignment whichever
client is its leader, and every subscribed partition goes to exactly one member."""

from __future__ import annotations

import pytest

from client.consumer.assignors import RangeAssignor
from client.consumer.assignors import RoundRobinAssignor
from client.consumer.assignors import assignor
from protocol.kafka.consumer_protocol import Assignment
from protocol.kafka.consumer_protocol import Subscription


def flat(assignment: Assignment) -> list[str]:
    return [f"{tp.topic}p{p}" for tp in assignment.assigned_partitions for p in tp.partitions]


TWO_BY_THREE = {"C0": Subscription(["t0", "t1"]), "C1": Subscription(["t0", "t1"])}


def test_range_gives_consecutive_ranges_per_topic() -> None:
    got = RangeAssignor().assign(TWO_BY_THREE, {"t0": 3, "t1": 3})
    assert flat(got["C0"]) == ["t0p0", "t0p1", "t1p0", "t1p1"]
    assert flat(got["C1"]) == ["t0p2", "t1p2"]


def test_roundrobin_deals_all_partitions_in_turn() -> None:
    got = RoundRobinAssignor().assign(TWO_BY_THREE, {"t0": 3, "t1": 3})
    assert flat(got["C0"]) == ["t0p0", "t0p2", "t1p1"]
    assert flat(got["C1"]) == ["t0p1", "t1p0", "t1p2"]


def test_roundrobin_skips_members_not_subscribed_to_a_topic() -> None:
    subscriptions = {
        "C0": Subscription(["t0"]),
        "C1": Subscription(["t0", "t1"]),
        "C2": Subscription(["t0", "t1", "t2"]),
    }
    got = RoundRobinAssignor().assign(subscriptions, {"t0": 1, "t1": 2, "t2": 3})
    # Kafka's documented example: C0 [t0p0], C1 [t1p0], C2 [t1p1, t2p0, t2p1, t2p2]
    assert flat(got["C0"]) == ["t0p0"]
    assert flat(got["C1"]) == ["t1p0"]
    assert flat(got["C2"]) == ["t1p1", "t2p0", "t2p1", "t2p2"]


@pytest.mark.parametrize("name", ["range", "roundrobin"])
@pytest.mark.parametrize("members", [1, 2, 3, 5, 7])
def test_every_partition_goes_to_exactly_one_subscribed_member(name: str, members: int) -> None:
    subscriptions = {f"m{i}": Subscription(["a", "b"] if i % 2 else ["a"]) for i in range(members)}
    counts = {"a": 6, "b": 5, "unsubscribed": 4}
    got = assignor(name).assign(subscriptions, counts)
    owned = [(m, p) for m, a in got.items() for p in flat(a)]
    subscribed = {t for s in subscriptions.values() for t in s.topics}
    expected = [f"{t}p{i}" for t in sorted(subscribed) for i in range(counts[t])]
    assert sorted(p for _, p in owned) == sorted(expected)
    assert all(p[0] in subscriptions[m].topics for m, p in owned)


def test_an_unknown_assignor_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="'range', 'roundrobin'"):
        assignor("sticky")
