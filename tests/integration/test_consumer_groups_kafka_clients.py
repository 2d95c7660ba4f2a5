"""Consumer groups with real Kafka clients, each member its own process
(tests/integration/group_member.py): kafka-python 3.0.12, confluent-kafka 2.16.1 and
aiokafka 0.14.0 subscribe through the brokers' Kafka listeners, and minibroker's
coordinator runs the classic rebalance protocol for them.

The invariants, after every rebalance: every partition is owned by exactly one live
member; no record is delivered twice to a group whose members commit after every
batch and on revoke, except records a SIGKILLed member was given and had no time to
commit (at-least-once); none is skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster

from client import AsyncAdmin
from client import AsyncConsumer
from client import AsyncProducer
from client import NewTopic
from tests.integration.test_kafka_listener import native_bootstrap

TOPIC = "grouped"
PARTITIONS = 6
SESSION_MS = 3_000
WAIT_S = 60.0
MEMBER = Path(__file__).with_name("group_member.py")
# A short minimum session (tests kill members) and no initial delay (tests wait for
# each generation): the broker flags of Kafka's group.min.session.timeout.ms and
# group.initial.rebalance.delay.ms.
GROUP_FLAGS = ("--group-min-session-timeout-ms", "1000", "--group-initial-rebalance-delay-ms", "0")


@pytest.fixture
def cluster(cluster: Cluster) -> Iterator[Cluster]:
    cluster.start_controller()
    cluster.start_brokers((1, 2, 3), *GROUP_FLAGS, kafka=True)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    yield cluster


class MemberProcess:
    """A group member process and what it reported."""

    def __init__(
        self,
        client: str,
        cluster: Cluster,
        group: str,
        name: str,
        assignor: str = "",
        instance: str = "",
    ) -> None:
        self.name = name
        # minibroker's consumer speaks the native protocol, the others Kafka's.
        bootstrap = (
            native_bootstrap(cluster) if client == "minibroker" else cluster.kafka_bootstrap()
        )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(MEMBER),
                client,
                bootstrap,
                TOPIC,
                group,
                str(SESSION_MS),
                assignor,
                *([instance] if instance else []),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(MEMBER.parents[2])},
        )
        self.partitions: set[int] | None = None  # the last assignment reported
        self.assignments = 0  # how many times it reported one
        self.delivered: list[tuple[int, int, str]] = []
        self.closed = False
        self.commit_failures: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event: dict[str, Any] = json.loads(line)
            if event["event"] == "assigned":
                self.partitions = set(event["partitions"])
                self.assignments += 1
            elif event["event"] == "delivered":
                self.delivered += [tuple(r) for r in event["records"]]  # type: ignore[misc]
            elif event["event"] == "closed":
                self.closed = True
            elif event["event"] == "commit_failed":
                self.commit_failures.append(event["reason"])

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM: the member commits, leaves the group and exits."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self._reader.join(5)
        assert self.closed, f"{self.name} did not close cleanly:\n{self.stderr()}"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(5)

    def stderr(self) -> str:
        if self.alive or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()[-3000:]


def wait_until(what: str, check: Callable[[], bool], members: list[MemberProcess]) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if check():
            return
        for m in members:
            if not m.alive and not m.closed and m.proc.returncode != -signal.SIGKILL:
                pytest.fail(f"{m.name} died: {m.stderr()}")
        time.sleep(0.1)
    state = {m.name: (m.alive, m.partitions, len(m.delivered)) for m in members}
    pytest.fail(f"timed out waiting for {what}: {state}")


def owned_exactly_once(live: list[MemberProcess]) -> bool:
    """Every partition owned by exactly one live member (by their last reports)."""
    if any(m.partitions is None for m in live):
        return False
    owned = Counter(p for m in live for p in m.partitions or ())
    return set(owned) == set(range(PARTITIONS)) and all(n == 1 for n in owned.values())


def owned_evenly(live: list[MemberProcess]) -> bool:
    """Owned exactly once and the same share each: an owner count alone can be met for a
    moment by an earlier generation's 3 + 3 beside a member that has nothing yet."""
    share = PARTITIONS // len(live)
    return owned_exactly_once(live) and all(len(m.partitions or ()) == share for m in live)


