"""The Kafka codec (protocol/kafka) against an oracle: kafka-python 3.0.12's protocol
classes (a test dependency only). For every API and version served, what kafka-python
encodes decodes here to the expected native message, and what is encoded here is
byte-for-byte what kafka-python encodes for the same values, requests and responses.
Then the hostile side: every truncation of a valid frame, random bytes, and lying
lengths are refused with a DecodeError or a refusal, never another exception.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsRequest as KApiVersionsRequest
from kafka.protocol.metadata import ApiVersionsResponse as KApiVersionsResponse
from kafka.protocol.metadata import MetadataRequest as KMetadataRequest
from kafka.protocol.metadata import MetadataResponse as KMetadataResponse
from kafka.protocol.sasl import SaslHandshakeRequest as KSaslHandshakeRequest
from kafka.protocol.sasl import SaslHandshakeResponse as KSaslHandshakeResponse

from protocol.connection import DecodedRequest
from protocol.connection import Refusal
from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.framing import RequestHeader
from protocol.kafka.apis import API_VERSIONS
from protocol.kafka.apis import KAFKA_APIS
from protocol.kafka.apis import METADATA
from protocol.kafka.apis import SASL_HANDSHAKE
from protocol.kafka.apis import KafkaApi
from protocol.kafka.codec import KAFKA
from protocol.kafka.codec import decode_request
from protocol.kafka.codec import decode_response
from protocol.kafka.codec import encode_request
from protocol.kafka.codec import encode_response
from protocol.messages import ApiVersionRange
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import SaslHandshakeRequest
from protocol.messages import SaslHandshakeResponse

CORRELATION_ID = 7
CLIENT_ID = "oracle"


def versions_of(api: KafkaApi) -> list[int]:
    return list(range(api.min_version, api.max_version + 1))


def kafka_python_request(message: Any, version: int) -> bytes:
    """kafka-python's frame payload (header and body) of `message` at `version`."""
    message.with_header(correlation_id=CORRELATION_ID, client_id=CLIENT_ID)
    return bytes(message.encode(version=version, header=True))


def kafka_python_response(message: Any, version: int) -> bytes:
    message.API_VERSION = version  # before the header: its setter trips over a response one
    message.with_header(correlation_id=CORRELATION_ID)
    return bytes(message.encode(header=True))


def our_response(api: KafkaApi, version: int, body: Any) -> bytes:
    header = RequestHeader(int(api.key), version, CORRELATION_ID, CLIENT_ID)
    return b"".join(encode_response(header, body))[4:]  # without the frame length


# ------------------------------------------------------------------ the messages, both ways

METADATA_TOPICS = ["orders", "audit"]


