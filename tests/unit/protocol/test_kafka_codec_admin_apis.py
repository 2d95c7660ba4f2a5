"""CreateTopics, DeleteTopics and InitProducerId in the Kafka codec, against kafka-python
3.0.12's protocol classes: kafka-python's bytes decode to the native messages the
broker's handlers serve (topic configs as a name -> value map, -1 partitions and
replication factor for the cluster's defaults), and encode again to the same bytes.
"""

from __future__ import annotations

import pytest
from kafka.protocol.admin import CreateTopicsRequest as KCreateTopicsRequest
from kafka.protocol.admin import CreateTopicsResponse as KCreateTopicsResponse
from kafka.protocol.admin import DeleteTopicsRequest as KDeleteTopicsRequest
from kafka.protocol.admin import DeleteTopicsResponse as KDeleteTopicsResponse
from kafka.protocol.producer import InitProducerIdRequest as KInitProducerIdRequest
from kafka.protocol.producer import InitProducerIdResponse as KInitProducerIdResponse

from protocol.connection import DecodedRequest
from protocol.errors import ErrorCode
from protocol.kafka.apis import CREATE_TOPICS
from protocol.kafka.apis import DELETE_TOPICS
from protocol.kafka.apis import INIT_PRODUCER_ID
from protocol.kafka.apis import KafkaApi
from protocol.kafka.codec import decode_request
from protocol.messages import CreatableReplicaAssignment
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DeleteTopicsRequest
from protocol.messages import DeleteTopicsResponse
from protocol.messages import InitProducerIdRequest
from protocol.messages import InitProducerIdResponse
from tests.unit.protocol.test_kafka_codec import kafka_python_request
from tests.unit.protocol.test_kafka_codec_data_apis import request_both_ways
from tests.unit.protocol.test_kafka_codec_data_apis import response_both_ways


def served(api: KafkaApi) -> range:
    return range(api.min_version, api.max_version + 1)


@pytest.mark.parametrize("version", served(CREATE_TOPICS))
def test_create_topics(version: int) -> None:
    t = KCreateTopicsRequest.CreatableTopic
    message = KCreateTopicsRequest(
        topics=[
            t(
                name="orders",
                num_partitions=-1,
                replication_factor=-1,
                assignments=[],
                configs=[
                    t.CreatableTopicConfig(name="min.insync.replicas", value="2"),
                    t.CreatableTopicConfig(name="retention.ms", value=None),
                ],
            ),
            t(
                name="placed",
                num_partitions=-1,
                replication_factor=-1,
                assignments=[t.CreatableReplicaAssignment(partition_index=0, broker_ids=[2, 1])],
                configs=[],
            ),
        ],
        timeout_ms=15_000,
        validate_only=True,
    )
    body = request_both_ways_lossy(message, version)
    assert isinstance(body, CreateTopicsRequest)
    assert (body.timeout_ms, body.validate_only) == (15_000, True)
    assert body.topics == [
        CreatableTopic(name="orders", configs={"min.insync.replicas": "2"}),
        CreatableTopic(
            name="placed",
            assignments=[CreatableReplicaAssignment(partition_index=0, broker_ids=[2, 1])],
        ),
    ]

    r = KCreateTopicsResponse.CreatableTopicResult
    answer = KCreateTopicsResponse(
        throttle_time_ms=0,
        topics=[
            r(name="orders", error_code=0, error_message=None),
            r(name="placed", error_code=36, error_message="topic placed already exists"),
        ],
    )
    back = response_both_ways(CREATE_TOPICS, answer, version)
    assert isinstance(back, CreateTopicsResponse)
    assert [(t.name, t.error_code) for t in back.topics] == [
        ("orders", 0),
        ("placed", ErrorCode.TOPIC_ALREADY_EXISTS),
    ]


def request_both_ways_lossy(message: KCreateTopicsRequest, version: int) -> object:
    """A null config value (the topic default) is kept natively as no config at all:
    decoded, it is gone; the rest encodes back to kafka-python's bytes exactly."""
    with_null = decode_request(kafka_python_request(message, version))
    assert isinstance(with_null, DecodedRequest)
    configs = message.topics[0].configs
    null_config = configs.pop()
    assert null_config.value is None
    body = request_both_ways(CREATE_TOPICS, message, version)
    configs.append(null_config)
    assert with_null.body == body
    return body


@pytest.mark.parametrize("version", served(DELETE_TOPICS))
def test_delete_topics(version: int) -> None:
    body = request_both_ways(
        DELETE_TOPICS, KDeleteTopicsRequest(topic_names=["a", "b"], timeout_ms=9_000), version
    )
    assert body == DeleteTopicsRequest(topic_names=["a", "b"], timeout_ms=9_000)
    r = KDeleteTopicsResponse.DeletableTopicResult
    answer = KDeleteTopicsResponse(
        throttle_time_ms=0, responses=[r(name="a", error_code=0), r(name="b", error_code=3)]
    )
    back = response_both_ways(DELETE_TOPICS, answer, version)
    assert isinstance(back, DeleteTopicsResponse)
    assert [(t.name, t.error_code) for t in back.responses] == [("a", 0), ("b", 3)]


@pytest.mark.parametrize("version", served(INIT_PRODUCER_ID))
def test_init_producer_id(version: int) -> None:
    message = KInitProducerIdRequest(
        transactional_id=None, transaction_timeout_ms=60_000, producer_id=17, producer_epoch=3
    )
    body = request_both_ways(INIT_PRODUCER_ID, message, version)
    assert isinstance(body, InitProducerIdRequest)
    # v3+ carries the producer id and epoch to bump (KIP-360).
    bump = (17, 3) if version >= 3 else (-1, -1)
    assert (body.producer_id, body.producer_epoch) == bump
    answer = KInitProducerIdResponse(
        throttle_time_ms=0, error_code=0, producer_id=17, producer_epoch=4
    )
    back = response_both_ways(INIT_PRODUCER_ID, answer, version)
    assert back == InitProducerIdResponse(producer_id=17, producer_epoch=4)