async def produce(cluster: Cluster, prefix: str, count: int) -> set[str]:
    values = {f"{prefix}-{i}" for i in range(count)}
    async with AsyncProducer(native_bootstrap(cluster), acks="all") as producer:
        futures = [await producer.send(TOPIC, value=v.encode()) for v in sorted(values)]
        for f in futures:
            await f
    return values


def delivered(members: list[MemberProcess]) -> Counter[str]:
    return Counter(value for m in members for _, _, value in m.delivered)


async def create_topic(cluster: Cluster) -> None:
    async with AsyncAdmin(native_bootstrap(cluster)) as admin:
        await admin.create_topics(
            [NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})], timeout_ms=20_000
        )


@pytest.mark.parametrize("client", ["minibroker", "kafka-python", "confluent", "aiokafka"])
async def test_members_split_partitions_and_rebalance_on_leave_kill_and_join(
    cluster: Cluster, client: str
) -> None:
    await leave_kill_join(cluster, [client] * 3, f"group-{client}")


async def test_a_group_of_three_different_clients(cluster: Cluster) -> None:
    """kafka-python, librdkafka and aiokafka in one group: they agree on a protocol all
    three support (aiokafka offers only roundrobin) and read each other's assignments,
    all in Kafka's consumer protocol format."""
    await leave_kill_join(cluster, ["kafka-python", "confluent", "aiokafka"], "mixed")


async def test_a_minibroker_consumer_and_kafka_python_consumers_share_a_group(
    cluster: Cluster,
) -> None:
    """One coordinator for both listeners: members on the native protocol and on
    Kafka's are one group, each reading the other's subscription and assignment."""
    await leave_kill_join(cluster, ["minibroker", "kafka-python", "minibroker"], "native-mixed")


async def test_a_cooperative_group_of_three_clients(cluster: Cluster) -> None:
    """KIP-429 across clients: minibroker's, kafka-python's and librdkafka's
    cooperative-sticky assignors; members keep their partitions through a rebalance and
    hand over only what moves, in two rounds."""
    clients = ["minibroker", "kafka-python", "confluent"]
    await leave_kill_join(cluster, clients, "cooperative", assignor="cooperative-sticky")


async def test_a_cooperative_group_of_minibroker_consumers(cluster: Cluster) -> None:
    clients = ["minibroker"] * 3
    await leave_kill_join(cluster, clients, "cooperative-mb", assignor="cooperative-sticky")


async def leave_kill_join(
    cluster: Cluster, clients: list[str], group: str, assignor: str = ""
) -> None:
    """Three members (of `clients`) own six partitions; one leaves, one is SIGKILLed,
    one joins (of the first client); records produced after each step are all
    delivered, twice only if the killed member had them."""
    await create_topic(cluster)
    everyone = [
        MemberProcess(c, cluster, group, f"{c}-{i}", assignor) for i, c in enumerate(clients)
    ]
    try:
        wait_until("three members own two each", lambda: owned_evenly(everyone), everyone)

        sent = await produce(cluster, "first", 300)
        wait_until("the first records", lambda: set(delivered(everyone)) >= sent, everyone)

        # A member leaves (LeaveGroup): the other two take its partitions, resuming
        # at its commits.
        everyone[0].stop()
        live = everyone[1:]
        wait_until("two members own six partitions", lambda: owned_exactly_once(live), everyone)
        sent |= await produce(cluster, "second", 300)
        wait_until("the second records", lambda: set(delivered(everyone)) >= sent, everyone)
        counts = delivered(everyone)
        assert [v for v, n in counts.items() if n > 1] == [], "delivered twice after a leave"

        # A member is SIGKILLed: its session expires, the last one takes everything.
        everyone[1].kill()
        live = everyone[2:]
        wait_until("one member owns six partitions", lambda: owned_exactly_once(live), everyone)
        sent |= await produce(cluster, "third", 300)
        wait_until("the third records", lambda: set(delivered(everyone)) >= sent, everyone)

        # A member joins: partitions are split again.
        newcomer = MemberProcess(clients[0], cluster, group, f"{clients[0]}-3", assignor)
        everyone.append(newcomer)
        live = [everyone[2], newcomer]
        wait_until("two members own six partitions", lambda: owned_exactly_once(live), everyone)
        sent |= await produce(cluster, "fourth", 300)
        wait_until("the fourth records", lambda: set(delivered(everyone)) >= sent, everyone)

        counts = delivered(everyone)
        assert set(counts) == sent, "a record that was not sent, or one skipped"
        killed = {v for _, _, v in everyone[1].delivered}
        twice = {v for v, n in counts.items() if n > 1}
        # At least once: only what the killed member was given may come again.
        assert twice <= killed, sorted(twice - killed)[:10]
    finally:
        for m in everyone:
            if m.alive:
                m.kill()


