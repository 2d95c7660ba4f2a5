"""The offsets coordinator: Kafka's group -> partition hashing, the record format of
__consumer_offsets, loading the cache from a log, and commit / fetch / leadership over
a ReplicaManager on real storage (broker_harness)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
from broker_harness import Harness

from broker.group_coordinator import OFFSETS_TOPIC
from broker.group_coordinator import GroupCoordinator
from broker.group_coordinator import java_string_hash
from broker.group_coordinator import partition_for
from broker.groups.records import GroupKey
from broker.groups.records import GroupValue
from broker.groups.records import MemberRecord
from broker.groups.records import OffsetKey
from broker.groups.records import OffsetValue
from broker.groups.records import decode_commit
from broker.groups.records import decode_record
from broker.groups.records import encode_commit
from broker.groups.records import encode_key
from broker.groups.records import encode_value
from broker.groups.shard_cache import CorruptGroupStateError
from broker.groups.shard_cache import ShardCache
from broker.groups.shard_cache import load_cache
from broker.storage.log import Log
from broker.storage.log import LogConfig
from protocol.errors import ErrorCode
from protocol.messages import CreatableTopicResult
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import FindCoordinatorRequest
from protocol.messages import FindCoordinatorResponse
from protocol.messages import OffsetCommitPartition
from protocol.messages import OffsetCommitRequest
from protocol.messages import OffsetCommitResponse
from protocol.messages import OffsetCommitTopic
from protocol.messages import OffsetFetchRequest
from protocol.messages import OffsetFetchResponse
from protocol.messages import OffsetFetchTopic
from protocol.metadata_records import ListenerInfo
from protocol.metadata_records import RegisterBrokerRecord
from protocol.metadata_records import UnfenceBrokerRecord
from protocol.record_batch import BatchBuilder
from protocol.record_batch import encode_batch
from runtime.server import RequestContext

CTX = RequestContext(listener="PLAINTEXT", peer="test", client_id=None, api_version=0)


# ---------------------------------------------------------------------- hashing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),  # Java: "hello".hashCode()
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -(2**31)),  # the famous Integer.MIN_VALUE hash
        ("\U0001f600", 0xD83D * 31 + 0xDE00),  # a surrogate pair: two UTF-16 units
    ],
)
def test_java_string_hash(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_partition_for_uses_kafka_utils_abs() -> None:
    assert partition_for("polygenelubricants", 7) == 0  # Utils.abs(MIN_VALUE) == 0
    assert partition_for("hello", 10) == 99162322 % 10
    negative = next(g for g in (f"group-{i}" for i in range(1000)) if java_string_hash(g) < 0)
    assert partition_for(negative, 50) == abs(java_string_hash(negative)) % 50
    assert all(0 <= partition_for(f"g{i}", 10) < 10 for i in range(200))


# ---------------------------------------------------------------------- records


def test_record_round_trip() -> None:
    key, value = encode_commit("g", "t", 3, 42, 7, "meta", 1234)
    decoded = decode_commit(key, value)
    assert decoded == (OffsetKey(1, "g", "t", 3), OffsetValue(1, 42, 7, "meta", 1234))
    # MessagePack arrays, as documented at the top of the module.
    assert msgspec.msgpack.decode(key) == [1, "g", "t", 3]
    assert msgspec.msgpack.decode(value) == [1, 42, 7, "meta", 1234]
    _, none_meta = encode_commit("g", "t", 0, 0, -1, None, 5)
    assert decode_commit(key, none_meta) == (
        OffsetKey(1, "g", "t", 3),
        OffsetValue(1, 0, -1, None, 5),
    )


def test_decode_tombstone_and_other_versions() -> None:
    key, _ = encode_commit("g", "t", 0, 1, 1, None, 1)
    assert decode_commit(key, None) == (OffsetKey(1, "g", "t", 0), None)
    assert decode_commit(msgspec.msgpack.encode([2, "g"]), b"\x90") is None  # group metadata
    assert decode_commit(None, b"x") is None
    assert decode_commit(key, msgspec.msgpack.encode([9, 1])) is None


def test_cache_keeps_the_latest_by_log_offset() -> None:
    cache = ShardCache()
    k = OffsetKey(1, "g", "t", 0)
    cache.apply(k, OffsetValue(1, 20, 2, None, 0), log_offset=5)
    cache.apply(k, OffsetValue(1, 10, 1, None, 0), log_offset=3)  # older reply, later
    c = cache.get("g", "t", 0)
    assert c is not None and (c.offset, c.leader_epoch) == (20, 2)
    cache.apply(k, None, log_offset=6)
    assert cache.get("g", "t", 0) is None and "g" not in cache.groups


# ---------------------------------------------------------------------- load


def _commit_batch(*commits: tuple[str, str, int, int, int]) -> bytes:
    builder = BatchBuilder()
    for group, topic, partition, offset, epoch in commits:
        key, value = encode_commit(group, topic, partition, offset, epoch, f"m{offset}", 1000)
        builder.append(value, key)
    return builder.build()


async def test_load_cache_reads_the_log_up_to_the_end_offset(tmp_path: Path) -> None:
    log_ = Log.open(tmp_path / f"{OFFSETS_TOPIC}-0", LogConfig(), had_clean_shutdown=True)
    try:
        log_.epoch_cache.assign(0, 0)
        log_.append_as_leader(_commit_batch(("g1", "t", 0, 10, 0), ("g2", "t", 1, 5, 0)), 0)
        # A record of another kind (e.g. group metadata) is skipped.
        log_.append_as_leader(encode_batch([(msgspec.msgpack.encode([2, "g1"]), b"\x90")]), 0)
        log_.append_as_leader(_commit_batch(("g1", "t", 0, 11, 3)), 0)
        end = log_.log_end_offset
        log_.append_as_leader(_commit_batch(("g1", "t", 0, 99, 9)), 0)  # past the end
        cache = await load_cache(log_, end, name="test")
        c = cache.get("g1", "t", 0)
        assert c is not None
        assert (c.offset, c.leader_epoch, c.metadata, c.log_offset) == (11, 3, "m11", 3)
        c2 = cache.get("g2", "t", 1)
        assert c2 is not None and (c2.offset, c2.leader_epoch) == (5, 0)
        assert (await load_cache(log_, log_.log_end_offset, name="test")).get(
            "g1", "t", 0
        ).offset == 99  # type: ignore[union-attr]
    finally:
        log_.close()


async def test_an_undecodable_batch_is_refused_not_skipped(tmp_path: Path) -> None:
    """A byte flipped inside the second of three commit batches (after a clean stop
    the loader only sanity-checks the indexes, so the log opens): loading used to skip
    the batch with an ERROR line, and group g2's committed offset vanished (OffsetFetch
    answered -1). Now the load is refused, naming the batch (found by a hostile-disk
    session)."""
    dir = tmp_path / f"{OFFSETS_TOPIC}-0"
    log_ = Log.open(dir, LogConfig(), had_clean_shutdown=True)
    log_.epoch_cache.assign(0, 0)
    for group, offset in (("g1", 10), ("g2", 20), ("g3", 30)):
        log_.append_as_leader(_commit_batch((group, "t", 0, offset, 0)), 0)
    log_.close()
    path = next(dir.glob("*.log"))
    raw = bytearray(path.read_bytes())
    first_size = int.from_bytes(raw[8:12], "big") + 12
    raw[first_size + 70] ^= 0xFF  # inside the second batch's records
    path.write_bytes(bytes(raw))
    log_ = Log.open(dir, LogConfig(), had_clean_shutdown=True)
    try:
        with pytest.raises(CorruptGroupStateError, match="batch at offset 1 cannot be loaded"):
            await load_cache(log_, log_.log_end_offset, name="test")
    finally:
        log_.close()


def test_a_group_with_members_and_no_protocol_is_refused_not_asserted() -> None:
    """A CRC-valid group record listing members but no protocol: loaded_groups hit an
    assert outside the coordinator's error handling, the load task died without a
    word and the partition's groups answered COORDINATOR_LOAD_IN_PROGRESS forever."""
    member = MemberRecord("m-1", None, "c", "/127.0.0.1", 1000, 10000, b"", b"")
    key, value = decode_record(
        encode_key(GroupKey(2, "victim")),
        encode_value(GroupValue(1, "consumer", 3, None, "m-1", 1, [member])),
    )
    cache = ShardCache()
    cache.apply_group(key, value)
    with pytest.raises(CorruptGroupStateError, match=r"group victim: .*no protocol"):
        cache.loaded_groups()


