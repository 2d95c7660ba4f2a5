"""Incremental fetch sessions (KIP-227), the leader's side, against a real
ReplicaManager over real logs: a full fetch opens a session and is answered in full;
later fetches name only what changed and are answered only with news; out-of-order
and foreign requests are refused with the session errors; the cache is bounded; a
peer that predates sessions is served as before, both ways on the wire.

The invariant: a follower in a session learns every change of its partitions (records,
high watermark, log start, errors) as it would without one, while an idle session
costs neither side a pass over its partitions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from broker_harness import Harness

from broker.fetch_sessions import FINAL_EPOCH
from broker.fetch_sessions import INITIAL_EPOCH
from protocol.connection import decode_body
from protocol.connection import encode_body
from protocol.errors import ErrorCode
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from protocol.messages import ForgottenTopic
from protocol.messages import Message
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceTopic
from protocol.record_batch import encode_batch

PARTITIONS = 4
FOLLOWER = 2


@pytest.fixture
async def leader(tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(tmp_path / "broker-1", 1)
    await h.create_topic("t", PARTITIONS, leader=1, replicas=[1, FOLLOWER])
    yield h
    await h.close()


def position(index: int, offset: int) -> FetchPartition:
    return FetchPartition(partition=index, current_leader_epoch=0, fetch_offset=offset)


def request(
    parts: list[FetchPartition],
    *,
    session_id: int = 0,
    epoch: int = INITIAL_EPOCH,
    forgotten: list[int] | None = None,
    replica_id: int = FOLLOWER,
    max_wait_ms: int = 0,
) -> FetchRequest:
    return FetchRequest(
        replica_id=replica_id,
        max_wait_ms=max_wait_ms,
        topics=[FetchTopic(topic="t", partitions=parts)] if parts else [],
        session_id=session_id,
        session_epoch=epoch,
        forgotten=[ForgottenTopic(topic="t", partitions=forgotten)] if forgotten else [],
    )


def answered(resp: FetchResponse) -> dict[int, int]:
    """Partition -> record bytes of each partition the answer names."""
    return {r.partition_index: len(r.records) for t in resp.responses for r in t.partitions}


async def produce(h: Harness, index: int, value: bytes = b"v") -> None:
    resp = await h.rm.produce(
        ProduceRequest(
            acks=1,
            timeout_ms=1000,
            topics=[
                ProduceTopic(
                    name="t",
                    partitions=[
                        ProducePartition(
                            index=index, records=encode_batch([(None, value, (), None)])
                        )
                    ],
                )
            ],
        )
    )
    assert resp.topics[0].partitions[0].error_code == ErrorCode.NONE


async def open_session(h: Harness) -> int:
    resp = await h.rm.fetch(request([position(i, 0) for i in range(PARTITIONS)]))
    assert resp.error_code == ErrorCode.NONE and resp.session_id != 0
    return resp.session_id


async def test_a_full_fetch_opens_a_session_and_is_answered_in_full(leader: Harness) -> None:
    resp = await leader.rm.fetch(request([position(i, 0) for i in range(PARTITIONS)]))
    assert resp.session_id != 0
    # Every partition is news the first time: the follower learns each high watermark.
    assert sorted(answered(resp)) == list(range(PARTITIONS))
    assert len(leader.rm.fetch_sessions) == 1


async def test_an_idle_session_fetch_names_nothing_and_gets_nothing(leader: Harness) -> None:
    sid = await open_session(leader)
    started = time.monotonic()
    resp = await leader.rm.fetch(request([], session_id=sid, epoch=1, max_wait_ms=100))
    assert resp.error_code == ErrorCode.NONE and resp.session_id == sid
    assert resp.responses == []
    assert time.monotonic() - started >= 0.09  # it long-polled, as a sessionless fetch does


async def test_an_append_wakes_the_session_with_only_that_partition(leader: Harness) -> None:
    sid = await open_session(leader)
    waiting = asyncio.create_task(
        leader.rm.fetch(request([], session_id=sid, epoch=1, max_wait_ms=5000))
    )
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await produce(leader, 2)
    resp = await asyncio.wait_for(waiting, 2)
    assert answered(resp) == {2: answered(resp)[2]} and answered(resp)[2] > 0
    # The follower states its new position; the leader's high watermark moves, which
    # is news, and the records are not sent again.
    resp = await leader.rm.fetch(request([position(2, 1)], session_id=sid, epoch=2))
    parts = [r for t in resp.responses for r in t.partitions]
    assert [(r.partition_index, r.high_watermark, len(r.records)) for r in parts] == [(2, 1, 0)]
    # Then nothing is news.
    resp = await leader.rm.fetch(request([], session_id=sid, epoch=3))
    assert resp.responses == []


async def test_a_moved_high_watermark_waits_for_records_as_a_delayed_fetch_does(
    leader: Harness,
) -> None:
    """Kafka's follower fetch completes on bytes (min_bytes 1) or an error, never on a
    high watermark alone: the follower's fetch that moves the high watermark would
    otherwise come straight back, a second round trip per acks=all write. The high
    watermark is not lost: it goes out with the next answer, records or max_wait."""
    sid = await open_session(leader)
    await produce(leader, 2)
    assert answered(await leader.rm.fetch(request([], session_id=sid, epoch=1)))[2] > 0
    # The follower states it has the record: the high watermark moves to 1 with this
    # very fetch, which waits anyway.
    waiting = asyncio.create_task(
        leader.rm.fetch(request([position(2, 1)], session_id=sid, epoch=2, max_wait_ms=5000))
    )
    await asyncio.sleep(0.2)
    assert not waiting.done(), "a high watermark alone answered the fetch"
    await produce(leader, 0)
    resp = await asyncio.wait_for(waiting, 2)
    parts = {
        r.partition_index: (r.high_watermark, len(r.records) > 0)
        for t in resp.responses
        for r in t.partitions
    }
    assert parts == {0: (0, True), 2: (1, False)}
    # Told once: the next answer names only partition 0 (its record again, as the
    # follower has not stated it has it).
    started = time.monotonic()
    resp = await leader.rm.fetch(request([], session_id=sid, epoch=3, max_wait_ms=100))
    assert sorted(answered(resp)) == [0]
    # With nothing else to say, the high watermark goes out at max_wait.
    resp = await leader.rm.fetch(
        request([position(0, 1)], session_id=sid, epoch=4, max_wait_ms=200)
    )
    assert time.monotonic() - started >= 0.19
    assert [
        (r.partition_index, r.high_watermark, len(r.records))
        for t in resp.responses
        for r in t.partitions
    ] == [(0, 1, 0)]


def count_session_passes(h: Harness, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list whose length is the number of passes over sessions the leader made."""
    passes: list[int] = []
    read_session = h.rm._read_session

    def counted(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        return read_session(*args, **kwargs)

    monkeypatch.setattr(h.rm, "_read_session", counted)
    return passes


async def test_a_moved_high_watermark_does_not_wake_a_waiting_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cost side of the rule above, with RF 3: each acks=all write moves the high
    watermark with the fetch of whichever follower states it has the records last,
    while the other follower's fetch waits. Waking that waiting fetch (and the one that
    moved it, which waits too) for a high watermark alone made a pass over its session
    that found nothing to send: two passes per write, a third of the leader's session
    work. Each waiting fetch is now looked at once when it arrives and once for the
    records that answer it; the high watermark goes out with them."""
    h = Harness(tmp_path / "broker-1", 1)
    try:
        await h.create_topic("t", 1, leader=1, replicas=[1, 2, 3])
        sessions = {}
        for follower in (2, 3):
            resp = await h.rm.fetch(request([position(0, 0)], replica_id=follower))
            sessions[follower] = resp.session_id
        await produce(h, 0)
        for follower in (2, 3):  # both fetch the record
            resp = await h.rm.fetch(
                request([], session_id=sessions[follower], epoch=1, replica_id=follower)
            )
            assert answered(resp) == {0: answered(resp)[0]} and answered(resp)[0] > 0
        passes = count_session_passes(h, monkeypatch)

        def waiting_fetch(follower: int) -> asyncio.Task[FetchResponse]:
            return asyncio.create_task(
                h.rm.fetch(
                    request(
                        [position(0, 1)],
                        session_id=sessions[follower],
                        epoch=2,
                        replica_id=follower,
                        max_wait_ms=5000,
                    )
                )
            )

        first = waiting_fetch(2)  # follower 2 has the record: the HW waits for 3
        await asyncio.sleep(0.1)
        assert len(passes) == 1
        second = waiting_fetch(3)  # follower 3 has it: the high watermark moves to 1
        await asyncio.sleep(0.2)
        assert h.rm.partitions[("t", 0)].high_watermark == 1
        assert not first.done() and not second.done()
        assert len(passes) == 2, f"{len(passes) - 2} pass(es) woken by the high watermark"
        await produce(h, 0)  # records: both waiting fetches answer, with the HW
        for task in (first, second):
            resp = await asyncio.wait_for(task, 2)
            (r,) = [r for t in resp.responses for r in t.partitions]
            assert r.high_watermark == 1 and len(r.records) > 0
        assert len(passes) == 4
    finally:
        await h.close()


async def test_records_are_sent_again_until_the_follower_states_it_has_them(
    leader: Harness,
) -> None:
    """A follower that could not append (its request names no new position) is not
    left behind: the partition stays marked while the follower is behind."""
    sid = await open_session(leader)
    await produce(leader, 1)
    first = await leader.rm.fetch(request([], session_id=sid, epoch=1))
    assert answered(first)[1] > 0
    again = await leader.rm.fetch(request([], session_id=sid, epoch=2))
    assert answered(again) == answered(first)


async def test_a_forgotten_partition_is_no_longer_answered(leader: Harness) -> None:
    sid = await open_session(leader)
    resp = await leader.rm.fetch(request([], session_id=sid, epoch=1, forgotten=[3]))
    assert resp.responses == []
    await produce(leader, 3)
    resp = await leader.rm.fetch(request([], session_id=sid, epoch=2))
    assert resp.responses == []
    # Stated again, it is back in the session.
    resp = await leader.rm.fetch(request([position(3, 0)], session_id=sid, epoch=3))
    assert answered(resp)[3] > 0


async def test_a_leadership_change_is_news(leader: Harness) -> None:
    sid = await open_session(leader)
    await leader.set_partition("t", 0, leader=3, leader_epoch=1, replicas=[1, 2, 3])
    resp = await leader.rm.fetch(request([], session_id=sid, epoch=1))
    (part,) = [r for t in resp.responses for r in t.partitions]
    # The follower's stated epoch is the old one: fenced, and told who leads now.
    assert part.partition_index == 0
    assert part.error_code == ErrorCode.FENCED_LEADER_EPOCH
    assert part.current_leader.leader_id == 3


@pytest.mark.parametrize("epoch", [2, 7, -2])
async def test_an_out_of_order_epoch_is_refused(leader: Harness, epoch: int) -> None:
    sid = await open_session(leader)
    resp = await leader.rm.fetch(request([], session_id=sid, epoch=epoch))
    assert resp.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert resp.responses == []


async def test_a_session_is_only_its_followers(leader: Harness) -> None:
    """A peer that names another follower's session (or one that does not exist) is
    refused, and cannot close it."""
    sid = await open_session(leader)
    resp = await leader.rm.fetch(request([], session_id=sid, epoch=1, replica_id=3))
    assert resp.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    resp = await leader.rm.fetch(request([], session_id=sid + 1, epoch=1))
    assert resp.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    await leader.rm.fetch(request([], session_id=sid, epoch=FINAL_EPOCH, replica_id=3))
    resp = await leader.rm.fetch(request([], session_id=sid, epoch=1))
    assert resp.error_code == ErrorCode.NONE and resp.session_id == sid


async def test_a_session_keeps_only_partitions_this_broker_has(leader: Harness) -> None:
    """A peer that names partitions that are not here gets their error once; the
    session does not grow with them (it holds at most this broker's partitions)."""
    sid = await open_session(leader)
    bogus = [position(i, 0) for i in range(PARTITIONS, PARTITIONS + 1000)]
    resp = await leader.rm.fetch(request(bogus, session_id=sid, epoch=1))
    codes = {r.error_code for t in resp.responses for r in t.partitions}
    assert len(answered(resp)) == 1000 and codes == {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    (session,) = leader.rm.fetch_sessions.sessions.values()
    assert len(session.partitions) == PARTITIONS
    resp = await leader.rm.fetch(request([], session_id=sid, epoch=2))
    assert resp.responses == []


async def test_a_new_session_of_a_follower_replaces_its_old_one(leader: Harness) -> None:
    first = await open_session(leader)
    second = await open_session(leader)
    assert second != first and len(leader.rm.fetch_sessions) == 1
    resp = await leader.rm.fetch(request([], session_id=first, epoch=1))
    assert resp.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


async def test_closing_a_session_serves_the_fetch_sessionless(leader: Harness) -> None:
    sid = await open_session(leader)
    resp = await leader.rm.fetch(
        request([position(0, 0)], session_id=sid, epoch=FINAL_EPOCH, max_wait_ms=0)
    )
    assert resp.session_id == 0 and sorted(answered(resp)) == [0]
    assert len(leader.rm.fetch_sessions) == 0


async def test_a_full_cache_serves_sessionless(tmp_path: Path) -> None:
    h = Harness(tmp_path / "b1", 1, max_incremental_fetch_session_cache_slots=1)
    try:
        await h.create_topic("t", 2, leader=1, replicas=[1, 2, 3])
        parts = [position(0, 0), position(1, 0)]
        assert (await h.rm.fetch(request(parts, replica_id=2))).session_id != 0
        # Broker 3 finds no free slot (the other session is in recent use): it is
        # served in full, without a session, and may try again later.
        resp = await h.rm.fetch(request(parts, replica_id=3))
        assert resp.session_id == 0 and sorted(answered(resp)) == [0, 1]
    finally:
        await h.close()


async def test_sessions_turned_off(tmp_path: Path) -> None:
    h = Harness(tmp_path / "b1", 1, max_incremental_fetch_session_cache_slots=0)
    try:
        await h.create_topic("t", 1, leader=1, replicas=[1, 2])
        resp = await h.rm.fetch(request([position(0, 0)]))
        assert resp.session_id == 0 and sorted(answered(resp)) == [0]
    finally:
        await h.close()


async def test_an_idle_session_makes_room_after_the_eviction_time(tmp_path: Path) -> None:
    h = Harness(
        tmp_path / "b1",
        1,
        max_incremental_fetch_session_cache_slots=1,
        min_incremental_fetch_session_eviction_ms=50,
    )
    try:
        await h.create_topic("t", 1, leader=1, replicas=[1, 2, 3])
        old = (await h.rm.fetch(request([position(0, 0)], replica_id=2))).session_id
        await asyncio.sleep(0.1)
        assert (await h.rm.fetch(request([position(0, 0)], replica_id=3))).session_id != 0
        resp = await h.rm.fetch(request([], session_id=old, epoch=1, replica_id=2))
        assert resp.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    finally:
        await h.close()


# ---------------------------------------------------------------------- the wire


class FetchRequestBeforeSessions(Message, kw_only=True):
    """The native FetchRequest as peers that predate sessions encode and decode it."""

    replica_id: int = -1
    replica_epoch: int = -1
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 50 * 1024 * 1024
    isolation_level: int = 0
    topics: list[FetchTopic]


class FetchResponseBeforeSessions(Message, kw_only=True):
    error_code: int = 0
    throttle_time_ms: int = 0
    responses: list[msgspec.Raw] = []


async def test_a_follower_that_predates_sessions_is_served_in_full(leader: Harness) -> None:
    old = FetchRequestBeforeSessions(
        replica_id=FOLLOWER,
        max_wait_ms=0,
        topics=[FetchTopic(topic="t", partitions=[position(i, 0) for i in range(PARTITIONS)])],
    )
    decoded = decode_body(FetchRequest, encode_body(old))
    assert isinstance(decoded, FetchRequest)
    assert (decoded.session_id, decoded.session_epoch, decoded.forgotten) == (0, FINAL_EPOCH, [])
    for _ in range(2):  # every time, news or not
        resp = await leader.rm.fetch(decoded)
        assert resp.session_id == 0 and sorted(answered(resp)) == list(range(PARTITIONS))
    assert len(leader.rm.fetch_sessions) == 0


def test_a_leader_that_predates_sessions_reads_a_session_request_as_a_full_fetch() -> None:
    new = request([position(0, 5)], session_id=42, epoch=3, forgotten=[1])
    old = msgspec.msgpack.Decoder(FetchRequestBeforeSessions).decode(encode_body(new))
    assert old.replica_id == FOLLOWER and old.topics == new.topics
    # ... and its answer, which has no session id, reads as sessionless.
    answer = msgspec.msgpack.encode(FetchResponseBeforeSessions())
    decoded = decode_body(FetchResponse, answer)
    assert isinstance(decoded, FetchResponse) and decoded.session_id == 0
