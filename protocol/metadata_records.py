"""Records of the controller's metadata log, as brokers receive them in FetchMetadata.

The log is the single source of truth for cluster metadata: the controller appends a
record (fsynced) before it acknowledges a change, and every broker rebuilds the same
image by replaying the records in offset order. A broker epoch is the offset of the
broker's RegisterBrokerRecord, so it grows with every registration and is never reused.
`PartitionRecord` carries a partition's whole state; a later one for the same
partition replaces the earlier.
"""

from __future__ import annotations

import msgspec


class ListenerInfo(msgspec.Struct, kw_only=True):
    name: str
    host: str
    port: int


class RegisterBrokerRecord(msgspec.Struct, kw_only=True, tag="register_broker"):
    broker_id: int
    broker_epoch: int
    incarnation_id: str
    listeners: list[ListenerInfo]
    rack: str | None = None
    fenced: bool = True
    # Who registered it (the connection's principal, issue 18): the broker's later
    # requests, and its replica Fetches, must come from the same principal. None in
    # logs written before; then only ClusterAction is checked.
    principal: str | None = None


class FenceBrokerRecord(msgspec.Struct, kw_only=True, tag="fence_broker"):
    broker_id: int
    broker_epoch: int


class UnfenceBrokerRecord(msgspec.Struct, kw_only=True, tag="unfence_broker"):
    broker_id: int
    broker_epoch: int


class TopicRecord(msgspec.Struct, kw_only=True, tag="topic"):
    name: str
    topic_id: str
    configs: dict[str, str] = {}


class RemoveTopicRecord(msgspec.Struct, kw_only=True, tag="remove_topic"):
    topic_id: str


# leader_recovery_state values (KIP-704): RECOVERED, or RECOVERING after an unclean election.
LEADER_RECOVERED = 0
LEADER_RECOVERING = 1
NO_LEADER = -1


class PartitionRecord(msgspec.Struct, kw_only=True, tag="partition"):
    topic_id: str
    partition_id: int
    replicas: list[int]
    isr: list[int]
    leader: int = NO_LEADER
    leader_epoch: int
    partition_epoch: int
    leader_recovery_state: int = LEADER_RECOVERED


class ProducerIdsRecord(msgspec.Struct, kw_only=True, tag="producer_ids"):
    """A block of producer ids was handed to a broker; the next block starts at
    `next_producer_id`, so ids are never handed out twice, even across restarts."""

    broker_id: int
    broker_epoch: int
    next_producer_id: int


class LeaderChangeRecord(msgspec.Struct, kw_only=True, tag="leader_change"):
    """The first entry a newly elected controller quorum leader appends (KRaft's
    LeaderChangeMessage): committing it commits everything before it (a leader commits
    only through an entry of its own epoch). Changes nothing in the image."""

    leader_id: int
    leader_epoch: int
    voters: list[int] = []


class ScramCredentialRecord(msgspec.Struct, kw_only=True, tag="scram_credential"):
    """A user's SCRAM credential for one mechanism (issue 18; runtime/scram.py): never
    the password, only what checks a client's proof. A later one for the same user
    and mechanism replaces it."""

    name: str
    mechanism: int  # 1: SCRAM-SHA-256, 2: SCRAM-SHA-512
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes


class RemoveScramCredentialRecord(msgspec.Struct, kw_only=True, tag="remove_scram_credential"):
    name: str
    mechanism: int


class AccessControlEntryRecord(msgspec.Struct, kw_only=True, tag="access_control_entry"):
    """One ACL (issue 18; runtime/acl.py has the model), with Kafka's codes. `id` names
    it for removal; creating a binding that exists already writes nothing."""

    id: str
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int


class RemoveAccessControlEntryRecord(
    msgspec.Struct, kw_only=True, tag="remove_access_control_entry"
):
    id: str


class QuotaEntityData(msgspec.Struct, kw_only=True):
    entity_type: str  # "user" or "client-id"
    entity_name: str | None = None  # None: the type's default entity (Kafka's <default>)


class ClientQuotaRecord(msgspec.Struct, kw_only=True, tag="client_quota"):
    """One quota of one entity set, or removed (Kafka's ClientQuotaRecord; issue 18,
    runtime/client_quotas.py): a later record for the same entity and key replaces it."""

    entity: list[QuotaEntityData]
    key: str  # producer_byte_rate, consumer_byte_rate or request_percentage
    value: float = 0.0  # ignored when `remove`
    remove: bool = False


MetadataRecord = (
    RegisterBrokerRecord
    | FenceBrokerRecord
    | UnfenceBrokerRecord
    | TopicRecord
    | RemoveTopicRecord
    | PartitionRecord
    | ProducerIdsRecord
    | LeaderChangeRecord
    | ScramCredentialRecord
    | RemoveScramCredentialRecord
    | AccessControlEntryRecord
    | RemoveAccessControlEntryRecord
    | ClientQuotaRecord
)
