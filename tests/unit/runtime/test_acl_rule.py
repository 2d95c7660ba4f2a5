"""The ACL rule (runtime/acl.py), as Kafka's StandardAuthorizer decides, and the tables
that say what every served API needs (broker/request_authorization.py,
controller/request_authorization.py): an API served without a rule would be a hole."""

from __future__ import annotations

from itertools import count
from types import SimpleNamespace

import pytest

from broker.faults import TestFaults
from broker.handlers import Handlers
from broker.metadata_image import MetadataImage
from broker.request_authorization import BrokerRequestAccess
from broker.request_authorization import refusal_body
from controller.handlers import SERVED_APIS
from controller.request_authorization import NEEDS
from controller.server import QUORUM_APIS
from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import API_BY_REQUEST_TYPE
from protocol.messages import AlterUserScramCredentialsRequest
from protocol.messages import CreateAclsRequest
from protocol.messages import DeleteAclsRequest
from protocol.messages import DescribeAclsRequest
from protocol.messages import DescribeLogDirsRequest
from protocol.messages import DescribeUserScramCredentialsRequest
from protocol.messages import ElectLeadersRequest
from protocol.messages import FetchRequest
from protocol.messages import FindCoordinatorRequest
from protocol.messages import HeartbeatRequest
from protocol.messages import InitProducerIdRequest
from protocol.messages import JoinGroupRequest
from protocol.messages import LeaveGroupRequest
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import SyncGroupRequest
from runtime.access import RequestAccess
from runtime.acl import CLUSTER_NAME
from runtime.acl import AclAuthorizer
from runtime.acl import AclBinding
from runtime.acl import AclFilter
from runtime.acl import AclOperation as Op
from runtime.acl import AclPermission
from runtime.acl import AuthorizerSettings
from runtime.acl import PatternType
from runtime.acl import ResourceType
from runtime.acl import binding_problem
from runtime.acl import parse_enum

ALLOW, DENY = AclPermission.ALLOW, AclPermission.DENY
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED


def b(
    name: str,
    op: Op,
    permission: AclPermission = ALLOW,
    *,
    kind: ResourceType = TOPIC,
    pattern: PatternType = LITERAL,
    principal: str = "User:alice",
    host: str = "*",
) -> AclBinding:
    return AclBinding(kind, name, pattern, principal, host, op, permission)


class Decider:
    """An authorizer over a changing ACL set, as an image feeds it."""

    def __init__(self, *bindings: AclBinding, **settings: object) -> None:
        self.acls = {str(i): binding for i, binding in enumerate(bindings)}
        self.generation = count()
        self.now = next(self.generation)
        self.authorizer = AclAuthorizer(AuthorizerSettings(enabled=True, **settings))  # type: ignore[arg-type]

    def change(self, *bindings: AclBinding) -> None:
        self.acls = {str(i): binding for i, binding in enumerate(bindings)}
        self.now = next(self.generation)

    def __call__(
        self,
        op: Op,
        name: str = "orders",
        *,
        kind: ResourceType = TOPIC,
        principal: str = "User:alice",
        host: str = "10.0.0.1",
    ) -> bool:
        return self.authorizer.authorize(principal, host, op, kind, name, self.acls, self.now)


def test_nothing_is_allowed_without_an_acl_unless_configured_so() -> None:
    assert not Decider()(Op.READ)
    assert Decider(allow_everyone_if_no_acl_found=True)(Op.READ)
    # An ACL on the resource for someone else: no longer "no ACL found".
    other = b("orders", Op.READ, principal="User:bob")
    assert not Decider(other, allow_everyone_if_no_acl_found=True)(Op.READ)


def test_super_users_pass_every_check_and_a_disabled_authorizer_checks_nothing() -> None:
    deny_all = b("orders", Op.ALL, DENY, principal="User:*")
    assert Decider(deny_all, super_users=frozenset({"User:alice"}))(Op.WRITE)
    off = AclAuthorizer(AuthorizerSettings(enabled=False))
    assert off.authorize("User:x", "h", Op.WRITE, TOPIC, "t", {}, 0)


def test_deny_wins_over_allow() -> None:
    decide = Decider(b("orders", Op.ALL), b("orders", Op.WRITE, DENY))
    assert decide(Op.READ)
    assert not decide(Op.WRITE)
    # A DENY of Read does not deny Describe (Kafka: only the operation or All).
    assert Decider(b("orders", Op.WRITE), b("orders", Op.READ, DENY))(Op.DESCRIBE)


@pytest.mark.parametrize("granted", [Op.READ, Op.WRITE, Op.DELETE, Op.ALTER])
def test_read_write_delete_and_alter_imply_describe(granted: Op) -> None:
    assert Decider(b("orders", granted))(Op.DESCRIBE)


def test_alter_configs_implies_describe_configs_and_nothing_else_is_implied() -> None:
    decide = Decider(b("orders", Op.ALTER_CONFIGS))
    assert decide(Op.DESCRIBE_CONFIGS)
    assert not decide(Op.READ)
    assert not Decider(b("orders", Op.DESCRIBE))(Op.READ)


def test_patterns_wildcards_principals_and_hosts() -> None:
    decide = Decider(
        b("orders-", Op.READ, pattern=PREFIXED),
        b("*", Op.DESCRIBE, principal="User:*"),
        b("audit", Op.READ, host="10.0.0.9"),
    )
    assert decide(Op.READ, "orders-eu")
    assert not decide(Op.READ, "order")
    assert decide(Op.DESCRIBE, "anything", principal="User:bob")  # literal "*", User:*
    assert not decide(Op.READ, "audit")  # from 10.0.0.1, the ACL names 10.0.0.9
    assert decide(Op.READ, "audit", host="10.0.0.9")
    # A topic ACL says nothing of a group with the same name.
    assert not decide(Op.READ, "orders-x", kind=GROUP)


