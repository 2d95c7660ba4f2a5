"""Error-code mapping: every Kafka code has a class carrying it, with Kafka's
retriable flag, and the client's own failures say what to do."""

from __future__ import annotations

import pytest

from client import errors
from client.errors import BrokerResponseError
from client.errors import ConnectionFailedError
from client.errors import FencedLeaderEpochError
from client.errors import MinibrokerError
from client.errors import NoBrokersAvailableError
from client.errors import NotLeaderOrFollowerError
from client.errors import OffsetOutOfRangeError
from client.errors import UnknownLeaderEpochError
from client.errors import UnknownTopicOrPartitionError
from client.errors import error_class_for
from client.errors import error_for
from client.types import TopicPartition
from protocol.errors import ErrorCode

ERROR_CODES = [c for c in ErrorCode if c != ErrorCode.NONE]


@pytest.mark.parametrize("code", ERROR_CODES, ids=lambda c: c.name)
def test_every_code_maps_to_a_class_carrying_it(code: ErrorCode) -> None:
    cls = error_class_for(code)
    assert issubclass(cls, BrokerResponseError)
    assert issubclass(cls, MinibrokerError)
    exc = error_for(code, "details", topic="t", partition=2)
    assert isinstance(exc, cls)
    assert exc.error_code == code
    assert exc.retriable == code.retriable
    assert code.name in str(exc) and "details" in str(exc) and "t-2" in str(exc)


@pytest.mark.parametrize("code", ERROR_CODES, ids=lambda c: c.name)
def test_every_code_has_its_own_class(code: ErrorCode) -> None:
    assert error_class_for(code) is not BrokerResponseError
    assert error_class_for(code).error_code == code


@pytest.mark.parametrize(
    ("code", "cls", "retriable", "invalid_metadata"),
    [
        (ErrorCode.NOT_LEADER_OR_FOLLOWER, NotLeaderOrFollowerError, True, True),
        (ErrorCode.FENCED_LEADER_EPOCH, FencedLeaderEpochError, True, True),
        (ErrorCode.UNKNOWN_LEADER_EPOCH, UnknownLeaderEpochError, True, True),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UnknownTopicOrPartitionError, True, True),
        (ErrorCode.OFFSET_OUT_OF_RANGE, OffsetOutOfRangeError, False, False),
        (ErrorCode.TOPIC_ALREADY_EXISTS, errors.TopicAlreadyExistsError, False, False),
        (ErrorCode.INVALID_REPLICATION_FACTOR, errors.InvalidReplicationFactorError, False, False),
        (ErrorCode.CORRUPT_MESSAGE, errors.CorruptRecordError, True, False),
        (ErrorCode.NOT_ENOUGH_REPLICAS, errors.NotEnoughReplicasError, True, False),
    ],
)
def test_common_codes(code: ErrorCode, cls: type, retriable: bool, invalid_metadata: bool) -> None:
    assert error_class_for(code) is cls
    exc = error_for(code)
    assert exc.retriable is retriable
    assert exc.invalid_metadata is invalid_metadata
    assert exc.description in str(exc)  # no message: the class says what it means


def test_numbers_are_kafkas() -> None:
    assert error_class_for(74) is FencedLeaderEpochError
    assert error_class_for(6) is NotLeaderOrFollowerError


def test_unknown_code_keeps_its_number() -> None:
    assert error_class_for(9999) is BrokerResponseError
    exc = error_for(9999, "what")
    assert "9999" in str(exc)
    assert exc.error_code == ErrorCode.UNKNOWN_SERVER_ERROR


def test_none_is_not_an_error() -> None:
    with pytest.raises(ValueError):
        error_class_for(ErrorCode.NONE)


def test_offset_out_of_range_carries_offsets() -> None:
    tp = TopicPartition("t", 0)
    exc = OffsetOutOfRangeError("gone", offsets={tp: 42}, topic="t", partition=0)
    assert exc.offsets == {tp: 42}
    assert exc.error_code == ErrorCode.OFFSET_OUT_OF_RANGE


def test_client_side_errors_say_what_to_do() -> None:
    exc = NoBrokersAvailableError(["127.0.0.1:1"], {"127.0.0.1:1": "Connection refused"})
    text = str(exc)
    assert "127.0.0.1:1" in text and "Connection refused" in text
    assert "minibroker dev" in text
    assert exc.retriable
    assert ConnectionFailedError("x").retriable
    assert ConnectionFailedError("x").invalid_metadata
