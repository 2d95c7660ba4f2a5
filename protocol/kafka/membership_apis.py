"""Group membership APIs of the Kafka listener: the classic rebalance protocol
(JoinGroup, SyncGroup, Heartbeat, LeaveGroup) and the group tools' APIs
(DescribeGroups, ListGroups, DeleteGroups), declared onto the native messages
(protocol/messages/group_apis.py). Versions: what the four clients send
(../shared/kafka-clients.md), below the flexible ones."""

from __future__ import annotations

from protocol.api import ApiKey
from protocol.kafka.api_spec import KafkaApi
from protocol.kafka.api_spec import throttle_time
from protocol.kafka.schema import BOOL
from protocol.kafka.schema import BYTES
from protocol.kafka.schema import INT16
from protocol.kafka.schema import INT32
from protocol.kafka.schema import STRING
from protocol.kafka.schema import Array
from protocol.kafka.schema import Field
from protocol.kafka.schema import KStruct
from protocol.messages import DeletableGroupResult
from protocol.messages import DeleteGroupsRequest
from protocol.messages import DeleteGroupsResponse
from protocol.messages import DescribedGroup
from protocol.messages import DescribedGroupMember
from protocol.messages import DescribeGroupsRequest
from protocol.messages import DescribeGroupsResponse
from protocol.messages import HeartbeatRequest
from protocol.messages import HeartbeatResponse
from protocol.messages import JoinGroupRequest
from protocol.messages import JoinGroupRequestProtocol
from protocol.messages import JoinGroupResponse
from protocol.messages import JoinGroupResponseMember
from protocol.messages import LeaveGroupRequest
from protocol.messages import LeaveGroupResponse
from protocol.messages import ListedGroup
from protocol.messages import ListGroupsRequest
from protocol.messages import ListGroupsResponse
from protocol.messages import SyncGroupRequest
from protocol.messages import SyncGroupRequestAssignment
from protocol.messages import SyncGroupResponse


def _opaque(value: memoryview) -> bytes:
    # Subscriptions and assignments outlive the request frame: kept as bytes.
    return bytes(value)


def _or_empty(value: str | None) -> str:
    # No protocol chosen (an error answer): an empty name where the version has no null.
    return value or ""


def _instance_id(versions: str) -> Field:
    """group.instance.id (static membership, KIP-345), nullable where it exists."""
    return Field("group_instance_id", STRING, versions, nullable=versions)


JOIN_GROUP = KafkaApi(
    ApiKey.JOIN_GROUP,
    2,
    5,  # v4: MEMBER_ID_REQUIRED; v5: group.instance.id
    6,
    request=KStruct(
        JoinGroupRequest,
        (
            Field("group_id", STRING),
            Field("session_timeout_ms", INT32),
            Field("rebalance_timeout_ms", INT32, "1+"),
            Field("member_id", STRING),
            _instance_id("5+"),
            Field("protocol_type", STRING),
            Field(
                "protocols",
                Array(
                    KStruct(
                        JoinGroupRequestProtocol,
                        (Field("name", STRING), Field("metadata", BYTES, to_native=_opaque)),
                    )
                ),
            ),
        ),
    ),
    response=KStruct(
        JoinGroupResponse,
        (
            throttle_time("2+"),
            Field("error_code", INT16),
            Field("generation_id", INT32),
            Field("protocol_name", STRING, from_native=_or_empty),
            Field("leader", STRING),
            Field("member_id", STRING),
            Field(
                "members",
                Array(
                    KStruct(
                        JoinGroupResponseMember,
                        (
                            Field("member_id", STRING),
                            _instance_id("5+"),
                            Field("metadata", BYTES),
                        ),
                    )
                ),
            ),
        ),
    ),
)