def test_a_change_of_the_acls_is_seen_at_once() -> None:
    """The authorizer remembers decisions; a new generation of the ACLs forgets them."""
    decide = Decider(b("orders", Op.READ))
    assert decide(Op.READ)
    decide.change()
    assert not decide(Op.READ)
    decide.change(b("orders", Op.READ))
    assert decide(Op.READ)


def test_what_kafka_refuses_to_create() -> None:
    assert binding_problem(b("orders", Op.READ)) is None
    assert "pattern type" in binding_problem(b("t", Op.READ, pattern=PatternType.MATCH))  # type: ignore[operator]
    assert "ALLOW or DENY" in binding_problem(b("t", Op.READ, AclPermission.ANY))  # type: ignore[operator]
    assert "does not apply" in binding_problem(b("g", Op.WRITE, kind=GROUP))  # type: ignore[operator]
    assert "kafka-cluster" in binding_problem(b("other", Op.ALTER, kind=CLUSTER))  # type: ignore[operator]
    assert binding_problem(b(CLUSTER_NAME, Op.CLUSTER_ACTION, kind=CLUSTER)) is None
    assert "User:<name>" in binding_problem(b("t", Op.READ, principal="alice"))  # type: ignore[operator]
    assert "IP address" in binding_problem(b("t", Op.READ, host="example.com"))  # type: ignore[operator]
    assert "empty" in binding_problem(b("", Op.READ))  # type: ignore[operator]


def test_filters_select_as_describe_and_delete_acls_do() -> None:
    literal = b("orders", Op.READ)
    prefixed = b("ord", Op.READ, pattern=PREFIXED)
    wildcard = b("*", Op.READ)
    everything = [literal, prefixed, wildcard]

    def selected(f: AclFilter) -> list[AclBinding]:
        return [x for x in everything if f.matches(x)]

    assert selected(AclFilter()) == everything
    assert selected(AclFilter(resource_name="orders")) == [literal]
    assert selected(AclFilter(resource_name="orders", pattern_type=PatternType.MATCH)) == everything
    assert selected(AclFilter(pattern_type=PREFIXED)) == [prefixed]
    assert selected(AclFilter(operation=Op.WRITE)) == []
    assert AclFilter(resource_type=ResourceType.UNKNOWN).problem() is not None


def test_operation_names_parse_in_kafkas_spelling_and_say_what_is_accepted() -> None:
    assert parse_enum(Op, "ClusterAction", allowed=Op) is Op.CLUSTER_ACTION
    assert parse_enum(Op, "idempotent-write", allowed=Op) is Op.IDEMPOTENT_WRITE
    with pytest.raises(ValueError, match=r"use one of .*Read"):
        parse_enum(Op, "Fly", allowed=[Op.READ])


def test_every_api_the_broker_serves_has_an_authorization_rule() -> None:
    """The broker refuses to start with an API served unguarded (wrap raises): every
    key of its full table (groups and test faults included) has a rule."""
    coordinator_apis = ("find_coordinator", "offset_commit", "offset_fetch", "join_group")
    coordinator_apis += ("sync_group", "heartbeat", "leave_group", "describe_groups")
    coordinator_apis += ("list_groups", "delete_groups")
    handlers = Handlers(
        node_id=1,
        image=MetadataImage(),
        replica_manager=None,  # type: ignore[arg-type]
        controller=None,  # type: ignore[arg-type]
        image_updated=None,  # type: ignore[arg-type]
        coordinator=SimpleNamespace(**dict.fromkeys(coordinator_apis)),  # type: ignore[arg-type]
        faults=TestFaults(node_id=1),
    )
    table = handlers.table()
    access = RequestAccess(AuthorizerSettings(enabled=True), MetadataImage)
    guarded = BrokerRequestAccess(access, MetadataImage()).wrap(table)
    assert set(guarded) == set(table)
    del table[int(ApiKey.PRODUCE)]
    table[int(ApiKey.QUORUM_FETCH)] = table[int(ApiKey.FETCH)]  # served, with no rule
    with pytest.raises(AssertionError, match="QUORUM_FETCH"):
        BrokerRequestAccess(access, MetadataImage()).wrap(table)


def test_every_api_the_controller_serves_has_an_authorization_rule() -> None:
    served = {int(k) for k in SERVED_APIS} | set(QUORUM_APIS)
    assert served <= set(NEEDS), sorted(ApiKey(k).name for k in served - set(NEEDS))


@pytest.mark.parametrize(
    "request_body",
    [
        ElectLeadersRequest(),
        AlterUserScramCredentialsRequest(),
        CreateAclsRequest(creations=[]),
        DeleteAclsRequest(filters=[]),
        InitProducerIdRequest(),
        FindCoordinatorRequest(key="g"),
        JoinGroupRequest(group_id="g", session_timeout_ms=10_000, protocols=[]),
        SyncGroupRequest(group_id="g", generation_id=1, member_id="m"),
        HeartbeatRequest(group_id="g", generation_id=1, member_id="m"),
        LeaveGroupRequest(group_id="g", member_id="m"),
        DescribeUserScramCredentialsRequest(),
        DescribeAclsRequest(),
        DescribeLogDirsRequest(),
        FetchRequest(replica_id=1, topics=[]),
        OffsetForLeaderEpochRequest(replica_id=1, topics=[]),
    ],
    ids=lambda r: type(r).__name__,
)
def test_a_whole_request_refusal_has_an_answer_on_the_kafka_protocol(request_body: object) -> None:
    answer = refusal_body(request_body, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "no")  # type: ignore[arg-type]
    assert type(answer) is API_BY_REQUEST_TYPE[type(request_body)].response
