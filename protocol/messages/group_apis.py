"""Group membership: the classic rebalance protocol (JoinGroup, SyncGroup, Heartbeat,
LeaveGroup) and the group tools' APIs (DescribeGroups, ListGroups, DeleteGroups),
with Kafka's field names. The offsets a group commits are in client_apis.py
(OffsetCommit, OffsetFetch, FindCoordinator).

A member's protocol metadata (its subscription) and its assignment are opaque bytes to
the coordinator, as in Kafka: a consumer encodes them in Kafka's consumer protocol
format (client/consumer/consumer_protocol.py), so members of any client can share a
group.
"""

from __future__ import annotations

from protocol.messages.client_apis import Message

__all__ = [
    "DeletableGroupResult",
    "DeleteGroupsRequest",
    "DeleteGroupsResponse",
    "DescribeGroupsRequest",
    "DescribeGroupsResponse",
    "DescribedGroup",
    "DescribedGroupMember",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "JoinGroupRequest",
    "JoinGroupRequestProtocol",
    "JoinGroupResponse",
    "JoinGroupResponseMember",
    "LeaveGroupRequest",
    "LeaveGroupResponse",
    "ListGroupsRequest",
    "ListGroupsResponse",
    "ListedGroup",
    "SyncGroupRequest",
    "SyncGroupRequestAssignment",
    "SyncGroupResponse",
]

# JoinGroup's member_id when a member joins for the first time.
UNKNOWN_MEMBER_ID = ""


class JoinGroupRequestProtocol(Message, kw_only=True):
    name: str  # an assignor ("range", "roundrobin", "cooperative-sticky")
    metadata: bytes  # the member's subscription, in the protocol type's format


class JoinGroupRequest(Message, kw_only=True):
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int = -1  # -1: the session timeout (JoinGroup v0)
    member_id: str = UNKNOWN_MEMBER_ID
    group_instance_id: str | None = None  # static membership (KIP-345)
    protocol_type: str = "consumer"
    protocols: list[JoinGroupRequestProtocol]


class JoinGroupResponseMember(Message, kw_only=True):
    member_id: str
    group_instance_id: str | None = None
    metadata: bytes = b""


class JoinGroupResponse(Message, kw_only=True):
    error_code: int = 0
    generation_id: int = -1
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[JoinGroupResponseMember] = []  # for the leader only
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


class SyncGroupRequestAssignment(Message, kw_only=True):
    member_id: str
    assignment: bytes


class SyncGroupRequest(Message, kw_only=True):
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    assignments: list[SyncGroupRequestAssignment] = []  # from the leader only


class SyncGroupResponse(Message, kw_only=True):
    error_code: int = 0
    assignment: bytes = b""
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


class HeartbeatRequest(Message, kw_only=True):
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


class HeartbeatResponse(Message, kw_only=True):
    error_code: int = 0
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


class LeaveGroupRequest(Message, kw_only=True):
    group_id: str
    member_id: str


class LeaveGroupResponse(Message, kw_only=True):
    error_code: int = 0
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


class DescribeGroupsRequest(Message, kw_only=True):
    groups: list[str]


class DescribedGroupMember(Message, kw_only=True):
    member_id: str
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    member_metadata: bytes = b""
    member_assignment: bytes = b""


class DescribedGroup(Message, kw_only=True):
    error_code: int = 0
    group_id: str
    # Empty, PreparingRebalance, CompletingRebalance, Stable, Dead (Kafka's names)
    group_state: str = ""
    protocol_type: str = ""
    protocol_data: str = ""  # the chosen protocol (assignor) name
    members: list[DescribedGroupMember] = []
    generation_id: int = -1  # not in Kafka's answer: for minibroker's tools


class DescribeGroupsResponse(Message, kw_only=True):
    groups: list[DescribedGroup] = []
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


class ListGroupsRequest(Message, kw_only=True):
    pass


class ListedGroup(Message, kw_only=True):
    group_id: str
    protocol_type: str = ""
    group_state: str = ""  # Kafka's ListGroups v4+; answered natively here


class ListGroupsResponse(Message, kw_only=True):
    error_code: int = 0
    groups: list[ListedGroup] = []
    throttle_time_ms: int = 0  # quotas: how long the client was throttled


class DeleteGroupsRequest(Message, kw_only=True):
    groups_names: list[str]


class DeletableGroupResult(Message, kw_only=True):
    group_id: str
    error_code: int = 0


class DeleteGroupsResponse(Message, kw_only=True):
    results: list[DeletableGroupResult] = []
    throttle_time_ms: int = 0  # quotas: how long the client was throttled
