"""DescribeAcls, CreateAcls and DeleteAcls in the Kafka codec (protocol/kafka/acl_apis.py),
against kafka-python 3.0.12's protocol classes (what its KafkaAdminClient sends): its
bytes decode to the native messages the broker's ACL handlers serve (a null name,
principal or host in a filter stays None: it matches every one), and encode back to
the same bytes; answers both ways. Field-by-field against Kafka's definitions:
test_kafka_codec_kio.py.

Then the hostile side, for these APIs in particular: every truncation of a valid
request, a lying count, random bodies, and the unserved v0 are refused with a
DecodeError or a refusal, never another exception.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from kafka.protocol.admin import CreateAclsRequest as KCreateAclsRequest
from kafka.protocol.admin import CreateAclsResponse as KCreateAclsResponse
from kafka.protocol.admin import DeleteAclsRequest as KDeleteAclsRequest
from kafka.protocol.admin import DeleteAclsResponse as KDeleteAclsResponse
from kafka.protocol.admin import DescribeAclsRequest as KDescribeAclsRequest
from kafka.protocol.admin import DescribeAclsResponse as KDescribeAclsResponse

from protocol.connection import DecodedRequest
from protocol.connection import Refusal
from protocol.errors import ErrorCode
from protocol.kafka.apis import CREATE_ACLS
from protocol.kafka.apis import DELETE_ACLS
from protocol.kafka.apis import DESCRIBE_ACLS
from protocol.kafka.apis import KafkaApi
from protocol.kafka.codec import decode_request
from protocol.messages import AclCreation
from protocol.messages import AclDescription
from protocol.messages import AclFilterSpec
from protocol.messages import AclResource
from protocol.messages import CreateAclsRequest
from protocol.messages import CreateAclsResponse
from protocol.messages import DeleteAclsMatchingAcl
from protocol.messages import DeleteAclsRequest
from protocol.messages import DeleteAclsResponse
from protocol.messages import DescribeAclsRequest
from protocol.messages import DescribeAclsResponse
from runtime.acl import AclBinding
from runtime.acl import AclOperation
from runtime.acl import AclPermission
from runtime.acl import PatternType
from runtime.acl import ResourceType
from tests.unit.protocol.test_kafka_codec import kafka_python_request
from tests.unit.protocol.test_kafka_codec import refused_or_decoded
from tests.unit.protocol.test_kafka_codec_data_apis import request_both_ways
from tests.unit.protocol.test_kafka_codec_data_apis import response_both_ways

ACL_APIS = (DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS)
ANY = 1  # Kafka's ANY, in every enum
# Two ACLs as the native messages spell them (Kafka's codes).
ALICE_WRITES = AclBinding(
    ResourceType.TOPIC,
    "orders-",
    PatternType.PREFIXED,
    "User:alice",
    "*",
    AclOperation.WRITE,
    AclPermission.ALLOW,
).wire_fields()
MALLORY_DENIED = AclBinding(
    ResourceType.GROUP,
    "app",
    PatternType.LITERAL,
    "User:mallory",
    "10.0.0.9",
    AclOperation.READ,
    AclPermission.DENY,
).wire_fields()
# Every principal and host (null), any operation: only the topic name is asked for.
WIDE_FILTER = {
    "resource_type": int(ResourceType.TOPIC),
    "resource_name": "orders",
    "pattern_type": int(PatternType.MATCH),
    "principal": None,
    "host": None,
    "operation": ANY,
    "permission_type": int(AclPermission.ALLOW),
}
# Every ACL of alice's: ANY and null everywhere else.
ALICE_ONLY = {k: None if k in ("resource_name", "host") else ANY for k in MALLORY_DENIED}
ALICE_ONLY["principal"] = "User:alice"
FILTERED = ("resource_type", "resource_name", "pattern_type", "principal", "host")


def served(api: KafkaApi) -> range:
    return range(api.min_version, api.max_version + 1)


def kafka_filter(native: dict[str, Any]) -> dict[str, Any]:
    """A native filter's fields under Kafka's names ("_filter" suffixed)."""
    return {f"{k}_filter" if k in FILTERED else k: v for k, v in native.items()}


def k_describe(version: int) -> Any:
    return KDescribeAclsRequest(**kafka_filter(WIDE_FILTER))


def k_create(version: int) -> Any:
    def creation(acl: dict[str, Any]) -> Any:
        fields = {k: v for k, v in acl.items() if k != "pattern_type"}
        return KCreateAclsRequest.AclCreation(resource_pattern_type=acl["pattern_type"], **fields)

    return KCreateAclsRequest(creations=[creation(ALICE_WRITES), creation(MALLORY_DENIED)])


def k_delete(version: int) -> Any:
    f = KDeleteAclsRequest.DeleteAclsFilter
    return KDeleteAclsRequest(
        filters=[f(**kafka_filter(ALICE_ONLY)), f(**kafka_filter(MALLORY_DENIED))]
    )


@pytest.mark.parametrize("version", served(DESCRIBE_ACLS))
def test_describe_acls(version: int) -> None:
    body = request_both_ways(DESCRIBE_ACLS, k_describe(version), version)
    assert body == DescribeAclsRequest(**WIDE_FILTER)
    resource = ("resource_type", "resource_name", "pattern_type")

    def entry(acl: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in acl.items() if k not in resource}

    r = KDescribeAclsResponse.DescribeAclsResource
    answer = KDescribeAclsResponse(
        throttle_time_ms=250,
        error_code=0,
        error_message=None,
        resources=[
            r(
                **{k: ALICE_WRITES[k] for k in resource},
                acls=[r.AclDescription(**entry(a)) for a in (ALICE_WRITES, MALLORY_DENIED)],
            )
        ],
    )
    back = response_both_ways(DESCRIBE_ACLS, answer, version)
    assert back == DescribeAclsResponse(
        throttle_time_ms=250,
        resources=[
            AclResource(
                **{k: ALICE_WRITES[k] for k in resource},
                acls=[AclDescription(**entry(a)) for a in (ALICE_WRITES, MALLORY_DENIED)],
            )
        ],
    )
    # The refusal kafka-python raises from (SecurityDisabledError with the message).
    refused = KDescribeAclsResponse(
        throttle_time_ms=0,
        error_code=int(ErrorCode.SECURITY_DISABLED),
        error_message="no authorizer",
        resources=[],
    )
    back = response_both_ways(DESCRIBE_ACLS, refused, version)
    assert (back.error_code, back.error_message) == (ErrorCode.SECURITY_DISABLED, "no authorizer")


@pytest.mark.parametrize("version", served(CREATE_ACLS))
def test_create_acls(version: int) -> None:
    body = request_both_ways(CREATE_ACLS, k_create(version), version)
    assert body == CreateAclsRequest(
        creations=[AclCreation(**ALICE_WRITES), AclCreation(**MALLORY_DENIED)]
    )
    r = KCreateAclsResponse.AclCreationResult
    answer = KCreateAclsResponse(
        throttle_time_ms=0,
        results=[
            r(error_code=0, error_message=None),
            r(error_code=int(ErrorCode.INVALID_REQUEST), error_message="bad operation"),
        ],
    )
    back = response_both_ways(CREATE_ACLS, answer, version)
    assert isinstance(back, CreateAclsResponse)
    assert [(x.error_code, x.error_message) for x in back.results] == [
        (0, None),
        (ErrorCode.INVALID_REQUEST, "bad operation"),
    ]


@pytest.mark.parametrize("version", served(DELETE_ACLS))
def test_delete_acls(version: int) -> None:
    body = request_both_ways(DELETE_ACLS, k_delete(version), version)
    assert body == DeleteAclsRequest(
        filters=[AclFilterSpec(principal="User:alice"), AclFilterSpec(**MALLORY_DENIED)]
    )
    r = KDeleteAclsResponse.DeleteAclsFilterResult
    matched = r.DeleteAclsMatchingAcl(error_code=0, error_message=None, **ALICE_WRITES)
    answer = KDeleteAclsResponse(
        throttle_time_ms=0,
        filter_results=[
            r(error_code=0, error_message=None, matching_acls=[matched]),
            r(error_code=0, error_message=None, matching_acls=[]),
        ],
    )
    back = response_both_ways(DELETE_ACLS, answer, version)
    assert isinstance(back, DeleteAclsResponse)
    assert [r.matching_acls for r in back.filter_results] == [
        [DeleteAclsMatchingAcl(**ALICE_WRITES)],
        [],
    ]


# ------------------------------------------------------------------ hostile input

REQUESTS = ((DESCRIBE_ACLS, k_describe), (CREATE_ACLS, k_create), (DELETE_ACLS, k_delete))
VALID = [kafka_python_request(make(v), v) for api, make in REQUESTS for v in served(api)]


@pytest.mark.parametrize("payload", VALID, ids=range(len(VALID)))
def test_every_truncation_of_an_acl_request_is_refused(payload: bytes) -> None:
    for cut in range(len(payload)):
        assert not isinstance(refused_or_decoded(payload[:cut]), DecodedRequest), cut


@pytest.mark.parametrize("version", served(CREATE_ACLS))
def test_a_lying_creations_count_is_refused_before_anything_is_allocated(version: int) -> None:
    payload = bytearray(kafka_python_request(KCreateAclsRequest(creations=[]), version))
    if CREATE_ACLS.flexible(version):  # compact count (n+1) then the tagged-field count
        payload[-2:] = b"\xff\xff\xff\xff\x07\x00"  # 2**31-2 creations, none there
    else:
        payload[-4:] = (2**31 - 1).to_bytes(4, "big")
    got = decode_request(bytes(payload))
    assert isinstance(got, Refusal) and "cannot fit" in got.message


def test_version_0_is_refused_as_unserved() -> None:
    """v0 has no pattern type: not served, rather than read as a filter for ANY."""
    for api, make in REQUESTS:
        payload = bytearray(kafka_python_request(make(1), 1))
        payload[2:4] = (0).to_bytes(2, "big")
        got = decode_request(bytes(payload))
        assert isinstance(got, Refusal) and got.error == ErrorCode.UNSUPPORTED_VERSION, api.key
        assert "version 0 is not served (1..3)" in got.message


@settings(max_examples=300, deadline=None)
@given(
    api=st.sampled_from(ACL_APIS),
    version=st.integers(1, 3),
    body=st.binary(max_size=200),
)
def test_random_acl_bodies_are_decoded_or_refused(api: KafkaApi, version: int, body: bytes) -> None:
    header = int(api.key).to_bytes(2, "big") + version.to_bytes(2, "big") + b"\x00\x00\x00\x01"
    header += b"\xff\xff"  # a null client id
    if api.flexible(version):
        header += b"\x00"  # the request header's tagged fields
    refused_or_decoded(header + body)  # anything but DecodeError / a refusal fails here