async def test_the_group_survives_its_coordinator_sigkilled_under_load(cluster: Cluster) -> None:
    """The coordinator's broker is SIGKILLed while the members consume and a producer
    writes: the leader of the group's `__consumer_offsets` partition moves, the new
    coordinator loads the group and its commits from the log, the members find it and
    go on (at most rejoining). Nothing acknowledged is missed and no committed offset
    goes back."""
    await create_topic(cluster)
    clients = ["kafka-python", "minibroker", "confluent"]
    everyone = [MemberProcess(c, cluster, "survivors", f"{c}-{i}") for i, c in enumerate(clients)]
    sent: set[str] = set()
    stop = asyncio.Event()

    async def keep_producing() -> None:
        async with AsyncProducer(native_bootstrap(cluster), acks="all") as producer:
            i = 0
            while not stop.is_set():
                futures = [
                    await producer.send(TOPIC, value=f"load-{i + k}".encode()) for k in range(20)
                ]
                for k, f in enumerate(futures):
                    await f
                    sent.add(f"load-{i + k}")
                i += 20
                await asyncio.sleep(0.05)

    try:
        wait_until(
            "three members own six partitions", lambda: owned_exactly_once(everyone), everyone
        )
        producing = asyncio.create_task(keep_producing())
        await asyncio.sleep(2)
        async with AsyncAdmin(native_bootstrap(cluster)) as admin:
            before = await admin.list_group_offsets("survivors")
            coordinator = (await admin.describe_group("survivors")).coordinator
        cluster.brokers[coordinator].kill()
        await asyncio.sleep(6)
        stop.set()
        await producing
        wait_until("every acknowledged record", lambda: set(delivered(everyone)) >= sent, everyone)
        # A member whose session ran out while the coordinator moved rejoins: wait for
        # the generation that holds all three again.
        wait_until("three members own two each", lambda: owned_evenly(everyone), everyone)
        survivors = [b for n, b in cluster.brokers.items() if n != coordinator]
        bootstrap = ",".join(f"{h}:{p}" for h, p in (b.address for b in survivors))
        async with AsyncAdmin(bootstrap) as admin:
            deadline = time.monotonic() + WAIT_S
            group = await admin.describe_group("survivors")
            while not (group.state == "Stable" and len(group.members) == 3):
                assert time.monotonic() < deadline, group
                await asyncio.sleep(0.2)
                group = await admin.describe_group("survivors")
            after = await admin.list_group_offsets("survivors")
        assert group.coordinator != coordinator
        assert all(after[tp].offset >= om.offset for tp, om in before.items()), (before, after)
        assert set(delivered(everyone)) == sent
    finally:
        stop.set()
        for m in everyone:
            if m.alive:
                m.kill()


