"""The client's exceptions.

`MinibrokerError` is the root of everything the client raises on purpose. Broker
answers with a non-zero error code become a `BrokerResponseError` subclass named as in
kafka-python (`NotLeaderOrFollowerError`, `FencedLeaderEpochError`, ...), carrying the
Kafka `ErrorCode`, so users can look the number up; `error_class_for(code)` maps any
code to its class. `retriable` says whether retrying (after a metadata refresh when
`invalid_metadata` is set) may succeed; the producer and consumer do that themselves
within their time budgets.

The client's own failures (no broker reachable, a connection that dropped, an answer
that did not come in time) say which address and what to do next.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import ClassVar

from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from client.types import OffsetAndMetadata
    from client.types import TopicPartition

START_HINT = "is the cluster running? start one with `minibroker dev`"


class MinibrokerError(Exception):
    """Root of every exception the client raises on purpose."""

    retriable: ClassVar[bool] = False
    # Retrying only helps after refreshing metadata (the leader moved, a topic appeared).
    invalid_metadata: ClassVar[bool] = False


# ------------------------------------------------------------------ client-side failures


class ConnectionFailedError(MinibrokerError):
    """Could not connect to a broker, or the connection dropped."""

    retriable = True
    invalid_metadata = True

    def __init__(
        self,
        message: str,
        *,
        host: str = "",
        port: int = -1,
        node_id: int = -1,
        reason: str = "",
    ):
        super().__init__(message)
        self.host = host
        self.port = port
        self.node_id = node_id
        self.reason = reason or message  # the short why ("Connection refused")


def short_reason(exc: MinibrokerError) -> str:
    """One line for a report: the why without the how-to-start hint."""
    if isinstance(exc, ConnectionFailedError):
        return exc.reason
    text = str(exc)
    cut = text.find(f"; {START_HINT}")
    return text[:cut] if cut >= 0 else text


class NoBrokersAvailableError(MinibrokerError):
    """None of the bootstrap servers (or known brokers) answered."""

    retriable = True

    def __init__(self, addresses: list[str], reasons: Mapping[str, str] | None = None):
        self.addresses = list(addresses)
        self.reasons = dict(reasons or {})
        detail = "; ".join(f"{a}: {r}" for a, r in self.reasons.items())
        message = f"no broker reachable at {','.join(self.addresses) or '(none given)'}"
        if detail:
            message += f" ({detail})"
        super().__init__(f"{message}; {START_HINT}, or pass --bootstrap-server HOST:PORT")


class KafkaTimeoutError(MinibrokerError):
    """An operation did not finish within its time budget (delivery timeout,
    max_block_ms, waiting for metadata)."""

    retriable = True


class PossiblyWrittenError(KafkaTimeoutError):
    """The producer gave up on a batch whose outcome it does not know: an earlier
    attempt reached the leader and its answer was lost (or said the wait for the ISR
    failed after the append), and the batch could not be resolved under its original
    producer id, epoch and sequence before its delivery timeout (or the leader fenced
    that epoch). Its records may or may not be in the log (librdkafka's "possibly
    persisted"): read the partition to find out; sending them again may write them
    twice."""


class IllegalStateError(MinibrokerError):
    """The client was used in a way its state does not allow (closed, not started,
    partition not assigned)."""


class NoOffsetForPartitionError(MinibrokerError):
    """A partition has no position and auto_offset_reset is 'none'."""

    def __init__(self, partitions: list[TopicPartition]):
        self.partitions = list(partitions)
        names = ", ".join(str(tp) for tp in self.partitions)
        super().__init__(
            f"no position for {names} and auto_offset_reset='none': seek() first, "
            "or use auto_offset_reset='earliest' or 'latest'"
        )


class LogTruncationError(MinibrokerError):
    """The log was truncated below the consumer's position (KIP-320): records the
    consumer already returned are gone from the current lineage. `divergent_offsets`
    maps each partition to an OffsetAndMetadata(first offset that differs, "", leader
    epoch ending there): seek() to it to resume on the new lineage. `positions` holds
    the positions the consumer had."""

    def __init__(
        self,
        message: str,
        divergent_offsets: Mapping[TopicPartition, OffsetAndMetadata],
        positions: Mapping[TopicPartition, int] | None = None,
    ):
        super().__init__(message)
        self.divergent_offsets = dict(divergent_offsets)
        self.positions = dict(positions or {})


# ------------------------------------------------------------------ broker answers


class BrokerResponseError(MinibrokerError):
    """A broker answered with a non-zero Kafka error code."""

    error_code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(
        self,
        message: str = "",
        *,
        error_code: ErrorCode | None = None,
        topic: str | None = None,
        partition: int | None = None,
    ):
        if error_code is not None:
            self.error_code = error_code
        self.message = message
        self.topic = topic
        self.partition = partition
        super().__init__(self._render())

    @property
    def retriable(self) -> bool:  # type: ignore[override]
        """Whether retrying may succeed (the Kafka code's retriable flag)."""
        return self.error_code.retriable

    @property
    def description(self) -> str:
        """One line saying what the code means."""
        doc = type(self).__doc__ or ""
        return doc.strip().splitlines()[0] if doc.strip() else self.error_code.name

    def _render(self) -> str:
        text = f"{self.error_code.name} ({int(self.error_code)})"
        text += f": {self.message}" if self.message else f": {self.description}"
        if self.topic is not None:
            where = self.topic if self.partition is None else f"{self.topic}-{self.partition}"
            if self.partition is not None or f"'{self.topic}'" not in self.message:
                text += f" [{where}]"
        return text


class UnknownServerError(BrokerResponseError):
    """The broker hit an unexpected error; its log says more."""

    error_code = ErrorCode.UNKNOWN_SERVER_ERROR


class OffsetOutOfRangeError(BrokerResponseError):
    """The requested offset is outside the partition's [log start, end] range."""

    error_code = ErrorCode.OFFSET_OUT_OF_RANGE

    def __init__(
        self,
        message: str = "",
        *,
        offsets: Mapping[TopicPartition, int] | None = None,
        **kwargs: object,
    ):
        self.offsets = dict(offsets or {})
        super().__init__(message, **kwargs)  # type: ignore[arg-type]


class CorruptRecordError(BrokerResponseError):
    """A record batch failed validation (length, magic or CRC)."""

    error_code = ErrorCode.CORRUPT_MESSAGE


class UnknownTopicOrPartitionError(BrokerResponseError):
    """The broker does not host this topic-partition (or the topic does not exist)."""

    error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    invalid_metadata = True


class InvalidFetchSizeError(BrokerResponseError):
    """The fetch size is invalid."""

    error_code = ErrorCode.INVALID_FETCH_SIZE


class LeaderNotAvailableError(BrokerResponseError):
    """The partition has no leader right now (an election is in progress)."""

    error_code = ErrorCode.LEADER_NOT_AVAILABLE
    invalid_metadata = True


class NotLeaderOrFollowerError(BrokerResponseError):
    """This broker is not the leader of the partition (the client's metadata is stale)."""

    error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
    invalid_metadata = True


class RequestTimedOutError(BrokerResponseError):
    """The request timed out (on the broker, or no answer reached the client in time)."""

    error_code = ErrorCode.REQUEST_TIMED_OUT


class BrokerNotAvailableError(BrokerResponseError):
    """The broker is not available."""

    error_code = ErrorCode.BROKER_NOT_AVAILABLE
    invalid_metadata = True


class ReplicaNotAvailableError(BrokerResponseError):
    """The replica is not available."""

    error_code = ErrorCode.REPLICA_NOT_AVAILABLE
    invalid_metadata = True


class MessageSizeTooLargeError(BrokerResponseError):
    """The record batch is larger than the maximum the broker or topic accepts."""

    error_code = ErrorCode.MESSAGE_TOO_LARGE


class OffsetMetadataTooLargeError(BrokerResponseError):
    """The offset commit metadata string is too large."""

    error_code = ErrorCode.OFFSET_METADATA_TOO_LARGE


class NetworkExceptionError(BrokerResponseError):
    """The server disconnected before a response was received."""

    error_code = ErrorCode.NETWORK_EXCEPTION
    invalid_metadata = True


class CoordinatorLoadInProgressError(BrokerResponseError):
    """The coordinator is loading and cannot serve yet."""

    error_code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS


class CoordinatorNotAvailableError(BrokerResponseError):
    """The coordinator is not available."""

    error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class NotCoordinatorError(BrokerResponseError):
    """This broker is not the coordinator for the group."""

    error_code = ErrorCode.NOT_COORDINATOR


class InvalidTopicError(BrokerResponseError):
    """Invalid topic name: 1 to 249 characters of [a-zA-Z0-9._-], not '.' or '..'."""

    error_code = ErrorCode.INVALID_TOPIC_EXCEPTION


class RecordListTooLargeError(BrokerResponseError):
    """The produce request is larger than the maximum request size."""

    error_code = ErrorCode.RECORD_LIST_TOO_LARGE


class NotEnoughReplicasError(BrokerResponseError):
    """Fewer in-sync replicas than min.insync.replicas: the write was refused."""

    error_code = ErrorCode.NOT_ENOUGH_REPLICAS


class NotEnoughReplicasAfterAppendError(BrokerResponseError):
    """Written to the leader, but fewer in-sync replicas than required acknowledged it."""

    error_code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


class InvalidRequiredAcksError(BrokerResponseError):
    """acks must be 0, 1 or -1 (all)."""

    error_code = ErrorCode.INVALID_REQUIRED_ACKS


class InvalidGroupIdError(BrokerResponseError):
    """The group id is empty or otherwise not valid."""

    error_code = ErrorCode.INVALID_GROUP_ID


class IllegalGenerationError(BrokerResponseError):
    """The member's generation is not the group's: it was left behind by a rebalance
    (rejoin the group; its commits are refused until then)."""

    error_code = ErrorCode.ILLEGAL_GENERATION


class InconsistentGroupProtocolError(BrokerResponseError):
    """The member's protocol type or protocols match none of the group's members."""

    error_code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL


class UnknownMemberIdError(BrokerResponseError):
    """The coordinator does not know this member (it left, or its session expired):
    rejoin with an empty member id."""

    error_code = ErrorCode.UNKNOWN_MEMBER_ID


class InvalidSessionTimeoutError(BrokerResponseError):
    """The session timeout is outside the broker's group.min/max.session.timeout.ms."""

    error_code = ErrorCode.INVALID_SESSION_TIMEOUT


class RebalanceInProgressError(BrokerResponseError):
    """The group is rebalancing: rejoin it."""

    error_code = ErrorCode.REBALANCE_IN_PROGRESS


class NonEmptyGroupError(BrokerResponseError):
    """The group still has members: only an empty group can be deleted."""

    error_code = ErrorCode.NON_EMPTY_GROUP


class GroupIdNotFoundError(BrokerResponseError):
    """No such group on its coordinator."""

    error_code = ErrorCode.GROUP_ID_NOT_FOUND


class FetchSessionIdNotFoundError(BrokerResponseError):
    """The leader holds no such fetch session (KIP-227; restarted, or the session was
    evicted): fetch again with a full request, which opens a new one."""

    error_code = ErrorCode.FETCH_SESSION_ID_NOT_FOUND


class InvalidFetchSessionEpochError(BrokerResponseError):
    """A fetch session's request came out of order (KIP-227): fetch again with a
    full request, which opens a new session."""

    error_code = ErrorCode.INVALID_FETCH_SESSION_EPOCH


class MemberIdRequiredError(BrokerResponseError):
    """JoinGroup v4+: join again with the member id the coordinator handed out."""

    error_code = ErrorCode.MEMBER_ID_REQUIRED


class GroupMaxSizeReachedError(BrokerResponseError):
    """The group already has group.max.size members."""

    error_code = ErrorCode.GROUP_MAX_SIZE_REACHED


class FencedInstanceIdError(BrokerResponseError):
    """Another member joined with this group.instance.id: this one is fenced."""

    error_code = ErrorCode.FENCED_INSTANCE_ID


class InvalidCommitOffsetSizeError(BrokerResponseError):
    """The offset commit is too large to write to the offsets topic."""

    error_code = ErrorCode.INVALID_COMMIT_OFFSET_SIZE


class InvalidTimestampError(BrokerResponseError):
    """A record timestamp is out of the accepted range."""

    error_code = ErrorCode.INVALID_TIMESTAMP


class UnsupportedVersionError(BrokerResponseError):
    """The broker does not support this API version."""

    error_code = ErrorCode.UNSUPPORTED_VERSION


class TopicAlreadyExistsError(BrokerResponseError):
    """The topic already exists."""

    error_code = ErrorCode.TOPIC_ALREADY_EXISTS


class InvalidPartitionsError(BrokerResponseError):
    """The number of partitions is invalid."""

    error_code = ErrorCode.INVALID_PARTITIONS


class InvalidReplicationFactorError(BrokerResponseError):
    """The replication factor is invalid (more than the live brokers, or below 1)."""

    error_code = ErrorCode.INVALID_REPLICATION_FACTOR


class InvalidReplicaAssignmentError(BrokerResponseError):
    """The replica assignment is invalid."""

    error_code = ErrorCode.INVALID_REPLICA_ASSIGNMENT


class InvalidConfigurationError(BrokerResponseError):
    """A topic config is unknown or has an invalid value."""

    error_code = ErrorCode.INVALID_CONFIG


class NotControllerError(BrokerResponseError):
    """This is not the active controller."""

    error_code = ErrorCode.NOT_CONTROLLER
    invalid_metadata = True


class InvalidRequestError(BrokerResponseError):
    """The request was malformed or not allowed; the broker's log says why."""

    error_code = ErrorCode.INVALID_REQUEST


class PolicyViolationError(BrokerResponseError):
    """The request violates a configured policy."""

    error_code = ErrorCode.POLICY_VIOLATION


class OutOfOrderSequenceNumberError(BrokerResponseError):
    """The broker received an out of order sequence number."""

    error_code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class DuplicateSequenceNumberError(BrokerResponseError):
    """The broker received a duplicate sequence number."""

    error_code = ErrorCode.DUPLICATE_SEQUENCE_NUMBER


class InvalidProducerEpochError(BrokerResponseError):
    """The producer's epoch is older than the broker's (a newer producer took over)."""

    error_code = ErrorCode.INVALID_PRODUCER_EPOCH


class KafkaStorageError(BrokerResponseError):
    """The broker's disk failed for this partition."""

    error_code = ErrorCode.KAFKA_STORAGE_ERROR
    invalid_metadata = True


class UnknownProducerIdError(BrokerResponseError):
    """The broker has no state for this producer id."""

    error_code = ErrorCode.UNKNOWN_PRODUCER_ID


class FencedLeaderEpochError(BrokerResponseError):
    """The client's leader epoch is older than the broker's: refresh metadata (KIP-320)."""

    error_code = ErrorCode.FENCED_LEADER_EPOCH
    invalid_metadata = True


class UnknownLeaderEpochError(BrokerResponseError):
    """The client's leader epoch is newer than the broker's: the broker lags (KIP-320)."""

    error_code = ErrorCode.UNKNOWN_LEADER_EPOCH
    invalid_metadata = True


class LeaderEpochBehindError(UnknownLeaderEpochError):
    """Said by the client itself, not by a broker: a position's leader epoch (from a
    seek, a committed offset, a Spark plan) is newer than the leader epoch the client's
    metadata has for the partition, or the leader answered OffsetsForLeaderEpoch with
    "no such epoch" for it. The broker asked (or about to be asked) lags: the client
    refreshes its metadata and retries; it is never read as a truncation (KIP-320)."""


class StaleBrokerEpochError(BrokerResponseError):
    """The broker epoch is stale (the broker re-registered since)."""

    error_code = ErrorCode.STALE_BROKER_EPOCH


class OffsetNotAvailableError(BrokerResponseError):
    """The leader's high watermark has not caught up yet after an election."""

    error_code = ErrorCode.OFFSET_NOT_AVAILABLE


class PreferredLeaderNotAvailableError(BrokerResponseError):
    """The preferred leader is not available."""

    error_code = ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE


class EligibleLeadersNotAvailableError(BrokerResponseError):
    """No eligible leader is available."""

    error_code = ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE


class ElectionNotNeededError(BrokerResponseError):
    """The partition has a leader: no election is needed."""

    error_code = ErrorCode.ELECTION_NOT_NEEDED


class InvalidRecordError(BrokerResponseError):
    """A record failed the broker's validation."""

    error_code = ErrorCode.INVALID_RECORD


class ThrottlingQuotaExceededError(BrokerResponseError):
    """A quota was exceeded."""

    error_code = ErrorCode.THROTTLING_QUOTA_EXCEEDED


class UnsupportedSaslMechanismError(BrokerResponseError):
    """A SASL mechanism the server does not offer (SCRAM-SHA-256, SCRAM-SHA-512)."""

    error_code = ErrorCode.UNSUPPORTED_SASL_MECHANISM


class ClusterAuthorizationFailedError(BrokerResponseError):
    """A request only servers may make (a replica's Fetch, say), made where clients
    connect, or by a principal that is not a server."""

    error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class TopicAuthorizationFailedError(BrokerResponseError):
    """The principal may not do this to the topic (an ACL: `minibroker acl add`)."""

    error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED


class GroupAuthorizationFailedError(BrokerResponseError):
    """The principal may not use or see this consumer group (an ACL on the group)."""

    error_code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class SecurityDisabledError(BrokerResponseError):
    """ACLs asked of a server that runs without an authorizer (--authorizer-enabled)."""

    error_code = ErrorCode.SECURITY_DISABLED


class IllegalSaslStateError(BrokerResponseError):
    """A SASL request out of turn (a second handshake, or SASL on a listener without)."""

    error_code = ErrorCode.ILLEGAL_SASL_STATE


class SaslAuthenticationFailedError(BrokerResponseError):
    """Wrong user name or password (the server does not say which)."""

    error_code = ErrorCode.SASL_AUTHENTICATION_FAILED


class ResourceNotFoundError(BrokerResponseError):
    """The user (or other resource) named does not exist."""

    error_code = ErrorCode.RESOURCE_NOT_FOUND


class DuplicateResourceError(BrokerResponseError):
    """One request named the same user and mechanism twice."""

    error_code = ErrorCode.DUPLICATE_RESOURCE


class UnacceptableCredentialError(BrokerResponseError):
    """A credential the server refuses (an empty name or password, iterations out of
    range)."""

    error_code = ErrorCode.UNACCEPTABLE_CREDENTIAL


class InconsistentVoterSetError(BrokerResponseError):
    """A controller named a voter that is not in the quorum's voter set (check
    --quorum-voters: every controller must be given the same list)."""

    error_code = ErrorCode.INCONSISTENT_VOTER_SET


class SnapshotNotFoundError(BrokerResponseError):
    """The metadata snapshot asked for is no longer the quorum leader's latest."""

    error_code = ErrorCode.SNAPSHOT_NOT_FOUND


class InvalidUpdateVersionError(BrokerResponseError):
    """The partition epoch in the request is stale."""

    error_code = ErrorCode.INVALID_UPDATE_VERSION


class DuplicateBrokerRegistrationError(BrokerResponseError):
    """Another broker with this id is already registered."""

    error_code = ErrorCode.DUPLICATE_BROKER_REGISTRATION


class InconsistentClusterIdError(BrokerResponseError):
    """The cluster id does not match the controller's."""

    error_code = ErrorCode.INCONSISTENT_CLUSTER_ID


class IneligibleReplicaError(BrokerResponseError):
    """A proposed ISR member is not eligible (fenced, or stale broker epoch)."""

    error_code = ErrorCode.INELIGIBLE_REPLICA


class NewLeaderElectedError(BrokerResponseError):
    """A new leader was elected while the request was in flight."""

    error_code = ErrorCode.NEW_LEADER_ELECTED


_BY_CODE: dict[ErrorCode, type[BrokerResponseError]] = {
    cls.error_code: cls
    for cls in BrokerResponseError.__subclasses__()
    if "error_code" in cls.__dict__
}


def error_class_for(code: ErrorCode | int) -> type[BrokerResponseError]:
    """The exception class for a Kafka error code (BrokerResponseError for codes
    without their own class). Raises ValueError for NONE: that is not an error."""
    try:
        code = ErrorCode(code)
    except ValueError:
        return BrokerResponseError
    if code == ErrorCode.NONE:
        raise ValueError("error code NONE (0) is not an error")
    return _BY_CODE.get(code, BrokerResponseError)


def error_for(
    code: ErrorCode | int,
    message: str | None = "",
    *,
    topic: str | None = None,
    partition: int | None = None,
) -> BrokerResponseError:
    """An exception instance for a non-zero code, keeping unknown codes' numbers."""
    cls = error_class_for(code)
    try:
        known: ErrorCode | None = ErrorCode(code)
    except ValueError:
        known = None
    if known is None:
        message = f"unknown error code {int(code)}" + (f": {message}" if message else "")
        return BrokerResponseError(
            message, error_code=ErrorCode.UNKNOWN_SERVER_ERROR, topic=topic, partition=partition
        )
    return cls(message or "", error_code=known, topic=topic, partition=partition)
