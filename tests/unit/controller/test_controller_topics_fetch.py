"""CreateTopics, DeleteTopics and FetchMetadata through the handlers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.state import MetadataImage
from protocol.errors import ErrorCode
from protocol.messages import CreatableReplicaAssignment
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import DeleteTopicsRequest
from protocol.messages import FetchMetadataRequest
from protocol.metadata_records import PartitionRecord
from protocol.metadata_records import RemoveTopicRecord
from protocol.metadata_records import TopicRecord


async def create(h, *topics: CreatableTopic, validate_only: bool = False):
    response = await h.handlers.create_topics(
        CreateTopicsRequest(topics=list(topics), validate_only=validate_only)
    )
    return response.topics


async def test_create_topic_defaults_and_one_fsynced_append(harness, monkeypatch) -> None:
    h = harness
    for b in (1, 2, 3):
        await h.start_broker(b)
    appends: list[int] = []
    real_append = h.writer.log.append

    async def counting_append(entries):
        appends.append(len(entries))
        await real_append(entries)

    monkeypatch.setattr(h.writer.log, "append", counting_append)
    start = h.image.next_offset
    (result,) = await create(h, CreatableTopic(name="t", num_partitions=4, replication_factor=3))
    assert result.error_code == 0 and result.topic_id
    assert (result.num_partitions, result.replication_factor) == (4, 3)
    assert appends == [5]  # TopicRecord + 4 PartitionRecords in one append
    entries = h.writer.entries_from(start, 100)
    assert entries is not None
    assert isinstance(entries[0].record, TopicRecord)
    assert entries[0].record.configs == {
        "min.insync.replicas": "1",
        "unclean.leader.election.enable": "false",
    }
    for i, entry in enumerate(entries[1:]):
        rec = entry.record
        assert isinstance(rec, PartitionRecord)
        assert rec.partition_id == i and rec.isr == rec.replicas and rec.leader == rec.replicas[0]
        assert (rec.leader_epoch, rec.partition_epoch) == (0, 0)
    (defaulted,) = await create(h, CreatableTopic(name="d"))
    assert (defaulted.num_partitions, defaulted.replication_factor) == (1, 1)


async def test_create_topic_errors(harness) -> None:
    h = harness
    await h.start_broker(1)
    await h.register(2)  # fenced: does not count for placement
    await create(h, CreatableTopic(name="exists"))
    results = await create(
        h,
        CreatableTopic(name="bad name"),
        CreatableTopic(name="exists"),
        CreatableTopic(name="dup"),
        CreatableTopic(name="dup"),
        CreatableTopic(name="rf", replication_factor=2),
        CreatableTopic(name="parts", num_partitions=0),
        CreatableTopic(name="rf0", replication_factor=0),
        CreatableTopic(name="cfg", configs={"min.insync.replicas": "zero"}),
        CreatableTopic(name="unknowncfg", configs={"cleanup.policy": "compact"}),
        CreatableTopic(name="huge", num_partitions=10**6),
        CreatableTopic(
            name="both",
            num_partitions=1,
            assignments=[CreatableReplicaAssignment(partition_index=0, broker_ids=[1])],
        ),
        CreatableTopic(
            name="unregistered",
            assignments=[CreatableReplicaAssignment(partition_index=0, broker_ids=[7])],
        ),
        CreatableTopic(
            name="allfenced",
            assignments=[CreatableReplicaAssignment(partition_index=0, broker_ids=[2])],
        ),
        CreatableTopic(
            name="gap",
            assignments=[CreatableReplicaAssignment(partition_index=1, broker_ids=[1])],
        ),
    )
    codes = {r.name: ErrorCode(r.error_code) for r in results}
    assert codes == {
        "bad name": ErrorCode.INVALID_TOPIC_EXCEPTION,
        "exists": ErrorCode.TOPIC_ALREADY_EXISTS,
        "dup": ErrorCode.INVALID_REQUEST,
        "rf": ErrorCode.INVALID_REPLICATION_FACTOR,
        "parts": ErrorCode.INVALID_PARTITIONS,
        "rf0": ErrorCode.INVALID_REPLICATION_FACTOR,
        "cfg": ErrorCode.INVALID_CONFIG,
        "unknowncfg": ErrorCode.INVALID_CONFIG,
        "huge": ErrorCode.INVALID_PARTITIONS,
        "both": ErrorCode.INVALID_REQUEST,
        "unregistered": ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        "allfenced": ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        "gap": ErrorCode.INVALID_REPLICA_ASSIGNMENT,
    }
    assert all(r.error_message for r in results)
    assert "larger than the 1 available" in next(r for r in results if r.name == "rf").error_message
    assert sorted(h.image.topic_ids) == ["exists"]


async def test_validate_only_writes_nothing(harness) -> None:
    h = harness
    await h.start_broker(1)
    offset = h.image.last_offset
    (result,) = await create(h, CreatableTopic(name="t"), validate_only=True)
    assert result.error_code == 0
    assert h.image.last_offset == offset and h.image.topic_by_name("t") is None


async def test_manual_assignment_isr_is_unfenced_replicas(harness) -> None:
    h = harness
    await h.start_broker(1)
    await h.start_broker(2)
    await h.register(3)
    (result,) = await create(
        h,
        CreatableTopic(
            name="t",
            assignments=[
                CreatableReplicaAssignment(partition_index=0, broker_ids=[3, 2, 1]),
                CreatableReplicaAssignment(partition_index=1, broker_ids=[1, 3, 2]),
            ],
        ),
    )
    assert result.error_code == 0 and result.replication_factor == 3
    p0, p1 = h.partition("t", 0), h.partition("t", 1)
    assert (p0.replicas, p0.isr, p0.leader) == ([3, 2, 1], [2, 1], 2)
    assert (p1.replicas, p1.isr, p1.leader) == ([1, 3, 2], [1, 2], 1)


async def test_delete_topics(harness) -> None:
    h = harness
    await h.start_broker(1)
    await create(h, CreatableTopic(name="a"), CreatableTopic(name="b"))
    response = await h.handlers.delete_topics(
        DeleteTopicsRequest(topic_names=["a", "nope", "b", "b"])
    )
    codes = [(r.name, r.error_code) for r in response.responses]
    assert codes == [
        ("a", 0),
        ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("b", ErrorCode.INVALID_REQUEST),
        ("b", ErrorCode.INVALID_REQUEST),
    ]
    assert sorted(h.image.topic_ids) == ["b"]
    last = h.writer.entries_from(h.image.last_offset, 1)
    assert last is not None and isinstance(last[0].record, RemoveTopicRecord)
    # A recreated topic gets a new id and fresh epochs.
    (again,) = await create(h, CreatableTopic(name="a"))
    assert again.error_code == 0


async def test_fetch_metadata_entries_and_long_poll(harness) -> None:
    h = harness
    epoch = await h.start_broker(1)
    end = h.image.next_offset
    full = await h.handlers.fetch_metadata(
        FetchMetadataRequest(broker_id=1, broker_epoch=epoch, from_offset=0)
    )
    assert not full.is_snapshot and full.cluster_id == "test-cluster-id"
    assert [e.offset for e in full.entries] == list(range(end))
    assert full.next_offset == full.high_watermark == end
    part = await h.handlers.fetch_metadata(
        FetchMetadataRequest(broker_id=1, broker_epoch=epoch, from_offset=0, max_records=1)
    )
    assert len(part.entries) == 1 and part.next_offset == 1
    # Caught up: the long-poll times out empty ...
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    empty = await h.handlers.fetch_metadata(
        FetchMetadataRequest(broker_id=1, broker_epoch=epoch, from_offset=end, max_wait_ms=50)
    )
    assert empty.entries == [] and empty.next_offset == end
    assert 0.04 <= loop.time() - t0 < 2
    # ... or returns as soon as something is appended.
    poll = asyncio.create_task(
        h.handlers.fetch_metadata(
            FetchMetadataRequest(
                broker_id=1, broker_epoch=epoch, from_offset=end, max_wait_ms=10_000
            )
        )
    )
    await asyncio.sleep(0.05)
    assert not poll.done() and h.writer.waiters == 1
    await create(h, CreatableTopic(name="t"))
    woke = await asyncio.wait_for(poll, 2)
    assert [e.offset for e in woke.entries] == [end, end + 1]
    assert h.writer.waiters == 0


async def test_fetch_metadata_only_for_a_registered_broker_epoch(harness) -> None:
    """A controller serves its metadata only to a broker it registered, at its current
    broker epoch: a broker of another cluster, or one this controller does not know
    (it lost its data), must not act on this image."""
    h = harness
    epoch = await h.start_broker(1)
    for broker_id, broker_epoch in ((2, epoch), (1, epoch - 1), (1, -1)):
        refused = await h.handlers.fetch_metadata(
            FetchMetadataRequest(broker_id=broker_id, broker_epoch=broker_epoch, from_offset=0)
        )
        assert refused.error_code == ErrorCode.STALE_BROKER_EPOCH
        assert refused.entries == [] and not refused.is_snapshot
        assert refused.cluster_id == "test-cluster-id"
        assert f"broker {broker_id} epoch {broker_epoch}" in (refused.error_message or "")
    served = await h.handlers.fetch_metadata(
        FetchMetadataRequest(broker_id=1, broker_epoch=epoch, from_offset=0)
    )
    assert served.error_code == 0 and served.entries


async def test_fetch_metadata_waiters_are_bounded(make_harness, tmp_path: Path) -> None:
    h = await make_harness(tmp_path / "c", max_metadata_waiters=1)
    epoch = await h.start_broker(1)
    end = h.image.next_offset
    first = asyncio.create_task(
        h.handlers.fetch_metadata(
            FetchMetadataRequest(broker_id=1, broker_epoch=epoch, from_offset=end, max_wait_ms=5000)
        )
    )
    await asyncio.sleep(0.02)
    second = await asyncio.wait_for(
        h.handlers.fetch_metadata(
            FetchMetadataRequest(broker_id=1, broker_epoch=epoch, from_offset=end, max_wait_ms=5000)
        ),
        1,
    )
    assert second.entries == []  # answered at once: too many parked readers
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    assert h.writer.waiters == 0


async def test_fetch_metadata_snapshot_when_log_was_compacted(make_harness, tmp_path: Path) -> None:
    h = await make_harness(tmp_path / "c", snapshot_every=3)
    epoch = await h.start_broker(1)
    for b in (2, 3):
        await h.start_broker(b)
    await create(h, CreatableTopic(name="t", num_partitions=2, replication_factor=2))
    assert h.writer.snapshots_written >= 2
    assert h.writer.oldest_retained_offset > 0
    snap = await h.handlers.fetch_metadata(
        FetchMetadataRequest(broker_id=1, broker_epoch=epoch, from_offset=0)
    )
    assert snap.is_snapshot and snap.next_offset == h.image.next_offset
    assert {e.offset for e in snap.entries} == {h.image.last_offset}
    rebuilt = MetadataImage()
    rebuilt.load_snapshot(snap.next_offset - 1, [e.record for e in snap.entries])
    assert rebuilt.snapshot_records() == h.image.snapshot_records()
    # Entries after the previous snapshot are still served as entries.
    recent = await h.handlers.fetch_metadata(
        FetchMetadataRequest(
            broker_id=1, broker_epoch=epoch, from_offset=h.writer.oldest_retained_offset
        )
    )
    assert not recent.is_snapshot and recent.next_offset == h.image.next_offset
    # A reader from the future (controller data lost?) gets a snapshot too.
    future = await h.handlers.fetch_metadata(
        FetchMetadataRequest(broker_id=1, broker_epoch=epoch, from_offset=h.image.next_offset + 10)
    )
    assert future.is_snapshot
    # After a restart only the entries after the newest snapshot are retained.
    await h.reopen()
    again = await h.handlers.fetch_metadata(
        FetchMetadataRequest(broker_id=1, broker_epoch=epoch, from_offset=0)
    )
    assert again.is_snapshot
    assert [e.record for e in again.entries] == h.image.snapshot_records()


async def test_new_replicas_only_on_brokers_heard_from_since_the_controller_started(
    make_harness, tmp_path: Path
) -> None:
    """Issue 13 item 8: after a controller restart, the replayed log still calls a
    broker that died meanwhile unfenced (until its session runs out); new replicas
    go only to brokers that registered or heartbeated to this controller process.
    (Sessions run on the harness's frozen clock; a CreateTopics short of brokers waits
    at most one real session timeout, 0.2 s here, for silent ones.)"""
    h = await make_harness(tmp_path / "c", session_timeout_ms=200)
    epochs = {b: await h.start_broker(b) for b in (1, 2, 3)}
    await h.reopen()  # broker 3 died while the controller was down
    assert h.image.unfenced_broker_ids() == [1, 2, 3]
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    (refused,) = await create(h, CreatableTopic(name="t3", replication_factor=3))
    assert 0.15 <= loop.time() - t0 < 5  # waited for the silent brokers, boundedly
    assert refused.error_code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert "brokers [1, 2, 3] are registered but have not heartbeated" in refused.error_message
    for b in (1, 2):
        assert (await h.heartbeat(b, epochs[b])).error_code == 0
    (again,) = await create(h, CreatableTopic(name="t3", replication_factor=3))
    assert again.error_code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert "brokers [3] are registered" in again.error_message
    (placed,) = await create(h, CreatableTopic(name="t2", num_partitions=6, replication_factor=2))
    assert placed.error_code == 0
    topic = h.image.topic_by_name("t2")
    assert topic is not None
    assert all(3 not in p.replicas and 3 not in p.isr for p in topic.partitions.values())
    # Explicit assignments may name broker 3, but it is not put in the ISR or led.
    (assigned,) = await create(
        h,
        CreatableTopic(
            name="a",
            assignments=[CreatableReplicaAssignment(partition_index=0, broker_ids=[3, 1])],
        ),
    )
    assert assigned.error_code == 0
    p = h.partition("a")
    assert p.isr == [1] and p.leader == 1


async def test_fetch_metadata_answers_hold_whole_changes(harness) -> None:
    """KIP-868: a topic reaches a broker with all its partitions or not at all. With
    answers of at most 5 records, a 50-partition topic (51 records of one change) still
    comes in one answer; before, a broker applied it 5 records at a time and showed
    clients a topic of 4, then 9, ... partitions (keys hashed over the wrong count)."""
    h = harness
    epoch = await h.start_broker(1)
    start = h.image.next_offset
    await create(h, CreatableTopic(name="wide", num_partitions=50, replication_factor=1))
    await create(h, CreatableTopic(name="next", num_partitions=2, replication_factor=1))
    offset, answers = start, []
    while offset < h.image.next_offset:
        answer = await h.handlers.fetch_metadata(
            FetchMetadataRequest(broker_id=1, broker_epoch=epoch, from_offset=offset, max_records=5)
        )
        answers.append([e.offset for e in answer.entries])
        assert answer.next_offset == offset + len(answer.entries)
        assert not answer.entries[-1].change_continues  # ends on a change's end
        offset = answer.next_offset
    assert answers == [list(range(start, start + 51)), list(range(start + 51, start + 54))]
    # The records of each change are marked as such, on the wire and on disk.
    wide = h.writer.entries_from(start, 1)
    assert wide is not None and len(wide) == 51
    assert [e.change_continues for e in wide] == [True] * 50 + [False]
