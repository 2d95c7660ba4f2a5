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


# ------------------------------------------------------------------ cooperative sticky


def owning(topics: list[str], generation: int, **owned: list[int]) -> Subscription:
    from protocol.kafka.consumer_protocol import TopicPartitions

    return Subscription(
        topics,
        owned_partitions=[TopicPartitions(t, ps) for t, ps in owned.items()],
        generation_id=generation,
    )


def test_cooperative_sticky_balances_a_fresh_group() -> None:
    subscriptions = {m: Subscription(["t"]) for m in ("a", "b", "c")}
    got = assignor("cooperative-sticky").assign(subscriptions, {"t": 7})
    sizes = sorted(len(flat(a)) for a in got.values())
    assert sizes == [2, 2, 3]
    assert sorted(p for a in got.values() for p in flat(a)) == sorted(f"tp{i}" for i in range(7))


def test_cooperative_sticky_keeps_owners_and_moves_in_two_rounds() -> None:
    """KIP-429: members keep what they own; what must move to the newcomer is first
    only taken away (its owner revokes it), then given in the follow-up rebalance."""
    sticky = assignor("cooperative-sticky")
    first = sticky.assign(
        {
            "a": owning(["t"], 3, t=[0, 1, 2]),
            "b": owning(["t"], 3, t=[3, 4, 5]),
            "c": Subscription(["t"]),  # the newcomer
        },
        {"t": 6},
    )
    assert flat(first["a"]) == ["tp0", "tp1"] and flat(first["b"]) == ["tp3", "tp4"]
    assert flat(first["c"]) == []  # tp2 and tp5 still owned by a and b: not yet
    second = sticky.assign(
        {
            "a": owning(["t"], 4, t=[0, 1]),
            "b": owning(["t"], 4, t=[3, 4]),
            "c": owning(["t"], 4),
        },
        {"t": 6},
    )
    assert (flat(second["a"]), flat(second["b"])) == (["tp0", "tp1"], ["tp3", "tp4"])
    assert flat(second["c"]) == ["tp2", "tp5"]


def test_cooperative_sticky_ignores_stale_and_conflicting_claims() -> None:
    """A claim from an older generation loses to a newer one; two claims of one
    generation are both ignored (neither is known to own it)."""
    got = assignor("cooperative-sticky").assign(
        {
            "old": owning(["t"], 2, t=[0, 1]),
            "new": owning(["t"], 5, t=[0]),
            "x": owning(["t"], 5, t=[1]),
            "y": owning(["t"], 5, t=[1]),
        },
        {"t": 4},
    )
    assert "tp0" in flat(got["new"])  # the newer claim wins
    owned = [p for a in got.values() for p in flat(a)]
    assert sorted(owned) == sorted(set(owned))  # nothing twice