async def static_pair(cluster: Cluster, group: str) -> tuple[MemberProcess, MemberProcess]:
    """The topic, and two static minibroker members of `group` (instance-0, instance-1)."""
    await create_topic(cluster)
    first, second = (
        MemberProcess("minibroker", cluster, group, f"{group}-{i}", instance=f"instance-{i}")
        for i in range(2)
    )
    return first, second


async def test_a_static_member_restarts_and_keeps_its_partitions(cluster: Cluster) -> None:
    """KIP-345 with minibroker's consumer: a member with a group_instance_id does not
    leave on close; restarted within its session it gets its partitions back, and the
    other member sees no rebalance at all."""
    first, other = await static_pair(cluster, "static")
    everyone = [first, other]
    try:
        wait_until("two members own six partitions", lambda: owned_exactly_once(everyone), everyone)
        sent = await produce(cluster, "before", 200)
        wait_until("the first records", lambda: set(delivered(everyone)) >= sent, everyone)
        mine, seen_by_other = first.partitions, other.assignments
        first.stop()  # commits; no LeaveGroup
        again = MemberProcess("minibroker", cluster, "static", "static-0b", instance="instance-0")
        everyone.append(again)
        live = [again, other]
        wait_until(
            "the restarted member owns its partitions", lambda: owned_exactly_once(live), everyone
        )
        assert again.partitions == mine
        assert other.assignments == seen_by_other, "the other member went through a rebalance"
        sent |= await produce(cluster, "after", 200)
        wait_until("the second records", lambda: set(delivered(everyone)) >= sent, everyone)
        counts = delivered(everyone)
        assert [v for v, n in counts.items() if n > 1] == [], "delivered twice across the restart"
    finally:
        for m in everyone:
            if m.alive:
                m.kill()


async def test_a_member_that_stops_polling_leaves_and_rejoins_when_it_polls(
    cluster: Cluster,
) -> None:
    """max_poll_interval_ms: an application stuck between polls gives its partitions
    up (its heartbeat task leaves the group), so the group goes on; its next poll()
    rejoins, its partitions reported lost (nothing committed for a generation gone)."""
    await create_topic(cluster)
    events: list[tuple[str, str, list[int]]] = []

    class Listener:
        def __init__(self, name: str) -> None:
            self.name = name

        def on_partitions_assigned(self, partitions: set[Any]) -> None:
            events.append((self.name, "assigned", sorted(p.partition for p in partitions)))

        def on_partitions_revoked(self, partitions: set[Any]) -> None:
            events.append((self.name, "revoked", sorted(p.partition for p in partitions)))

        def on_partitions_lost(self, partitions: set[Any]) -> None:
            events.append((self.name, "lost", sorted(p.partition for p in partitions)))

    def member(name: str) -> AsyncConsumer:
        return AsyncConsumer(
            native_bootstrap(cluster),
            group_id="slow",
            client_id=name,
            session_timeout_ms=6_000,
            heartbeat_interval_ms=300,
            max_poll_interval_ms=2_000,
        )

    async with member("slow") as slow, member("busy") as busy:
        slow.subscribe([TOPIC], listener=Listener("slow"))
        busy.subscribe([TOPIC], listener=Listener("busy"))
        async with asyncio.timeout(30):
            while len(slow.assignment()) + len(busy.assignment()) < PARTITIONS or not (
                slow.assignment() and busy.assignment()
            ):
                await asyncio.gather(slow.poll(timeout_ms=200), busy.poll(timeout_ms=200))
        # `slow` stops polling for longer than max_poll_interval_ms; `busy` goes on.
        async with asyncio.timeout(30):
            while len(busy.assignment()) < PARTITIONS:
                await busy.poll(timeout_ms=200)
        assert ("slow", "lost", []) not in events

        # Back: slow's next poll reports what it held as lost, then it rejoins.
        def rejoined() -> bool:
            kinds = [kind for name, kind, _ in events if name == "slow"]
            return "lost" in kinds and kinds[-1] == "assigned" and kinds.index("lost") > 0

        async with asyncio.timeout(30):
            while not (rejoined() and slow.assignment() and busy.assignment()):
                await asyncio.gather(slow.poll(timeout_ms=200), busy.poll(timeout_ms=200))
        lost = [e for e in events if e[0] == "slow" and e[1] == "lost"]
        assert lost[0][2], events  # what it held when it left
        assert len(slow.assignment()) + len(busy.assignment()) == PARTITIONS


