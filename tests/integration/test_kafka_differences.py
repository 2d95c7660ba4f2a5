"""Where minibroker answered differently from Apache Kafka, on real processes, over
the native listener and the Kafka one (each test failed before its fix):

- Topics whose names differ only by '.' against '_' (`a.b`, `a_b`) could coexist;
  Kafka refuses the second (Topic.hasCollision, ReplicationControlManager): their
  metric names would be the same. Now INVALID_TOPIC_EXCEPTION naming the existing
  topic, from the controller, whichever listener the CreateTopics came in on.
"""

from __future__ import annotations

import pytest
from cluster import Cluster
from cluster import TestClient
from test_kafka_listener import kafka_request

from protocol.errors import ErrorCode
from protocol.kafka.apis import CREATE_TOPICS
from protocol.messages import CreatableTopic
from protocol.messages import CreatableTopicResult
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DeleteTopicsRequest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def create_request(*names: str) -> CreateTopicsRequest:
    return CreateTopicsRequest(
        topics=[CreatableTopic(name=n, num_partitions=1, replication_factor=1) for n in names]
    )


def answers(resp: CreateTopicsResponse) -> dict[str, tuple[str, str | None]]:
    def named(r: CreatableTopicResult) -> tuple[str, str | None]:
        return ErrorCode(r.error_code).name, r.error_message

    return {r.name: named(r) for r in resp.topics}


async def test_topic_names_that_collide_on_dot_and_underscore_are_refused(
    cluster: Cluster,
) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, kafka=True)
    async with TestClient(*broker.address) as client:
        assert answers(await client.call(create_request("a.b")))["a.b"][0] == "NONE"
        native = answers(await client.call(create_request("a_b", "c.d", "c_d")))
        kafka = await kafka_request(broker.kafka_address, CREATE_TOPICS, 4, create_request("a_b"))
        assert isinstance(kafka, CreateTopicsResponse)
        # The name freed by a deletion can be taken by its colliding twin.
        await client.call(DeleteTopicsRequest(topic_names=["a.b"]))
        after_delete = answers(await client.call(create_request("a_b")))
    code, message = native["a_b"]
    assert code == "INVALID_TOPIC_EXCEPTION" and "'a.b'" in str(message), native
    # An earlier entry of the same request counts as existing.
    assert native["c.d"][0] == "NONE"
    assert native["c_d"][0] == "INVALID_TOPIC_EXCEPTION" and "'c.d'" in str(native["c_d"][1])
    code, message = answers(kafka)["a_b"]
    assert code == "INVALID_TOPIC_EXCEPTION" and "'a.b'" in str(message), answers(kafka)
    assert after_delete["a_b"][0] == "NONE", after_delete