SYNC_GROUP = KafkaApi(
    ApiKey.SYNC_GROUP,
    0,
    3,
    4,
    request=KStruct(
        SyncGroupRequest,
        (
            Field("group_id", STRING),
            Field("generation_id", INT32),
            Field("member_id", STRING),
            _instance_id("3+"),
            Field(
                "assignments",
                Array(
                    KStruct(
                        SyncGroupRequestAssignment,
                        (
                            Field("member_id", STRING),
                            Field("assignment", BYTES, to_native=_opaque),
                        ),
                    )
                ),
            ),
        ),
    ),
    response=KStruct(
        SyncGroupResponse,
        (throttle_time("1+"), Field("error_code", INT16), Field("assignment", BYTES)),
    ),
)

HEARTBEAT = KafkaApi(
    ApiKey.HEARTBEAT,
    0,
    3,
    4,
    request=KStruct(
        HeartbeatRequest,
        (
            Field("group_id", STRING),
            Field("generation_id", INT32),
            Field("member_id", STRING),
            _instance_id("3+"),
        ),
    ),
    response=KStruct(HeartbeatResponse, (throttle_time("1+"), Field("error_code", INT16))),
)

LEAVE_GROUP = KafkaApi(
    ApiKey.LEAVE_GROUP,
    0,
    1,  # v3 leaves several members at once (static membership's admin path)
    4,
    request=KStruct(LeaveGroupRequest, (Field("group_id", STRING), Field("member_id", STRING))),
    response=KStruct(LeaveGroupResponse, (throttle_time("1+"), Field("error_code", INT16))),
)

_DESCRIBED_MEMBER = KStruct(
    DescribedGroupMember,
    (
        Field("member_id", STRING),
        _instance_id("4+"),
        Field("client_id", STRING),
        Field("client_host", STRING),
        Field("member_metadata", BYTES),
        Field("member_assignment", BYTES),
    ),
)

DESCRIBE_GROUPS = KafkaApi(
    ApiKey.DESCRIBE_GROUPS,
    0,
    4,
    5,
    request=KStruct(
        DescribeGroupsRequest,
        (
            Field("groups", Array(STRING)),
            Field("include_authorized_operations", BOOL, "3+", default=False, mapped=False),
        ),
    ),
    response=KStruct(
        DescribeGroupsResponse,
        (
            throttle_time("1+"),
            Field(
                "groups",
                Array(
                    KStruct(
                        DescribedGroup,
                        (
                            Field("error_code", INT16),
                            Field("group_id", STRING),
                            Field("group_state", STRING),
                            Field("protocol_type", STRING),
                            Field("protocol_data", STRING),
                            Field("members", Array(_DESCRIBED_MEMBER)),
                            # -2**31: authorized operations not asked for (ACLs: issue 18)
                            Field(
                                "authorized_operations", INT32, "3+", default=-(2**31), mapped=False
                            ),
                        ),
                    )
                ),
            ),
        ),
    ),
)

_PROTOCOL_TYPE = Field("protocol_type", STRING)

LIST_GROUPS = KafkaApi(
    ApiKey.LIST_GROUPS,
    0,
    2,
    3,
    request=KStruct(ListGroupsRequest, ()),
    response=KStruct(
        ListGroupsResponse,
        (
            throttle_time("1+"),
            Field("error_code", INT16),
            Field(
                "groups",
                Array(
                    KStruct(
                        ListedGroup, (Field("group_id", STRING), Field("protocol_type", STRING))
                    )
                ),
            ),
        ),
    ),
)

DELETE_GROUPS = KafkaApi(
    ApiKey.DELETE_GROUPS,
    0,
    1,
    2,
    request=KStruct(DeleteGroupsRequest, (Field("groups_names", Array(STRING)),)),
    response=KStruct(
        DeleteGroupsResponse,
        (
            throttle_time("0+"),
            Field(
                "results",
                Array(
                    KStruct(
                        DeletableGroupResult,
                        (Field("group_id", STRING), Field("error_code", INT16)),
                    )
                ),
            ),
        ),
    ),
)