def k_metadata_request(version: int) -> Any:
    topic = KMetadataRequest.MetadataRequestTopic
    return KMetadataRequest(
        topics=[topic(name=n) for n in METADATA_TOPICS],
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def k_metadata_response(version: int) -> Any:
    r = KMetadataResponse
    return r(
        throttle_time_ms=0,
        brokers=[
            r.MetadataResponseBroker(node_id=1, host="localhost", port=19092, rack=None),
            r.MetadataResponseBroker(node_id=2, host="localhost", port=19094, rack="r2"),
        ],
        cluster_id="mb-cluster",
        controller_id=1,
        topics=[
            r.MetadataResponseTopic(
                error_code=0,
                name="orders",
                is_internal=False,
                partitions=[
                    r.MetadataResponseTopic.MetadataResponsePartition(
                        error_code=0,
                        partition_index=0,
                        leader_id=2,
                        leader_epoch=4,
                        replica_nodes=[2, 1],
                        isr_nodes=[2],
                        offline_replicas=[1],
                    )
                ],
                authorized_operations={31},  # bit 31 alone: -2**31, "not asked for"
            ),
            r.MetadataResponseTopic(
                error_code=3,
                name="audit",
                is_internal=False,
                partitions=[],
                authorized_operations={31},  # bit 31 alone: -2**31, "not asked for"
            ),
        ],
        authorized_operations={31},  # bit 31 alone: -2**31, "not asked for"
    )


API_VERSIONS_ANSWER = [ApiVersionRange(api_key=3, min_version=0, max_version=9)]


@pytest.mark.parametrize("version", versions_of(METADATA))
def test_metadata_request_from_kafka_python(version: int) -> None:
    got = decode_request(kafka_python_request(k_metadata_request(version), version))
    assert isinstance(got, DecodedRequest), got
    assert got.header == RequestHeader(3, version, CORRELATION_ID, CLIENT_ID)
    assert got.body == MetadataRequest(topics=METADATA_TOPICS)
    ours = encode_request(METADATA, version, CORRELATION_ID, CLIENT_ID, got.body)
    assert ours[4:] == kafka_python_request(k_metadata_request(version), version)


def test_metadata_v0_empty_topic_list_asks_for_all_topics() -> None:
    empty = KMetadataRequest(topics=[])
    got = decode_request(kafka_python_request(empty, 0))
    assert isinstance(got, DecodedRequest)
    assert got.body.topics is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", [v for v in versions_of(METADATA) if v >= 1])
def test_metadata_null_topics_asks_for_all_topics(version: int) -> None:
    got = decode_request(kafka_python_request(KMetadataRequest(topics=None), version))
    assert isinstance(got, DecodedRequest)
    assert got.body.topics is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", versions_of(METADATA))
def test_metadata_response_as_kafka_python_writes_it(version: int) -> None:
    theirs = kafka_python_response(k_metadata_response(version), version)
    correlation_id, back = decode_response(METADATA, version, theirs)
    assert correlation_id == CORRELATION_ID
    assert our_response(METADATA, version, back) == theirs
    assert isinstance(back, MetadataResponse)
    assert [(b.node_id, b.port) for b in back.brokers] == [(1, 19092), (2, 19094)]
    assert [t.name for t in back.topics] == ["orders", "audit"]
    assert back.topics[1].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    partition = back.topics[0].partitions[0]
    assert (partition.leader_id, partition.replica_nodes, partition.isr_nodes) == (2, [2, 1], [2])
    # Fields a version does not carry come back as the native defaults.
    assert partition.leader_epoch == (4 if version >= 7 else -1)
    assert partition.offline_replicas == ([1] if version >= 5 else [])
    assert back.cluster_id == ("mb-cluster" if version >= 2 else None)
    assert back.brokers[1].rack == ("r2" if version >= 1 else None)


@pytest.mark.parametrize("version", versions_of(API_VERSIONS))
def test_api_versions_both_ways(version: int) -> None:
    request = KApiVersionsRequest(client_software_name="kp", client_software_version="3.0")
    got = decode_request(kafka_python_request(request, version))
    assert isinstance(got, DecodedRequest)
    expected = (
        ApiVersionsRequest(client_software_name="kp", client_software_version="3.0")
        if version >= 3
        else ApiVersionsRequest()
    )
    assert got.body == expected
    answer = ApiVersionsResponse(api_keys=API_VERSIONS_ANSWER)
    k_answer = KApiVersionsResponse(
        error_code=0,
        api_keys=[KApiVersionsResponse.ApiVersion(api_key=3, min_version=0, max_version=9)],
        throttle_time_ms=0,
    )
    assert our_response(API_VERSIONS, version, answer) == kafka_python_response(k_answer, version)


def test_sasl_handshake_v0_and_v1_both_ways() -> None:
    """v0 is served (librdkafka 2.0 starts SASL only if it is offered): one body for
    both versions; only after v0 do the tokens come as raw frames."""
    assert versions_of(SASL_HANDSHAKE) == [0, 1]
    for version in (0, 1):
        request = KSaslHandshakeRequest(mechanism="SCRAM-SHA-256")
        got = decode_request(kafka_python_request(request, version))
        assert isinstance(got, DecodedRequest)
        assert got.body == SaslHandshakeRequest(mechanism="SCRAM-SHA-256")
        assert KAFKA.raw_sasl_tokens_after(got.header) == (version == 0)
        answer = SaslHandshakeResponse(mechanisms=["SCRAM-SHA-256", "PLAIN"])
        k_answer = KSaslHandshakeResponse(error_code=0, mechanisms=["SCRAM-SHA-256", "PLAIN"])
        assert our_response(SASL_HANDSHAKE, version, answer) == kafka_python_response(
            k_answer, version
        )


def test_api_versions_of_an_unknown_version_is_answered_at_v0_with_the_ranges() -> None:
    """kafka-python 3.0 starts at ApiVersions v4: the v0 answer lets it downgrade."""
    request = KApiVersionsRequest(client_software_name="kp", client_software_version="3.0")
    got = decode_request(kafka_python_request(request, 4))
    assert isinstance(got, Refusal) and got.error == ErrorCode.UNSUPPORTED_VERSION
    parts = KAFKA.encode_error(got.header, got.error, got.message, None)
    assert parts is not None
    answer = KApiVersionsResponse.decode(b"".join(parts)[4:], version=0, header=True)
    assert answer.error_code == ErrorCode.UNSUPPORTED_VERSION
    served = {(k.api_key, k.min_version, k.max_version) for k in answer.api_keys}
    assert served == {(key, a.min_version, a.max_version) for key, a in KAFKA_APIS.items()}


def test_other_refusals_close_the_connection() -> None:
    unknown_api = kafka_python_request(KMetadataRequest(topics=None), 9)
    unknown_api = b"\x7f\x00" + unknown_api[2:]  # api key 32512
    too_new = kafka_python_request(KMetadataRequest(topics=None), 12)
    for payload in (unknown_api, too_new):
        got = decode_request(payload)
        assert isinstance(got, Refusal)
        assert KAFKA.encode_error(got.header, got.error, got.message, None) is None
    got = decode_request(too_new)
    assert isinstance(got, Refusal) and "METADATA version 12 is not served (0..9)" in got.message


# ------------------------------------------------------------------ hostile input

VALID = [kafka_python_request(k_metadata_request(v), v) for v in versions_of(METADATA)] + [
    kafka_python_request(
        KApiVersionsRequest(client_software_name="a", client_software_version="b"), v
    )
    for v in versions_of(API_VERSIONS)
]


def refused_or_decoded(payload: bytes) -> DecodedRequest | Refusal | None:
    try:
        return decode_request(payload)
    except DecodeError:
        return None


@pytest.mark.parametrize("payload", VALID, ids=range(len(VALID)))
def test_every_truncation_is_refused(payload: bytes) -> None:
    for cut in range(len(payload)):
        got = refused_or_decoded(payload[:cut])
        if isinstance(got, DecodedRequest):
            # Only a request whose body is empty at that version can stop early.
            assert got.header.api_key == 18 and got.header.api_version < 3 and cut == len(payload)
        assert not isinstance(got, DecodedRequest) or cut == len(payload)


def test_trailing_bytes_after_a_request_are_ignored_as_kafka_ignores_them() -> None:
    """librdkafka 2.16's all-topics Metadata v9 request, byte for byte as it sent it:
    its array count placeholder leaves 3 bytes after the body. Kafka's brokers ignore
    them; refusing them locked librdkafka out (its list_topics never got an answer)."""
    librdkafka = bytes.fromhex("0003000900000004000772646b61666b61000000000000000000")
    got = decode_request(librdkafka)
    assert isinstance(got, DecodedRequest), got
    assert got.header == RequestHeader(3, 9, 4, "rdkafka")
    assert got.body == MetadataRequest(topics=None)  # null: every topic


def test_a_lying_array_count_is_refused_before_anything_is_allocated() -> None:
    payload = bytearray(kafka_python_request(KMetadataRequest(topics=[]), 1))
    payload[-4:] = (2**31 - 1).to_bytes(4, "big")  # 2 billion topics, 0 bytes of them
    got = decode_request(bytes(payload))
    assert isinstance(got, Refusal)
    assert "cannot fit" in got.message


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(sorted(KAFKA_APIS)),
    version=st.integers(0, 12),
    body=st.binary(max_size=200),
)
def test_random_bodies_are_decoded_or_refused(key: int, version: int, body: bytes) -> None:
    header = key.to_bytes(2, "big") + version.to_bytes(2, "big") + b"\x00\x00\x00\x01\xff\xff"
    refused_or_decoded(header + body)  # anything but DecodeError / a refusal fails here