# ---------------------------------------------------------------------- coordinator


class FakeController:
    def __init__(self) -> None:
        self.requests: list[CreateTopicsRequest] = []

    async def forward(self, request: CreateTopicsRequest, timeout_s: float) -> CreateTopicsResponse:
        self.requests.append(request)
        return CreateTopicsResponse(topics=[CreatableTopicResult(name=OFFSETS_TOPIC)])


def _coordinator(h: Harness, controller: Any) -> GroupCoordinator:
    return GroupCoordinator(
        config=h.config, image=h.image, replica_manager=h.rm, controller=controller
    )


async def _register(h: Harness, *ids: int) -> None:
    for i in ids:
        await h.apply(
            RegisterBrokerRecord(
                broker_id=i,
                broker_epoch=i,
                incarnation_id=f"inc{i}",
                listeners=[ListenerInfo(name="PLAINTEXT", host="127.0.0.1", port=9000 + i)],
            ),
            UnfenceBrokerRecord(broker_id=i, broker_epoch=i),
        )


async def _until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def _commit(group: str, offset: int, epoch: int) -> OffsetCommitRequest:
    return OffsetCommitRequest(
        group_id=group,
        topics=[
            OffsetCommitTopic(
                name="t",
                partitions=[
                    OffsetCommitPartition(
                        partition_index=0,
                        committed_offset=offset,
                        committed_leader_epoch=epoch,
                        committed_metadata="meta",
                    )
                ],
            )
        ],
    )


