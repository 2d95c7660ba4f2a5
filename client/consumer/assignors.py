"""Partition assignors: how a group's leader splits the subscribed topics' partitions
over the members (Kafka's RangeAssignor and RoundRobinAssignor, by the same rules, so a
group whose leader is another client assigns alike). The name is what JoinGroup offers
as the protocol; members list theirs by preference and the coordinator picks one all
of them support.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

from protocol.kafka.consumer_protocol import Assignment
from protocol.kafka.consumer_protocol import Subscription
from protocol.kafka.consumer_protocol import TopicPartitions


class Assignor(Protocol):
    name: str

    def assign(
        self, subscriptions: dict[str, Subscription], partitions: dict[str, int]
    ) -> dict[str, Assignment]:
        """Each member's assignment, from every member's subscription and the number of
        partitions of each subscribed topic (topics without metadata are left out)."""
        ...


def _assignment(owned: dict[str, list[int]]) -> Assignment:
    return Assignment(
        assigned_partitions=[
            TopicPartitions(topic, sorted(ps)) for topic, ps in sorted(owned.items()) if ps
        ]
    )


class RangeAssignor:
    """Per topic, its members (sorted by member id) get consecutive ranges of
    partitions; the first `partitions % members` get one more."""

    name = "range"

    def assign(
        self, subscriptions: dict[str, Subscription], partitions: dict[str, int]
    ) -> dict[str, Assignment]:
        owned: dict[str, dict[str, list[int]]] = {m: defaultdict(list) for m in subscriptions}
        by_topic: dict[str, list[str]] = defaultdict(list)
        for member, subscription in subscriptions.items():
            for topic in set(subscription.topics):
                by_topic[topic].append(member)
        for topic, members in by_topic.items():
            count = partitions.get(topic)
            if count is None:
                continue
            members.sort()
            each, extra = divmod(count, len(members))
            start = 0
            for i, member in enumerate(members):
                n = each + (1 if i < extra else 0)
                owned[member][topic].extend(range(start, start + n))
                start += n
        return {m: _assignment(o) for m, o in owned.items()}


class RoundRobinAssignor:
    """Every subscribed partition (sorted by topic, then partition) in turn to the next
    member (sorted by member id) subscribed to its topic."""

    name = "roundrobin"

    def assign(
        self, subscriptions: dict[str, Subscription], partitions: dict[str, int]
    ) -> dict[str, Assignment]:
        members = sorted(subscriptions)
        owned: dict[str, dict[str, list[int]]] = {m: defaultdict(list) for m in members}
        wanted = {m: set(subscriptions[m].topics) for m in members}
        topics = sorted({t for ts in wanted.values() for t in ts if t in partitions})
        turn = 0
        for topic in topics:
            for p in range(partitions[topic]):
                for _ in range(len(members)):
                    member = members[turn % len(members)]
                    turn += 1
                    if topic in wanted[member]:
                        owned[member][topic].append(p)
                        break
        return {m: _assignment(o) for m, o in owned.items()}


ASSIGNORS: dict[str, Assignor] = {a.name: a for a in (RangeAssignor(), RoundRobinAssignor())}


def assignor(name: str) -> Assignor:
    try:
        return ASSIGNORS[name]
    except KeyError:
        raise ValueError(
            f"unknown partition assignor {name!r}: use one of {sorted(ASSIGNORS)}"
        ) from None
