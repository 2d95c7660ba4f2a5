"""Partition assignors: how a group's leader splits the subscribed topics' partitions
over the members (Kafka's RangeAssignor and RoundRobinAssignor, by the same rules, so a
group whose leader is another client assigns alike; and a cooperative sticky assignor,
KIP-429). The name is what JoinGroup offers as the protocol; members list theirs by
preference and the coordinator picks one all of them support.

`cooperative` says which rebalance protocol an assignor serves: an eager one gets every
partition revoked from every member before each rebalance; a cooperative one lets
members keep what they own, and never hands a partition to a new owner in the same
rebalance that takes it from the old one (the old owner revokes it, then rejoins, and
the next rebalance gives it out).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

from protocol.kafka.consumer_protocol import Assignment
from protocol.kafka.consumer_protocol import Subscription
from protocol.kafka.consumer_protocol import TopicPartitions


class Assignor(Protocol):
    name: str
    cooperative: bool

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
    cooperative = False

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
    cooperative = False

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


class CooperativeStickyAssignor:
    """Balanced (members' counts differ by at most one where subscriptions allow) and
    sticky (a member keeps what it owns, as far as balance lets it), cooperative: a
    partition that changes owner is left out of this round's plan (KIP-429).

    Ownership comes from each member's subscription (owned partitions, and the
    generation it owned them in): where two members claim a partition, the claim of the
    later generation wins, and two claims of one generation are both ignored."""

    name = "cooperative-sticky"
    cooperative = True

    def assign(
        self, subscriptions: dict[str, Subscription], partitions: dict[str, int]
    ) -> dict[str, Assignment]:
        members = sorted(subscriptions)
        wanted = {m: set(subscriptions[m].topics) for m in members}
        every = [(t, p) for t in sorted(partitions) for p in range(partitions[t])]
        eligible = {tp: [m for m in members if tp[0] in wanted[m]] for tp in every}
        owner = self._valid_owners(subscriptions)
        plan: dict[str, list[tuple[str, int]]] = {m: [] for m in members}
        subscribed = [tp for tp in every if eligible[tp]]
        quota = -(-len(subscribed) // max(1, len(members)))  # ceil
        # Keep what each member validly owns (still subscribed), up to the quota.
        for tp in subscribed:
            m = owner.get(tp)
            if m in plan and tp[0] in wanted[m] and len(plan[m]) < quota:
                plan[m].append(tp)
        kept = {tp for ps in plan.values() for tp in ps}
        # The rest to the least loaded member that may have it.
        for tp in subscribed:
            if tp not in kept:
                target = min(eligible[tp], key=lambda m: (len(plan[m]), m))
                plan[target].append(tp)
        self._balance(plan, eligible)
        # Cooperative: a partition moving from its owner to another member waits for
        # the owner to revoke it (the next rebalance hands it over).
        out: dict[str, dict[str, list[int]]] = {m: defaultdict(list) for m in members}
        for m, tps in plan.items():
            for topic, p in tps:
                previous = owner.get((topic, p))
                if previous is None or previous == m or previous not in plan:
                    out[m][topic].append(p)
        return {m: _assignment(o) for m, o in out.items()}

    @staticmethod
    def _valid_owners(subscriptions: dict[str, Subscription]) -> dict[tuple[str, int], str]:
        claims: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
        for member, subscription in subscriptions.items():
            for owned in subscription.owned_partitions:
                for p in owned.partitions:
                    claims[(owned.topic, p)].append((subscription.generation_id, member))
        owner = {}
        for tp, by in claims.items():
            by.sort(reverse=True)
            if len(by) == 1 or by[0][0] > by[1][0]:
                owner[tp] = by[0][1]
        return owner

    @staticmethod
    def _balance(
        plan: dict[str, list[tuple[str, int]]], eligible: dict[tuple[str, int], list[str]]
    ) -> None:
        """Move partitions from the most to the least loaded member allowed to own
        them until no move narrows the spread (bounded: each move shrinks it)."""
        for _ in range(sum(len(ps) for ps in plan.values()) + 1):
            most = max(plan, key=lambda m: (len(plan[m]), m))
            movable = [
                (tp, m)
                for tp in reversed(plan[most])
                for m in eligible[tp]
                if len(plan[m]) + 1 < len(plan[most])
            ]
            if not movable:
                return
            tp, target = min(movable, key=lambda x: (len(plan[x[1]]), x[1]))
            plan[most].remove(tp)
            plan[target].append(tp)


ASSIGNORS: dict[str, Assignor] = {
    a.name: a for a in (RangeAssignor(), RoundRobinAssignor(), CooperativeStickyAssignor())
}


def assignor(name: str) -> Assignor:
    try:
        return ASSIGNORS[name]
    except KeyError:
        raise ValueError(
            f"unknown partition assignor {name!r}: use one of {sorted(ASSIGNORS)}"
        ) from None