async def test_a_paused_zombie_cannot_commit_over_the_new_owner(cluster: Cluster) -> None:
    """A member SIGSTOPped past its session is removed; the other takes its partitions,
    reads and commits. Resumed, the zombie must not move the group's offsets back:
    minibroker's consumer learns from its first heartbeat that its membership is gone
    (its partitions lost, nothing committed) and rejoins; had it committed first, the
    coordinator would have refused it (tests/unit/broker/test_group_membership.py,
    test_a_zombie_cannot_commit)."""
    await create_topic(cluster)
    zombie, owner = (MemberProcess("minibroker", cluster, "fenced", f"m-{i}") for i in range(2))
    everyone = [zombie, owner]
    try:
        wait_until("two members own six partitions", lambda: owned_exactly_once(everyone), everyone)
        zombie.proc.send_signal(signal.SIGSTOP)
        wait_until("the owner has everything", lambda: owned_exactly_once([owner]), everyone)
        sent = await produce(cluster, "while-paused", 300)
        wait_until("the owner read it all", lambda: set(delivered([owner])) >= sent, everyone)
        async with AsyncAdmin(native_bootstrap(cluster)) as admin:
            ahead = await admin.list_group_offsets("fenced")
        assert sum(om.offset for om in ahead.values()) == 300
        zombie.proc.send_signal(signal.SIGCONT)
        wait_until("two members again", lambda: owned_exactly_once(everyone), everyone)
        async with AsyncAdmin(native_bootstrap(cluster)) as admin:
            after = await admin.list_group_offsets("fenced")
        assert all(after[tp].offset >= om.offset for tp, om in ahead.items()), (ahead, after)
        # Whatever the zombie did in between, nothing it committed was taken.
        assert all("while-paused" not in v for _, _, v in zombie.delivered) or all(
            "UnknownMemberId" in f or "IllegalGeneration" in f for f in zombie.commit_failures
        )
    finally:
        for m in everyone:
            if m.alive:
                m.proc.send_signal(signal.SIGCONT)
                m.kill()


async def test_a_paused_static_member_rejoins_when_resumed(cluster: Cluster) -> None:
    """A static member (group_instance_id) SIGSTOPped past its session is removed, and
    its instance id with it. Resumed, it is no longer a member: Kafka answers its
    heartbeat UNKNOWN_MEMBER_ID and it joins again under its instance id. The
    coordinator answered FENCED_INSTANCE_ID, as if another process held the instance
    id, which clients take as fatal: minibroker's consumer raised
    FencedInstanceIdError and exited (librdkafka and Java's raise a fatal error too)."""
    paused, other = await static_pair(cluster, "static-pause")
    everyone = [paused, other]
    try:
        wait_until("two members own six partitions", lambda: owned_exactly_once(everyone), everyone)
        paused.proc.send_signal(signal.SIGSTOP)
        wait_until("the other has everything", lambda: owned_exactly_once([other]), everyone)
        reported = paused.assignments
        paused.proc.send_signal(signal.SIGCONT)
        # Its own report after the pause (not the stale one from before it), 3 + 3.
        wait_until(
            "the resumed member has rejoined",
            lambda: paused.assignments > reported and owned_evenly(everyone),
            everyone,
        )
        assert paused.alive and other.alive
    finally:
        for m in everyone:
            if m.alive:
                m.proc.send_signal(signal.SIGCONT)
                m.kill()
