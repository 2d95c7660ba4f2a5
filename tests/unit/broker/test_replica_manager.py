"""ReplicaManager over a real storage engine: the leader-side rules of CONTRACT.md."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import crc32c
import pytest
from broker_harness import Harness
from broker_harness import batch
from broker_harness import partition_record

from broker.partition import Role
from broker.server import full_delta
from protocol.api import EARLIEST_TIMESTAMP
from protocol.api import LATEST_TIMESTAMP
from protocol.errors import ErrorCode
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import MetadataEntry
from protocol.messages import ProduceRequest
from protocol.metadata_records import RemoveTopicRecord
from protocol.metadata_records import TopicRecord
from protocol.record_batch import iter_headers
from protocol.record_batch import iter_records
from tests.one_partition import fetch_request
from tests.one_partition import list_offsets_request
from tests.one_partition import offsets_for_epoch_request
from tests.one_partition import produce_request


def produce_req(topic: str, records: bytes, **kw: Any) -> ProduceRequest:
    """acks=1 and a 1 s timeout unless the test says otherwise."""
    return produce_request(topic, records, **{"acks": 1, "timeout_ms": 1000, **kw})


async def produce(h: Harness, topic: str, records: bytes, **kw: object):
    resp = await h.rm.produce(produce_req(topic, records, **kw))
    return resp.topics[0].partitions[0]


def fetch_req(topic: str, offset: int, **kw: Any) -> FetchRequest:
    """No long-poll and a 1 MiB cap unless the test says otherwise."""
    return fetch_request(topic, offset, **{"max_wait_ms": 0, "max_bytes": 1 << 20, **kw})


async def fetch(h: Harness, topic: str, offset: int, **kw: object):
    resp = await h.rm.fetch(fetch_req(topic, offset, **kw))
    return resp.responses[0].partitions[0]


def list_offsets(h: Harness, topic: str, ts: int, *, epoch: int = -1, replica_id: int = -1):
    resp = h.rm.list_offsets(list_offsets_request(topic, ts, epoch=epoch, replica_id=replica_id))
    return resp.topics[0].partitions[0]


def ofle(h: Harness, topic: str, leader_epoch: int, *, epoch: int = -1):
    request = offsets_for_epoch_request(topic, leader_epoch, epoch=epoch)
    return h.rm.offsets_for_leader_epoch(request).topics[0].partitions[0]


async def test_produce_then_fetch_stamps_offsets_and_epoch(harness: Harness) -> None:
    h = harness
    await h.create_topic("t")
    await h.set_partition("t", 0, leader=1, leader_epoch=3)
    r1 = await produce(h, "t", batch(b"a", b"b"))
    r2 = await produce(h, "t", batch(b"c"), epoch=3)
    assert (r1.error_code, r1.base_offset, r2.base_offset) == (0, 0, 2)
    assert r1.current_leader.leader_id == 1 and r1.current_leader.leader_epoch == 3
    f = await fetch(h, "t", 0)
    assert f.error_code == 0 and f.high_watermark == 3 and f.log_start_offset == 0
    headers = [hd for _, hd in iter_headers(f.records)]
    assert [(hd.base_offset, hd.partition_leader_epoch) for hd in headers] == [(0, 3), (2, 3)]
    values = [rec.value for _, rec in iter_records(f.records)]
    assert values == [b"a", b"b", b"c"]
    # Epoch 0 wrote nothing, so its entry gave way to epoch 3 at the same offset.
    assert h.rm.partitions[("t", 0)].log.epoch_cache.entries == [(3, 0)]


@pytest.mark.parametrize(
    ("client_epoch", "expected"),
    [
        (-1, ErrorCode.NONE),
        (2, ErrorCode.NONE),
        (1, ErrorCode.FENCED_LEADER_EPOCH),
        (3, ErrorCode.UNKNOWN_LEADER_EPOCH),
    ],
)
async def test_current_leader_epoch_checks(harness: Harness, client_epoch: int, expected) -> None:
    h = harness
    await h.create_topic("t")
    await h.set_partition("t", 0, leader=1, leader_epoch=2)
    await produce(h, "t", batch(b"x"))
    assert (await produce(h, "t", batch(b"y"), epoch=client_epoch)).error_code == expected
    assert (await fetch(h, "t", 0, epoch=client_epoch)).error_code == expected
    assert list_offsets(h, "t", LATEST_TIMESTAMP, epoch=client_epoch).error_code == expected
    assert ofle(h, "t", 2, epoch=client_epoch).error_code == expected


async def test_not_leader_unknown_and_follower(harness: Harness) -> None:
    h = harness
    r = await produce(h, "nope", batch(b"x"))
    assert r.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    await h.create_topic("elsewhere", leader=2, replicas=[2])
    r = await produce(h, "elsewhere", batch(b"x"))
    assert r.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert (r.current_leader.leader_id, r.current_leader.leader_epoch) == (2, 0)
    assert ("elsewhere", 0) not in h.rm.partitions
    await h.create_topic("f", leader=2, replicas=[2, 1])
    assert h.rm.partitions[("f", 0)].role is Role.FOLLOWER
    assert (await produce(h, "f", batch(b"x"))).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert (await fetch(h, "f", 0)).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    # A client that already knows a newer epoch than this replica: UNKNOWN, not NOT_LEADER.
    assert (await fetch(h, "f", 0, epoch=5)).error_code == ErrorCode.UNKNOWN_LEADER_EPOCH
    await h.create_topic("off", leader=-1, replicas=[1])
    assert h.rm.partitions[("off", 0)].role is Role.OFFLINE
    assert (await produce(h, "off", batch(b"x"))).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER


async def test_produce_validation(harness: Harness) -> None:
    h = harness
    await h.create_topic("t", configs={"max.message.bytes": "200"})
    bad = bytearray(batch(b"hello"))
    bad[-1] ^= 0xFF
    r = await produce(h, "t", bytes(bad))
    assert r.error_code == ErrorCode.CORRUPT_MESSAGE and "CRC" in r.error_message
    r = await produce(h, "t", b"\x00" * 10)
    assert r.error_code == ErrorCode.CORRUPT_MESSAGE and r.error_message
    r = await produce(h, "t", batch(b"x" * 500))
    assert r.error_code == ErrorCode.MESSAGE_TOO_LARGE and "max.message.bytes" in r.error_message
    r = await produce(h, "t", batch(b"ok"), acks=2)
    assert r.error_code == ErrorCode.INVALID_REQUIRED_ACKS
    assert h.rm.partitions[("t", 0)].log_end_offset == 0  # nothing was appended
    r = await produce(h, "t", batch(b"ok"), acks=0)
    assert r.error_code == 0 and r.base_offset == 0


async def test_a_record_set_with_one_unreadable_batch_is_refused_whole(harness: Harness) -> None:
    """Kafka's LogValidator: a batch whose records no reader could read (here its
    record count disagrees with its last offset delta, under a valid CRC) is answered
    INVALID_RECORD naming the batch; the partition's other batches in the same request
    are not appended either."""
    h = harness
    await h.create_topic("t")
    good = batch(b"a", b"b")
    bad = bytearray(batch(b"c", b"d", b"e"))
    struct.pack_into(">i", bad, 57, 2)  # record_count 2, last_offset_delta 2
    bad[17:21] = crc32c.crc32c(bytes(bad[21:])).to_bytes(4, "big")
    r = await produce(h, "t", good + bytes(bad))
    assert r.error_code == ErrorCode.INVALID_RECORD
    assert r.error_message.startswith(f"batch at byte {len(good)}: 2 records")
    assert h.rm.partitions[("t", 0)].log_end_offset == 0  # nothing was appended
    assert (await produce(h, "t", good)).base_offset == 0


async def test_acks_all(harness: Harness) -> None:
    h = harness
    await h.create_topic("one")
    r = await produce(h, "one", batch(b"x"), acks=-1)
    assert r.error_code == 0 and r.base_offset == 0
    # ISR with a follower that never fetches: the HW cannot pass the batch.
    await h.create_topic("two", replicas=[1, 2])
    start = time.monotonic()
    r = await produce(h, "two", batch(b"x"), acks=-1, timeout_ms=100)
    assert r.error_code == ErrorCode.REQUEST_TIMED_OUT
    assert time.monotonic() - start < 2
    # min.insync.replicas larger than the ISR: refused before appending.
    await h.create_topic("strict", replicas=[1], configs={"min.insync.replicas": "2"})
    r = await produce(h, "strict", batch(b"x"), acks=-1)
    assert r.error_code == ErrorCode.NOT_ENOUGH_REPLICAS
    assert (await produce(h, "strict", batch(b"x"), acks=1)).error_code == 0


async def test_acks_all_completes_when_the_follower_catches_up(harness: Harness) -> None:
    h = harness
    await h.create_topic("two", replicas=[1, 2])
    task = asyncio.create_task(produce(h, "two", batch(b"x"), acks=-1, timeout_ms=5000))
    await asyncio.sleep(0.05)
    assert not task.done()
    # The follower fetches past the batch: HW moves, the produce completes.
    f = await fetch(h, "two", 1, replica_id=2)
    assert f.error_code == 0 and f.high_watermark == 1
    r = await asyncio.wait_for(task, 2)
    assert r.error_code == 0


async def assert_answered_when_leadership_moves(
    h: Harness, topic: str, waiting: Coroutine[Any, Any, Any]
) -> None:
    """`waiting` (a request the broker holds: acks=all, a long poll) is answered
    NOT_LEADER_OR_FOLLOWER naming broker 2 once broker 2 leads `topic`-0."""
    task = asyncio.create_task(waiting)
    await asyncio.sleep(0.05)
    await h.set_partition(topic, 0, leader=2, leader_epoch=1, replicas=[1, 2])
    r = await asyncio.wait_for(task, 2)
    assert r.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert r.current_leader.leader_id == 2


async def test_acks_all_fails_when_leadership_moves(harness: Harness) -> None:
    h = harness
    await h.create_topic("two", replicas=[1, 2])
    waiting = produce(h, "two", batch(b"x"), acks=-1, timeout_ms=5000)
    await assert_answered_when_leadership_moves(h, "two", waiting)


async def test_consumers_read_below_the_high_watermark(harness: Harness) -> None:
    h = harness
    await h.create_topic("two", replicas=[1, 2])
    await produce(h, "two", batch(b"a"), acks=1)
    await produce(h, "two", batch(b"b"), acks=1)
    f = await fetch(h, "two", 0)
    assert f.high_watermark == 0 and f.records == b""
    f = await fetch(h, "two", 0, replica_id=2)  # followers read to the LEO
    assert len(list(iter_headers(f.records))) == 2
    await fetch(h, "two", 1, replica_id=2)  # the follower holds offset 0 now
    f = await fetch(h, "two", 0)
    assert f.high_watermark == 1
    assert [hd.base_offset for _, hd in iter_headers(f.records)] == [0]
    assert list_offsets(h, "two", LATEST_TIMESTAMP).offset == 1


async def test_fetch_long_poll_wakes_on_append(harness: Harness) -> None:
    h = harness
    await h.create_topic("t")
    start = time.monotonic()
    task = asyncio.create_task(fetch(h, "t", 0, max_wait_ms=5000))
    await asyncio.sleep(0.05)
    assert not task.done()
    await produce(h, "t", batch(b"late"))
    f = await asyncio.wait_for(task, 2)
    assert [rec.value for _, rec in iter_records(f.records)] == [b"late"]
    assert time.monotonic() - start < 2
    # Nothing arrives: the wait ends at max_wait_ms with no records.
    start = time.monotonic()
    f = await fetch(h, "t", 1, max_wait_ms=100)
    assert f.error_code == 0 and f.records == b""
    assert 0.09 < time.monotonic() - start < 2


async def test_fetch_long_poll_min_bytes(harness: Harness) -> None:
    h = harness
    await h.create_topic("t")
    task = asyncio.create_task(fetch(h, "t", 0, max_wait_ms=5000, min_bytes=500))
    await produce(h, "t", batch(b"x"))  # ~70 bytes: not enough
    await asyncio.sleep(0.05)
    assert not task.done()
    await produce(h, "t", batch(b"y" * 600))
    f = await asyncio.wait_for(task, 2)
    assert len(list(iter_headers(f.records))) == 2


async def test_fetch_long_poll_answers_on_leadership_change(harness: Harness) -> None:
    h = harness
    await h.create_topic("t")
    await assert_answered_when_leadership_moves(h, "t", fetch(h, "t", 0, max_wait_ms=5000))


async def test_fetch_size_limits_keep_one_whole_batch(harness: Harness) -> None:
    h = harness
    await h.create_topic("t", partitions=2)
    for i in range(3):
        for index in (0, 1):
            await h.rm.produce(produce_req("t", batch(bytes([65 + i]) * 100), index=index))
    req = fetch_req("t", 0, partition_max_bytes=10, max_bytes=10)
    req.topics[0].partitions.append(
        FetchPartition(partition=1, fetch_offset=0, partition_max_bytes=10)
    )
    resp = await h.rm.fetch(req)
    p0, p1 = resp.responses[0].partitions
    assert len(list(iter_headers(p0.records))) == 1  # over the limit, but one batch
    assert p1.records == b"" and p1.error_code == 0 and p1.high_watermark == 3
    one = len(p0.records)
    req = fetch_req("t", 0, max_bytes=one * 2 + 1)
    req.topics[0].partitions.append(FetchPartition(partition=1, fetch_offset=0))
    resp = await h.rm.fetch(req)
    p0, p1 = resp.responses[0].partitions
    assert len(p0.records) + len(p1.records) <= one * 2 + 1
    assert len(list(iter_headers(p0.records))) == 2


async def test_fetch_is_capped_by_fetch_max_bytes_and_the_follower_cap(tmp_path: Path) -> None:
    """Whatever max_bytes a fetch asks for, a consumer gets at most fetch.max.bytes and a
    follower at most replica.fetch.response.max.bytes (one whole batch at least); what
    the connection reserves for it (fetch_reservation) is that same cap."""
    h = Harness(tmp_path / "b", fetch_max_bytes=350, replica_fetch_response_max_bytes=700)
    try:
        await h.create_topic("two", replicas=[1, 2])
        for i in range(10):
            await produce(h, "two", batch(bytes([65 + i]) * 100))
        one = len(batch(b"A" * 100))
        huge = {"max_bytes": 2**31 - 1, "partition_max_bytes": 2**31 - 1}
        follower = await fetch(h, "two", 0, replica_id=2, **huge)
        assert len(follower.records) <= 700 and len(follower.records) // one == 700 // one
        await fetch(h, "two", 10, replica_id=2)  # the HW reaches 10
        consumer = await fetch(h, "two", 0, **huge)
        assert len(consumer.records) <= 350 and len(consumer.records) // one == 350 // one
        assert h.rm.fetch_reservation(fetch_req("two", 0, **huge)) == 350
        assert h.rm.fetch_reservation(fetch_req("two", 0, replica_id=2, **huge)) == 700
        assert h.rm.fetch_reservation(fetch_req("two", 0, max_bytes=100)) == 100
        assert h.rm.fetch_reservation(produce_req("two", batch(b"x"))) == 0
        # Over the cap, the first batch still comes whole (KIP-74).
        big = await produce(h, "two", batch(b"z" * 1000))
        await fetch(h, "two", 11, replica_id=2)
        first = await fetch(h, "two", big.base_offset, **huge)
        assert [hd.base_offset for _, hd in iter_headers(first.records)] == [big.base_offset]
    finally:
        await h.close()


async def test_fetch_out_of_range(harness: Harness) -> None:
    h = harness
    await h.create_topic("t")
    await produce(h, "t", batch(b"a"))
    assert (await fetch(h, "t", 1)).error_code == 0  # the LEO itself is fine
    f = await fetch(h, "t", 2)
    assert f.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert (f.high_watermark, f.log_start_offset) == (1, 0)
    assert (await fetch(h, "t", -1)).error_code == ErrorCode.OFFSET_OUT_OF_RANGE


async def test_diverging_epoch(harness: Harness) -> None:
    h = harness
    await h.create_topic("t")  # epoch 0
    await produce(h, "t", batch(b"a", b"b"))  # offsets 0-1 in epoch 0
    await h.set_partition("t", 0, leader=1, leader_epoch=2)
    await produce(h, "t", batch(b"c"))  # offset 2 in epoch 2
    # A fetcher that read epoch 1 up to offset 3 (a divergent lineage).
    f = await fetch(h, "t", 3, last_epoch=1)
    assert (f.diverging_epoch.epoch, f.diverging_epoch.end_offset) == (0, 2)
    assert f.records == b""
    # Same epoch but past its end.
    f = await fetch(h, "t", 3, last_epoch=0)
    assert (f.diverging_epoch.epoch, f.diverging_epoch.end_offset) == (0, 2)
    # Consistent: no divergence.
    f = await fetch(h, "t", 2, last_epoch=0)
    assert f.diverging_epoch.epoch == -1 and f.records
    f = await fetch(h, "t", 3, last_epoch=2)
    assert f.diverging_epoch.epoch == -1 and f.error_code == 0


async def test_list_offsets_and_offsets_for_leader_epoch(harness: Harness) -> None:
    h = harness
    await h.create_topic("t")
    await produce(h, "t", batch(b"a", timestamp=1000))
    await produce(h, "t", batch(b"b", timestamp=2000))
    await h.set_partition("t", 0, leader=1, leader_epoch=4)
    await produce(h, "t", batch(b"c", timestamp=3000))
    earliest = list_offsets(h, "t", EARLIEST_TIMESTAMP)
    assert (earliest.offset, earliest.leader_epoch) == (0, 0)
    latest = list_offsets(h, "t", LATEST_TIMESTAMP, epoch=4)
    assert (latest.offset, latest.leader_epoch) == (3, 4)
    by_ts = list_offsets(h, "t", 1500)
    assert (by_ts.offset, by_ts.timestamp, by_ts.leader_epoch) == (1, 2000, 0)
    by_ts = list_offsets(h, "t", 2500)
    assert (by_ts.offset, by_ts.timestamp, by_ts.leader_epoch) == (2, 3000, 4)
    assert list_offsets(h, "t", 99_999).offset == -1
    assert list_offsets(h, "t", -7).error_code == ErrorCode.INVALID_REQUEST
    r = ofle(h, "t", 0, epoch=4)
    assert (r.error_code, r.leader_epoch, r.end_offset) == (0, 0, 2)
    r = ofle(h, "t", 4)
    assert (r.leader_epoch, r.end_offset) == (4, 3)
    r = ofle(h, "t", 2)  # unknown epoch between: the largest known below it
    assert (r.leader_epoch, r.end_offset) == (0, 2)


async def test_new_leader_with_lagging_high_watermark_has_no_latest_offset(
    harness: Harness,
) -> None:
    """KIP-207: a leader whose HW has not reached the start of its epoch answers a
    consumer's "latest" (and a timestamp at or past its HW) with OFFSET_NOT_AVAILABLE,
    never with an offset below what its predecessor acknowledged; earliest is served,
    followers get the LEO; once the follower fetched in the new epoch all is served."""
    h = harness
    await h.create_topic("two", replicas=[1, 2])
    for ts, value in ((1000, b"a"), (2000, b"b"), (3000, b"c")):
        await produce(h, "two", batch(value, timestamp=ts), acks=1)
    await fetch(h, "two", 0, replica_id=2)
    await fetch(h, "two", 1, replica_id=2)  # the follower holds offset 0: HW 1
    assert list_offsets(h, "two", LATEST_TIMESTAMP).offset == 1
    # A new epoch at LEO 3 with the HW still at 1: the follower's end is unknown.
    await h.set_partition("two", 0, leader=1, leader_epoch=1, replicas=[1, 2])
    p = h.rm.partitions[("two", 0)]
    assert (p.leader_epoch_start_offset, p.high_watermark) == (3, 1)
    latest = list_offsets(h, "two", LATEST_TIMESTAMP, epoch=1)
    assert latest.error_code == ErrorCode.OFFSET_NOT_AVAILABLE
    assert list_offsets(h, "two", 2500).error_code == ErrorCode.OFFSET_NOT_AVAILABLE
    assert list_offsets(h, "two", 99_999).error_code == ErrorCode.OFFSET_NOT_AVAILABLE
    below = list_offsets(h, "two", 500)  # offset 0, below the HW: known
    assert (below.error_code, below.offset) == (0, 0)
    earliest = list_offsets(h, "two", EARLIEST_TIMESTAMP)
    assert (earliest.error_code, earliest.offset) == (0, 0)
    follower = list_offsets(h, "two", LATEST_TIMESTAMP, replica_id=2)
    assert (follower.error_code, follower.offset) == (0, 3)
    # The follower fetches in the new epoch with everything: HW 3, latest served.
    await fetch(h, "two", 3, replica_id=2, epoch=1)
    latest = list_offsets(h, "two", LATEST_TIMESTAMP, epoch=1)
    assert (latest.error_code, latest.offset, latest.leader_epoch) == (0, 3, 1)


async def test_leader_epoch_checkpoint_lists_each_term(harness: Harness) -> None:
    h = harness
    await h.create_topic("t")
    await produce(h, "t", batch(b"a"))
    await h.set_partition("t", 0, leader=1, leader_epoch=1)
    # The same epoch again (an ISR change only) adds nothing.
    await h.set_partition("t", 0, leader=1, leader_epoch=1, partition_epoch=2)
    await produce(h, "t", batch(b"b"))
    path = h.rm.partitions[("t", 0)].log.dir / "leader-epoch-checkpoint"
    assert path.read_text() == "0\n2\n0 0\n1 1\n"


async def test_delete_topic_and_recreate(harness: Harness) -> None:
    h = harness
    await h.create_topic("t")
    await produce(h, "t", batch(b"old"))
    log_dir = h.rm.partitions[("t", 0)].log.dir
    await h.delete_topic("t")
    assert ("t", 0) not in h.rm.partitions
    assert not log_dir.exists()
    await h.create_topic("t", topic_id="new-id")
    assert h.rm.partitions[("t", 0)].log_end_offset == 0
    assert (await produce(h, "t", batch(b"new"))).base_offset == 0


async def test_unassigned_logs_are_set_aside_as_stray_not_deleted(harness: Harness) -> None:
    """Nothing is deleted on an inference: local logs the metadata does not assign
    here are renamed `<dir>.<uuid>-stray` with their data, and reported."""
    h = harness
    gone = h.log_manager.get_or_create_log(("gone", 0))
    gone.append_as_leader(batch(b"keep me"), leader_epoch=0)
    h.log_manager.get_or_create_log(("gone", 1))
    await h.create_topic("kept")
    await h.rm.handle_unassigned_logs()
    assert sorted(lg.topic_partition for lg in h.log_manager.all_logs()) == [("kept", 0)]
    assert not (h.config.data_dir / "gone-0").exists()
    strays = h.log_manager.stray_logs()
    assert sorted((s.topic, s.partition) for s in strays) == [("gone", 0), ("gone", 1)]
    for stray in strays:
        assert stray.path.name.startswith(f"gone-{stray.partition}.")
        assert stray.path.name.endswith("-stray") and stray.path.is_dir()
    kept = next(s for s in strays if s.partition == 0)
    assert any(f.suffix == ".log" and f.stat().st_size > 0 for f in kept.path.iterdir())
    assert kept.size_bytes() > 0


async def test_a_topic_deleted_while_down_is_deleted_at_start_up(tmp_path: Path) -> None:
    """The broker replays the metadata log at start-up: a RemoveTopicRecord naming the
    local replica's topic id (seen in that replay) deletes it; a re-created topic of
    the same name starts empty, without the old data."""
    h = Harness(tmp_path / "b")
    await h.create_topic("t", topic_id="old-id")
    await produce(h, "t", batch(b"old"))
    await h.create_topic("u", topic_id="u-id")
    await h.close()
    h2 = Harness(tmp_path / "b")  # restarted: replays the log, publishes at the end
    h2._topic_ids["t"] = "old-id"
    h2.image.apply(
        [
            MetadataEntry(offset=0, record=TopicRecord(name="t", topic_id="old-id")),
            MetadataEntry(offset=1, record=RemoveTopicRecord(topic_id="old-id")),
            MetadataEntry(offset=2, record=TopicRecord(name="t", topic_id="new-id")),
            MetadataEntry(offset=3, record=partition_record("new-id", replicas=[1], leader=1)),
        ]
    )
    await h2.rm.apply_delta(full_delta(h2.image))
    await h2.rm.handle_unassigned_logs()
    p = h2.rm.partitions[("t", 0)]
    assert p.topic_id == "new-id" and p.log_end_offset == 0
    assert p.log.topic_id == "new-id"
    # "u" was never deleted by a record: set aside, not deleted.
    assert [(s.topic, s.topic_id) for s in h2.log_manager.stray_logs()] == [("u", "u-id")]
    await h2.close()


async def test_a_replica_of_an_unknown_older_topic_id_is_set_aside(harness: Harness) -> None:
    """Same name, new topic id, no RemoveTopicRecord seen for the old id (e.g. a
    snapshot): the old replica is renamed aside, the new topic starts empty."""
    h = harness
    await h.create_topic("t", topic_id="old-id")
    await produce(h, "t", batch(b"old"))
    snapshot = [
        MetadataEntry(offset=9, record=TopicRecord(name="t", topic_id="new-id")),
        MetadataEntry(offset=9, record=partition_record("new-id", replicas=[1], leader=1)),
    ]
    await h.rm.apply_delta(h.image.apply(snapshot, is_snapshot=True, next_offset=10))
    assert h.rm.partitions[("t", 0)].log_end_offset == 0
    assert [(s.topic, s.topic_id) for s in h.log_manager.stray_logs()] == [("t", "old-id")]


async def test_a_log_without_a_topic_id_is_adopted_when_assigned(tmp_path: Path) -> None:
    """Upgrade path: a directory written before partition.metadata existed keeps
    serving when the metadata assigns that partition here, and gets the file."""
    h = Harness(tmp_path / "b")
    await h.create_topic("t", topic_id="the-id")
    await produce(h, "t", batch(b"a"))
    log_dir = h.rm.partitions[("t", 0)].log.dir
    await h.close()
    (log_dir / "partition.metadata").unlink()  # as an older version left it
    h2 = Harness(tmp_path / "b")
    assert h2.log_manager.get_log(("t", 0)).topic_id is None
    await h2.create_topic("t", topic_id="the-id")
    await h2.rm.handle_unassigned_logs()
    assert h2.rm.partitions[("t", 0)].log_end_offset == 1
    assert (log_dir / "partition.metadata").read_text() == "version: 0\ntopic_id: the-id\n"
    assert h2.log_manager.stray_logs() == []
    await h2.close()


async def test_checkpoints_and_flush_messages(tmp_path: Path) -> None:
    h = Harness(tmp_path / "b", flush_messages=1)
    await h.create_topic("t")
    await produce(h, "t", batch(b"a"))
    p = h.rm.partitions[("t", 0)]
    assert p.log.recovery_point == p.log_end_offset == 1  # fsynced before the ack
    await produce(h, "t", batch(b"b"))
    await h.rm.checkpoint()
    assert h.log_manager.read_high_watermarks() == {("t", 0): 2}
    await h.close()
    # Restart: the HW comes back from the checkpoint.
    h2 = Harness(tmp_path / "b")
    assert h2.log_manager.had_clean_shutdown
    await h2.create_topic("t", topic_id="t-id-0", leader=-1)
    assert h2.rm.partitions[("t", 0)].high_watermark == 2
    await h2.close()


async def test_retention_deletes_old_segments(tmp_path: Path) -> None:
    h = Harness(tmp_path / "b", segment_bytes=1024, retention_ms=1000)
    await h.create_topic("t")
    old = int(time.time() * 1000) - 3_600_000
    for _ in range(5):
        await produce(h, "t", batch(b"z" * 600, timestamp=old))
    p = h.rm.partitions[("t", 0)]
    assert len(p.log.segments) == 5
    h.rm._retention()
    assert p.log_start_offset == 4  # every segment but the active one
    assert len(p.log.segments) == 1
    f = await fetch(h, "t", 0)
    assert f.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and f.log_start_offset == 4
    await h.close()


async def test_flush_ms_flushes_in_the_background(tmp_path: Path) -> None:
    h = Harness(tmp_path / "b", flush_check_interval_ms=10)
    await h.create_topic("timed", configs={"flush.ms": "20"})
    await h.create_topic("never")
    h.rm.start_background()
    await produce(h, "timed", batch(b"a"))
    await produce(h, "never", batch(b"a"))
    timed = h.rm.partitions[("timed", 0)]
    async with asyncio.timeout(5):
        while timed.log.recovery_point < 1:
            await asyncio.sleep(0.01)
    assert h.rm.partitions[("never", 0)].log.recovery_point == 0
    await h.close()


async def test_replica_fetch_from_outside_the_replica_set(harness: Harness) -> None:
    h = harness
    await h.create_topic("t")
    await produce(h, "t", batch(b"a"))
    f = await fetch(h, "t", 0, replica_id=7)
    assert f.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and f.records == b""


async def test_acks_all_with_one_partition_twice(harness: Harness) -> None:
    """Each entry answered (INVALID_REQUEST: Kafka would keep only the last) and
    nothing appended (tests/integration/test_kafka_differences.py)."""
    h = harness
    await h.create_topic("two", replicas=[1, 2])
    req = produce_req("two", batch(b"x"), acks=-1, timeout_ms=50)
    req.topics[0].partitions.append(req.topics[0].partitions[0])
    resp = await h.rm.produce(req)
    codes = [p.error_code for p in resp.topics[0].partitions]
    assert codes == [ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_REQUEST]
    assert h.rm.partitions[("two", 0)].log_end_offset == 0
