"""FindCoordinator, OffsetCommit and OffsetFetch in the Kafka codec, against kafka-python
3.0.12's protocol classes: kafka-python's bytes decode to the native messages of the
offsets coordinator, with the committed leader epoch where the version carries it
(OffsetCommit v6+, OffsetFetch v5+, KIP-320), and encode again to the same bytes.
"""

from __future__ import annotations

import pytest
from kafka.protocol.consumer import OffsetCommitRequest as KOffsetCommitRequest
from kafka.protocol.consumer import OffsetCommitResponse as KOffsetCommitResponse
from kafka.protocol.consumer import OffsetFetchRequest as KOffsetFetchRequest
from kafka.protocol.consumer import OffsetFetchResponse as KOffsetFetchResponse
from kafka.protocol.metadata import FindCoordinatorRequest as KFindCoordinatorRequest
from kafka.protocol.metadata import FindCoordinatorResponse as KFindCoordinatorResponse

from protocol.kafka.apis import FIND_COORDINATOR
from protocol.kafka.apis import OFFSET_COMMIT
from protocol.kafka.apis import OFFSET_FETCH
from protocol.messages import FindCoordinatorRequest
from protocol.messages import FindCoordinatorResponse
from protocol.messages import OffsetCommitRequest
from protocol.messages import OffsetCommitResponse
from protocol.messages import OffsetFetchRequest
from protocol.messages import OffsetFetchResponse
from tests.unit.protocol.test_kafka_codec_admin_apis import served
from tests.unit.protocol.test_kafka_codec_data_apis import request_both_ways
from tests.unit.protocol.test_kafka_codec_data_apis import response_both_ways


@pytest.mark.parametrize("version", served(FIND_COORDINATOR))
def test_find_coordinator(version: int) -> None:
    body = request_both_ways(
        FIND_COORDINATOR, KFindCoordinatorRequest(key="readers", key_type=0), version
    )
    assert body == FindCoordinatorRequest(key="readers", key_type=0)
    answer = KFindCoordinatorResponse(
        throttle_time_ms=0,
        error_code=0,
        error_message=None,
        node_id=2,
        host="localhost",
        port=19094,
    )
    back = response_both_ways(FIND_COORDINATOR, answer, version)
    assert back == FindCoordinatorResponse(node_id=2, host="localhost", port=19094)


@pytest.mark.parametrize("version", served(OFFSET_COMMIT))
def test_offset_commit(version: int) -> None:
    t = KOffsetCommitRequest.OffsetCommitRequestTopic
    message = KOffsetCommitRequest(
        group_id="readers",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        retention_time_ms=-1,
        topics=[
            t(
                name="orders",
                partitions=[
                    t.OffsetCommitRequestPartition(
                        partition_index=1,
                        committed_offset=42,
                        committed_leader_epoch=5,
                        committed_metadata="",
                    )
                ],
            )
        ],
    )
    body = request_both_ways(OFFSET_COMMIT, message, version)
    assert isinstance(body, OffsetCommitRequest)
    assert (body.group_id, body.generation_id, body.member_id) == ("readers", -1, "")
    p = body.topics[0].partitions[0]
    assert (p.partition_index, p.committed_offset) == (1, 42)
    assert p.committed_leader_epoch == (5 if version >= 6 else -1)

    r = KOffsetCommitResponse.OffsetCommitResponseTopic
    answer = KOffsetCommitResponse(
        throttle_time_ms=0,
        topics=[
            r(
                name="orders",
                partitions=[r.OffsetCommitResponsePartition(partition_index=1, error_code=0)],
            )
        ],
    )
    back = response_both_ways(OFFSET_COMMIT, answer, version)
    assert isinstance(back, OffsetCommitResponse)
    assert back.topics[0].partitions[0].partition_index == 1


@pytest.mark.parametrize("version", served(OFFSET_FETCH))
def test_offset_fetch(version: int) -> None:
    t = KOffsetFetchRequest.OffsetFetchRequestTopic
    message = KOffsetFetchRequest(
        group_id="readers", topics=[t(name="orders", partition_indexes=[0, 1])]
    )
    body = request_both_ways(OFFSET_FETCH, message, version)
    assert isinstance(body, OffsetFetchRequest)
    assert body.group_id == "readers"
    assert [(x.name, x.partition_indexes) for x in body.topics or []] == [("orders", [0, 1])]

    r = KOffsetFetchResponse.OffsetFetchResponseTopic
    answer = KOffsetFetchResponse(
        throttle_time_ms=0,
        topics=[
            r(
                name="orders",
                partitions=[
                    r.OffsetFetchResponsePartition(
                        partition_index=1,
                        committed_offset=42,
                        committed_leader_epoch=5,
                        metadata="",
                        error_code=0,
                    )
                ],
            )
        ],
        error_code=0,
    )
    back = response_both_ways(OFFSET_FETCH, answer, version)
    assert isinstance(back, OffsetFetchResponse)
    p = back.topics[0].partitions[0]
    assert (p.partition_index, p.committed_offset) == (1, 42)
    assert p.committed_leader_epoch == (5 if version >= 5 else -1)


@pytest.mark.parametrize("version", [v for v in served(OFFSET_FETCH) if v >= 2])
def test_offset_fetch_of_all_the_groups_partitions(version: int) -> None:
    body = request_both_ways(OFFSET_FETCH, KOffsetFetchRequest(group_id="g", topics=None), version)
    assert body == OffsetFetchRequest(group_id="g", topics=None)
