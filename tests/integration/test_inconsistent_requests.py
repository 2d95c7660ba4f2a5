"""Requests that are well framed but inconsistent, to a real broker (found by a
hostile-request session, 2026-11-30; each test failed before its fix). The
invariants: nothing is answered success that was not done, and a value no consumer
could use is refused, not stored.

- A Produce whose record set holds a new batch next to a retried idempotent one was
  answered as the duplicate: success, and the new batch silently dropped. Now
  INVALID_RECORD (Kafka takes one batch per partition), nothing written.
- An OffsetCommit of offset -5 was stored and handed back by OffsetFetch. Now
  INVALID_REQUEST for that partition, with a log line saying why.
"""

from __future__ import annotations

import asyncio

import pytest
from cluster import Cluster
from cluster import TestClient
from test_produce_validation import produce_raw

from protocol.errors import ErrorCode
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import ListOffsetsPartition
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsTopic
from protocol.messages import OffsetCommitPartition
from protocol.messages import OffsetCommitRequest
from protocol.messages import OffsetCommitTopic
from protocol.messages import OffsetFetchRequest
from protocol.messages import OffsetFetchTopic
from tests.unit.protocol.record_faults import raw_batch
from tests.unit.protocol.record_faults import record
from tests.unit.protocol.record_faults import three_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TOPIC = "dup-batch"


async def produce(client: TestClient, records: bytes) -> tuple[int, int]:
    code, _, base = await produce_raw(client, records, topic=TOPIC)
    return code, base


async def log_end(client: TestClient) -> int:
    resp = await client.call(
        ListOffsetsRequest(
            topics=[
                ListOffsetsTopic(
                    name=TOPIC, partitions=[ListOffsetsPartition(partition_index=0, timestamp=-1)]
                )
            ]
        )
    )
    return resp.topics[0].partitions[0].offset


async def create_topic(client: TestClient, name: str) -> None:
    await client.call(
        CreateTopicsRequest(
            topics=[CreatableTopic(name=name, num_partitions=1, replication_factor=1)]
        )
    )


async def test_a_new_batch_next_to_a_retried_one_is_not_swallowed(cluster: Cluster) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1)
    async with TestClient(*broker.address) as client:
        await create_topic(client, TOPIC)
        idempotent = raw_batch(three_records(), 3, producer=(2000, 0, 0))
        for _ in range(50):  # the new partition's leader may take a moment
            code, base = await produce(client, idempotent)
            if code == 0:
                break
        assert (code, base) == (0, 0)
        # A plain batch, then the retry of the idempotent one, in one record set.
        code, base = await produce(client, raw_batch(record(0, b"PLAIN"), 1) + idempotent)
        end = await log_end(client)
    assert (code, end) == (ErrorCode.INVALID_RECORD, 3), (
        f"answered {ErrorCode(code).name} (base offset {base}); the log end is {end}"
    )


async def test_a_negative_committed_offset_is_refused(cluster: Cluster) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1)
    async with TestClient(*broker.address) as client:
        await create_topic(client, "g")
        commit = OffsetCommitRequest(
            group_id="grp",
            topics=[
                OffsetCommitTopic(
                    name="g",
                    partitions=[OffsetCommitPartition(partition_index=0, committed_offset=-5)],
                )
            ],
        )
        for _ in range(100):  # until the coordinator (__consumer_offsets) is ready
            code = (await client.call(commit)).topics[0].partitions[0].error_code
            if code not in (
                ErrorCode.NOT_COORDINATOR,
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
            ):
                break
            await asyncio.sleep(0.1)
        fetched = await client.call(
            OffsetFetchRequest(
                group_id="grp", topics=[OffsetFetchTopic(name="g", partition_indexes=[0])]
            )
        )
    stored = fetched.topics[0].partitions[0].committed_offset
    assert (code, stored) == (ErrorCode.INVALID_REQUEST, -1), (
        f"commit of offset -5 answered {ErrorCode(code).name}; OffsetFetch returns {stored}"
    )
