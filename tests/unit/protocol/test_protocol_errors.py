"""ErrorCode: Kafka's numbers and names, and which ones a client may retry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from protocol.errors import CorruptRecordError
from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.errors import FrameTooLargeError
from protocol.errors import ProtocolError

# Kafka's org.apache.kafka.common.protocol.Errors, for every code minibroker defines.
KAFKA_CODES = {
    "UNKNOWN_SERVER_ERROR": -1,
    "NONE": 0,
    "OFFSET_OUT_OF_RANGE": 1,
    "CORRUPT_MESSAGE": 2,
    "UNKNOWN_TOPIC_OR_PARTITION": 3,
    "INVALID_FETCH_SIZE": 4,
    "LEADER_NOT_AVAILABLE": 5,
    "NOT_LEADER_OR_FOLLOWER": 6,
    "REQUEST_TIMED_OUT": 7,
    "BROKER_NOT_AVAILABLE": 8,
    "REPLICA_NOT_AVAILABLE": 9,
    "MESSAGE_TOO_LARGE": 10,
    "OFFSET_METADATA_TOO_LARGE": 12,
    "NETWORK_EXCEPTION": 13,
    "COORDINATOR_LOAD_IN_PROGRESS": 14,
    "COORDINATOR_NOT_AVAILABLE": 15,
    "NOT_COORDINATOR": 16,
    "INVALID_TOPIC_EXCEPTION": 17,
    "RECORD_LIST_TOO_LARGE": 18,
    "NOT_ENOUGH_REPLICAS": 19,
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND": 20,
    "INVALID_REQUIRED_ACKS": 21,
    "INVALID_GROUP_ID": 24,
    "INVALID_COMMIT_OFFSET_SIZE": 28,
    "TOPIC_AUTHORIZATION_FAILED": 29,
    "GROUP_AUTHORIZATION_FAILED": 30,
    "CLUSTER_AUTHORIZATION_FAILED": 31,
    "INVALID_TIMESTAMP": 32,
    "UNSUPPORTED_SASL_MECHANISM": 33,
    "ILLEGAL_SASL_STATE": 34,
    "UNSUPPORTED_VERSION": 35,
    "TOPIC_ALREADY_EXISTS": 36,
    "INVALID_PARTITIONS": 37,
    "INVALID_REPLICATION_FACTOR": 38,
    "INVALID_REPLICA_ASSIGNMENT": 39,
    "INVALID_CONFIG": 40,
    "NOT_CONTROLLER": 41,
    "INVALID_REQUEST": 42,
    "POLICY_VIOLATION": 44,
    "OUT_OF_ORDER_SEQUENCE_NUMBER": 45,
    "DUPLICATE_SEQUENCE_NUMBER": 46,
    "INVALID_PRODUCER_EPOCH": 47,
    "SECURITY_DISABLED": 54,
    "KAFKA_STORAGE_ERROR": 56,
    "SASL_AUTHENTICATION_FAILED": 58,
    "UNKNOWN_PRODUCER_ID": 59,
    "FENCED_LEADER_EPOCH": 74,
    "UNKNOWN_LEADER_EPOCH": 75,
    "STALE_BROKER_EPOCH": 77,
    "OFFSET_NOT_AVAILABLE": 78,
    "PREFERRED_LEADER_NOT_AVAILABLE": 80,
    "ELIGIBLE_LEADERS_NOT_AVAILABLE": 83,
    "ELECTION_NOT_NEEDED": 84,
    "INVALID_RECORD": 87,
    "THROTTLING_QUOTA_EXCEEDED": 89,
    "RESOURCE_NOT_FOUND": 91,
    "DUPLICATE_RESOURCE": 92,
    "UNACCEPTABLE_CREDENTIAL": 93,
    "INCONSISTENT_VOTER_SET": 94,
    "INVALID_UPDATE_VERSION": 95,
    "SNAPSHOT_NOT_FOUND": 98,
    "DUPLICATE_BROKER_REGISTRATION": 101,
    "INCONSISTENT_CLUSTER_ID": 104,
    "INELIGIBLE_REPLICA": 107,
    "NEW_LEADER_ELECTED": 108,
    "ILLEGAL_GENERATION": 22,
    "INCONSISTENT_GROUP_PROTOCOL": 23,
    "UNKNOWN_MEMBER_ID": 25,
    "INVALID_SESSION_TIMEOUT": 26,
    "REBALANCE_IN_PROGRESS": 27,
    "NON_EMPTY_GROUP": 68,
    "GROUP_ID_NOT_FOUND": 69,
    "FETCH_SESSION_ID_NOT_FOUND": 70,
    "INVALID_FETCH_SESSION_EPOCH": 71,
    "MEMBER_ID_REQUIRED": 79,
    "GROUP_MAX_SIZE_REACHED": 81,
    "FENCED_INSTANCE_ID": 82,
}

# The list in DESIGN.md section 4, checked by hand against Kafka.
DESIGN_SECTION_4 = {
    "NONE": 0,
    "OFFSET_OUT_OF_RANGE": 1,
    "CORRUPT_MESSAGE": 2,
    "UNKNOWN_TOPIC_OR_PARTITION": 3,
    "NOT_LEADER_OR_FOLLOWER": 6,
    "REQUEST_TIMED_OUT": 7,
    "NOT_ENOUGH_REPLICAS": 19,
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND": 20,
    "INVALID_REQUEST": 42,
    "UNSUPPORTED_VERSION": 35,
    "FENCED_LEADER_EPOCH": 74,
    "UNKNOWN_LEADER_EPOCH": 75,
    "STALE_BROKER_EPOCH": 77,
    "INVALID_UPDATE_VERSION": 95,
    "INELIGIBLE_REPLICA": 107,
}

DESIGN_MD = Path(__file__).resolve().parents[4] / "shared" / "DESIGN.md"


@pytest.mark.parametrize(("name", "number"), DESIGN_SECTION_4.items())
def test_design_section_4_codes_match_kafka(name: str, number: int) -> None:
    assert ErrorCode[name] == number
    assert ErrorCode(number).name == name


def test_design_md_still_names_the_same_codes() -> None:
    """If DESIGN.md section 4 grows a code, this list (and ErrorCode) must follow."""
    if not DESIGN_MD.exists():
        pytest.skip("shared/DESIGN.md is not beside the repository")
    section = DESIGN_MD.read_text().split("## 4.", 1)[1].split("\n## ", 1)[0]
    named = dict(re.findall(r"`([A-Z_]+) (-?\d+)`", section))
    assert {k: int(v) for k, v in named.items()} == DESIGN_SECTION_4


def test_every_code_has_kafkas_number_and_name() -> None:
    assert {c.name: int(c) for c in ErrorCode} == KAFKA_CODES


def test_codes_are_unique_int16() -> None:
    values = [int(c) for c in ErrorCode]
    assert len(values) == len(set(values))  # no aliases hiding a typo
    assert all(-(2**15) <= v < 2**15 for v in values)


@pytest.mark.parametrize(
    ("code", "retriable"),
    [
        (ErrorCode.FENCED_LEADER_EPOCH, True),
        (ErrorCode.UNKNOWN_LEADER_EPOCH, True),
        (ErrorCode.NOT_LEADER_OR_FOLLOWER, True),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, True),
        (ErrorCode.LEADER_NOT_AVAILABLE, True),
        (ErrorCode.NOT_ENOUGH_REPLICAS, True),
        (ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, True),
        (ErrorCode.REQUEST_TIMED_OUT, True),
        (ErrorCode.NOT_CONTROLLER, True),
        (ErrorCode.CORRUPT_MESSAGE, True),
        (ErrorCode.NONE, False),
        (ErrorCode.OFFSET_OUT_OF_RANGE, False),
        (ErrorCode.STALE_BROKER_EPOCH, False),
        (ErrorCode.INVALID_REQUEST, False),
        (ErrorCode.UNSUPPORTED_VERSION, False),
        (ErrorCode.UNKNOWN_SERVER_ERROR, False),
        (ErrorCode.MESSAGE_TOO_LARGE, False),
        (ErrorCode.TOPIC_ALREADY_EXISTS, False),
        (ErrorCode.INVALID_CONFIG, False),
        (ErrorCode.INCONSISTENT_CLUSTER_ID, False),
        (ErrorCode.INVALID_UPDATE_VERSION, False),
    ],
    ids=lambda v: v.name if isinstance(v, ErrorCode) else ("retriable" if v else "final"),
)
def test_retriable(code: ErrorCode, retriable: bool) -> None:
    assert code.retriable is retriable


def test_exception_hierarchy() -> None:
    """Callers catch DecodeError to close a connection; every decoder failure is one."""
    assert issubclass(DecodeError, ProtocolError)
    assert issubclass(FrameTooLargeError, DecodeError)
    assert issubclass(CorruptRecordError, DecodeError)
