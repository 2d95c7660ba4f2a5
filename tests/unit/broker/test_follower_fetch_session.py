"""Incremental fetch sessions (KIP-227), the follower's side, with in-process
leaders (replication_harness): followers open a session, then name only what changed
and, idle, name nothing; replication, the high watermark and ISR changes work as
without sessions; a leader that lost the session (restart) or keeps none (sessions
off, or a leader that predates them) is followed all the same."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from replication_harness import LocalCluster

from broker.delayed_requests import mono_ms
from broker.follower_fetch_session import FollowerFetchSession
from protocol.invariants import InvariantError
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import Message
from protocol.metadata_records import PartitionRecord
from protocol.metadata_records import TopicRecord

TOPICS = ("a", "b", "c", "d")


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    c = LocalCluster(tmp_path)
    yield c
    await c.close()


def record_fetches(c: LocalCluster) -> list[tuple[int, int, FetchRequest]]:
    seen: list[tuple[int, int, FetchRequest]] = []

    async def hook(follower: int, leader: int, body: Message) -> None:
        if isinstance(body, FetchRequest):
            seen.append((follower, leader, body))

    c.on_request = hook
    return seen


def named(req: FetchRequest) -> set[str]:
    return {t.topic for t in req.topics if t.partitions}


async def create_topics(c: LocalCluster) -> None:
    for name in TOPICS:
        await c.create_topic(name, replicas=[1, 2, 3])


async def test_idle_followers_name_no_partition(cluster: LocalCluster) -> None:
    c = cluster
    await create_topics(c)
    seen = record_fetches(c)
    c.start()
    for name in TOPICS:
        await c.produce(1, b"x", topic=name)
    await c.wait_until(
        lambda: all(c.partition(n, t).high_watermark == 1 for n in (1, 2, 3) for t in TOPICS)
    )
    first = {f: req for f, _, req in seen}
    # Each follower's first fetch opened a session naming every partition.
    assert {f for f, _, req in seen if req.session_epoch == 0} == {2, 3}
    assert all(named(next(r for g, _, r in seen if g == f)) == set(TOPICS) for f in first)
    seen.clear()
    await c.wait_until(lambda: len(seen) >= 6, what="idle session fetches")
    for _, _, req in seen[-4:]:
        assert req.session_id != 0 and req.session_epoch > 0
        assert req.topics == [] and req.forgotten == []
    # One partition gets a record: only it is named again (its new position).
    seen.clear()
    await c.produce(1, b"y", topic="c")
    await c.wait_until(lambda: all(c.partition(n, "c").high_watermark == 2 for n in (1, 2, 3)))
    assert set().union(*(named(req) for _, _, req in seen)) == {"c"}


async def test_a_leader_that_lost_the_session_is_followed_again(cluster: LocalCluster) -> None:
    """The leader restarted (its sessions are gone): FETCH_SESSION_ID_NOT_FOUND, then a
    full fetch opens a new session and replication goes on."""
    c = cluster
    await create_topics(c)
    seen = record_fetches(c)
    c.start()
    await c.produce(1, b"x", topic="a")
    await c.wait_until(lambda: all(c.partition(n, "a").high_watermark == 1 for n in (1, 2, 3)))
    leader_sessions = c.brokers[1].rm.fetch_sessions
    old = set(leader_sessions.sessions)
    assert len(old) == 2
    leader_sessions.clear()
    seen.clear()
    r = await c.produce(1, b"y", topic="b")
    assert r.error_code == 0
    await c.wait_until(lambda: all(c.partition(n, "b").high_watermark == 1 for n in (2, 3)))
    assert len(leader_sessions) == 2 and not old & set(leader_sessions.sessions)
    assert any(req.session_epoch == 0 and named(req) == set(TOPICS) for _, _, req in seen)


async def test_a_leader_without_sessions_gets_full_fetches(tmp_path: Path) -> None:
    """Sessions off at the leader (max.incremental.fetch.session.cache.slots 0), which
    is what a leader that predates sessions looks like: every answer is sessionless,
    every fetch names every partition, and replication works."""
    c = LocalCluster(tmp_path, max_incremental_fetch_session_cache_slots=0)
    try:
        await create_topics(c)
        seen = record_fetches(c)
        c.start()
        await c.produce(1, b"x", topic="d")
        await c.wait_until(lambda: all(c.partition(n, "d").high_watermark == 1 for n in (2, 3)))
        await c.wait_until(lambda: len(seen) >= 6)
        assert all(named(req) == set(TOPICS) and req.session_epoch == 0 for _, _, req in seen)
    finally:
        await c.close()


async def test_an_out_of_sync_follower_rejoins_the_isr_while_idle(cluster: LocalCluster) -> None:
    """Kafka looks at every session partition on every fetch; ours looks only at
    marked ones, so a follower outside the ISR stays marked until it joins."""
    c = cluster
    await c.create_topic("t", replicas=[1, 2, 3], isr=[1, 2])
    c.start()
    leader = c.partition(1)
    # Nothing is produced: the only way in is the follower's idle session fetches.
    await c.wait_until(lambda: leader.isr == (1, 2, 3), timeout=5)


# ---------------------------------------------------------------------- the handler


def fp(index: int, offset: int) -> FetchPartition:
    return FetchPartition(partition=index, fetch_offset=offset)


def test_the_handler_sends_what_changed_and_what_left() -> None:
    s = FollowerFetchSession()
    for tp, position in {("t", 0): fp(0, 0), ("t", 1): fp(1, 0), ("u", 0): fp(0, 3)}.items():
        s.set(tp, position)
    full = s.request()
    assert full.full and full.session_id == 0
    assert sum(len(t.partitions) for t in full.topics) == 3
    assert s.answered(77) == s.wanted
    assert (s.session_id, s.epoch) == (77, 1)
    s.set(("t", 0), fp(0, 5))
    s.set(("t", 1), fp(1, 0))  # stated again, unchanged: not sent
    s.drop(("u", 0))
    step = s.request()
    assert (step.session_id, step.session_epoch) == (77, 1)
    assert [(t.topic, [p.partition for p in t.partitions]) for t in step.topics] == [("t", [0])]
    assert [(t.topic, t.partitions) for t in step.forgotten] == [("u", [0])]
    positions = s.answered(77)
    assert positions == {("t", 0): fp(0, 5), ("t", 1): fp(1, 0)}
    idle = s.request()
    assert idle.session_epoch == 2 and idle.topics == [] and idle.forgotten == []


def test_the_handler_starts_over_on_doubt() -> None:
    s = FollowerFetchSession()
    s.set(("t", 0), fp(0, 0))
    s.request()
    s.answered(9)
    s.set(("t", 0), fp(0, 1))
    s.request()
    s.reset()  # the request failed: the leader may or may not have it
    again = s.request()
    # Full, naming the old session so the leader closes it.
    assert again.full and again.session_id == 9 and len(again.topics[0].partitions) == 1
    s.answered(0)  # the leader keeps no session: stay full
    assert s.request().full


def test_an_answer_without_a_request_is_a_broken_invariant() -> None:
    with pytest.raises(InvariantError):
        FollowerFetchSession().answered(1)


async def test_idle_followers_stay_in_sync_when_writes_resume(cluster: LocalCluster) -> None:
    """Found at 10,000 partitions: a follower idle in a session was never looked at,
    so its last catch-up stayed where the partition last changed; the first write
    after more than replica.lag.time.max.ms of quiet made it "out of sync" at once,
    the ISR shrank to the leader, and the failover that followed had no one to elect.
    Kafka dates a caught-up follower's catch-up at every fetch; so do we (at the next
    change, from its session's latest fetch)."""
    c = cluster
    lag_ms = 400  # the harness's replica.lag.time.max.ms
    await c.create_topic("t", replicas=[1, 2, 3])
    c.start()
    await c.produce(1, b"x")
    leader = c.partition(1)
    await asyncio.sleep(3 * lag_ms / 1000)  # quiet, longer than the lag limit
    assert leader.isr == (1, 2, 3)
    # The followers will get the next record but cannot state their new position.
    blocked: set[int] = set()
    release = asyncio.Event()

    async def hold(follower: int, _leader: int, body: Message) -> None:
        if isinstance(body, FetchRequest) and body.topics:
            blocked.add(follower)
            await release.wait()

    c.on_request = hold
    try:
        assert (await c.produce(1, b"y", acks=1)).error_code == 0
        await c.wait_until(lambda: blocked == {2, 3}, what="followers holding the record")
        assert leader.out_of_sync_replicas(mono_ms(), lag_ms) == []
    finally:
        release.set()


