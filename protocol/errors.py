"""Error codes (Kafka's numbers and names) and the protocol's own exceptions.

Users look codes up in Kafka's documentation, so numbers and names are Kafka's.
`retriable` says whether a client may retry the same request after refreshing
metadata or backing off; everything else is a final answer.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    SECURITY_DISABLED = 54
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    UNKNOWN_PRODUCER_ID = 59
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    OFFSET_NOT_AVAILABLE = 78
    MEMBER_ID_REQUIRED = 79
    STALE_BROKER_EPOCH = 77
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    THROTTLING_QUOTA_EXCEEDED = 89
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92
    UNACCEPTABLE_CREDENTIAL = 93
    INCONSISTENT_VOTER_SET = 94
    INVALID_UPDATE_VERSION = 95
    SNAPSHOT_NOT_FOUND = 98
    INCONSISTENT_CLUSTER_ID = 104
    INELIGIBLE_REPLICA = 107
    NEW_LEADER_ELECTED = 108
    DUPLICATE_BROKER_REGISTRATION = 101
    INVALID_RECORD = 87

    @property
    def retriable(self) -> bool:
        return self in _RETRIABLE

    @classmethod
    def of(cls, value: int) -> ErrorCode:
        """A code from the wire; one this build does not know is a server error."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN_SERVER_ERROR


_RETRIABLE = frozenset(
    {
        # Kafka marks it retriable: the bytes may have been damaged in flight.
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.NOT_CONTROLLER,
        ErrorCode.KAFKA_STORAGE_ERROR,
        # KIP-227: the fetcher starts a new session with a full fetch.
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
        ErrorCode.INVALID_FETCH_SESSION_EPOCH,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.OFFSET_NOT_AVAILABLE,
        ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
        ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
        ErrorCode.THROTTLING_QUOTA_EXCEEDED,
    }
)


# Produce answers a leader gives only before it appends a batch (broker/replica_manager.py
# checks these first), so that attempt is not in its log. Every other answer may come
# after the append: REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND and
# NOT_LEADER_OR_FOLLOWER end a wait for the ISR, KAFKA_STORAGE_ERROR a failed write. A
# producer must treat those, and a lost answer, as "the batch may have been written".
PRODUCE_REFUSED_BEFORE_APPEND = frozenset(
    {
        ErrorCode.INVALID_REQUIRED_ACKS,
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.INVALID_RECORD,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.RECORD_LIST_TOO_LARGE,
        ErrorCode.INVALID_TIMESTAMP,
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
        ErrorCode.UNKNOWN_PRODUCER_ID,
        ErrorCode.INVALID_PRODUCER_EPOCH,
    }
)


class ProtocolError(Exception):
    """Base of every exception raised by the protocol package."""


class DecodeError(ProtocolError):
    """Bytes that do not decode to what they claim to be. The only exception any
    decoder in this package raises for bad input."""


class FrameTooLargeError(DecodeError):
    """A frame header announced more bytes than the receiver accepts."""


class CorruptRecordError(DecodeError):
    """A record batch failed validation (length, magic, CRC, offsets)."""


class InvalidRecordError(CorruptRecordError):
    """A batch whose header and CRC are sound but whose records break the format's
    rules (they do not parse, their count or offsets disagree with the header) or
    that a client may not write (control or transactional batches). A broker answers
    INVALID_RECORD for it, as Kafka does; a reader treats it as any corrupt batch."""