def _fetch(group: str) -> OffsetFetchRequest:
    return OffsetFetchRequest(
        group_id=group, topics=[OffsetFetchTopic(name="t", partition_indexes=[0, 1])]
    )


async def test_find_coordinator_creates_the_topic(harness: Harness) -> None:
    await _register(harness, 1)
    controller = FakeController()
    coordinator = _coordinator(harness, controller)
    resp = await coordinator.find_coordinator(CTX, FindCoordinatorRequest(key="g"))
    assert isinstance(resp, FindCoordinatorResponse)
    assert resp.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    await _until(lambda: controller.requests)
    topic = controller.requests[0].topics[0]
    assert topic.name == OFFSETS_TOPIC
    assert topic.num_partitions == 10
    assert topic.replication_factor == 1  # lowered to the one live broker
    assert topic.configs == {"min.insync.replicas": "1"}


async def test_commit_fetch_and_leadership(harness: Harness) -> None:
    h = harness
    await _register(h, 1, 2)
    coordinator = _coordinator(h, FakeController())
    await h.create_topic("t", 2)
    await h.create_topic(OFFSETS_TOPIC, 3)
    group = "my-group"
    index = partition_for(group, 3)

    found = await coordinator.find_coordinator(CTX, FindCoordinatorRequest(key=group))
    assert (found.error_code, found.node_id, found.port) == (0, 1, 9001)
    await _until(lambda: coordinator._shards[index].cache is not None)

    resp = await coordinator.offset_commit(CTX, _commit(group, 42, 7))
    assert isinstance(resp, OffsetCommitResponse)
    assert resp.topics[0].partitions[0].error_code == ErrorCode.NONE
    unknown = _commit(group, 1, 1)
    unknown.topics[0].name = "nope"
    resp = await coordinator.offset_commit(CTX, unknown)
    assert resp.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    fetched = await coordinator.offset_fetch(CTX, _fetch(group))
    assert isinstance(fetched, OffsetFetchResponse) and fetched.error_code == 0
    p0, p1 = fetched.topics[0].partitions
    assert (p0.committed_offset, p0.committed_leader_epoch, p0.metadata) == (42, 7, "meta")
    assert (p1.committed_offset, p1.committed_leader_epoch) == (-1, -1)
    all_of_group = await coordinator.offset_fetch(CTX, OffsetFetchRequest(group_id=group))
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in all_of_group.topics] == [
        ("t", [0])
    ]

    # Another broker leads the partition: not the coordinator any more, cache dropped.
    await h.set_partition(OFFSETS_TOPIC, index, leader=2, leader_epoch=1, replicas=[1, 2])
    assert index not in coordinator._shards
    fetched = await coordinator.offset_fetch(CTX, _fetch(group))
    assert fetched.error_code == ErrorCode.NOT_COORDINATOR
    resp = await coordinator.offset_commit(CTX, _commit(group, 50, 8))
    assert resp.topics[0].partitions[0].error_code == ErrorCode.NOT_COORDINATOR
    found = await coordinator.find_coordinator(CTX, FindCoordinatorRequest(key=group))
    assert (found.node_id, found.port) == (2, 9002)

    # Leader again at a new epoch: the cache is reloaded from the log.
    await h.set_partition(OFFSETS_TOPIC, index, leader=1, leader_epoch=2, replicas=[1], isr=[1])
    await _until(lambda: coordinator._shards[index].cache is not None)
    fetched = await coordinator.offset_fetch(CTX, _fetch(group))
    p0 = fetched.topics[0].partitions[0]
    assert (p0.committed_offset, p0.committed_leader_epoch, p0.metadata) == (42, 7, "meta")
    coordinator.close()