async def test_a_partition_the_leader_did_not_have_yet_is_fetched_once_it_does(
    cluster: LocalCluster,
) -> None:
    """Found by the replication tests: a follower named a new partition before its
    leader knew it (UNKNOWN_TOPIC_OR_PARTITION), backed off and named it again at the
    same position, but the session thought the leader held it already, so it never
    sent it; the leader, which keeps no partition it does not know, never answered
    it, and the follower never fetched it (it left the ISR for good). An error answer
    now means "state it again"."""
    c = cluster
    c.start()
    # The followers' only partition (with others, a fetch goes out while it waits,
    # which happens to state it again): they learn of it first, the leader later.
    record = PartitionRecord(
        topic_id="late-id",
        partition_id=0,
        replicas=[1, 2, 3],
        isr=[1, 2, 3],
        leader=1,
        leader_epoch=0,
        partition_epoch=0,
    )
    c.partitions[("late", 0)] = record
    await c.publish(*c.registrations(), TopicRecord(name="late", topic_id="late-id", configs={}))
    for n in (2, 3):
        await c.brokers[n].apply(record)
    await c.wait_until(
        lambda: all(
            (s := c.brokers[n].rm.fetchers.state_of(("late", 0))) is not None and s.failures > 0
            for n in (2, 3)
        ),
        what="the followers told UNKNOWN_TOPIC_OR_PARTITION",
    )
    await c.brokers[1].apply(record)
    r = await c.produce(1, b"y", topic="late", timeout_ms=5000)
    assert r.error_code == 0  # acks=all: both followers fetched it
    assert c.partition(1, "late").isr == (1, 2, 3)
