"""ACLs on the Kafka listener: DescribeAcls (29), CreateAcls (30) and DeleteAcls (31),
versions 1-3 (v2 is flexible; v3 only adds the User resource type, which no ACL here
names: refused as an unknown resource type by the same handlers), declared onto the
native messages (written from Kafka's message definitions), so Kafka's admin clients
(kafka-python's KafkaAdminClient, confluent-kafka's AdminClient, kafka-acls) manage
the ACLs that `minibroker acl` manages.

Version 0 is not served: it has no pattern type (Kafka reads it as LITERAL, where a
native filter's default is ANY), Kafka 4 removed it (KIP-896), and every client this
project serves speaks v1. A v0 request is refused as any unserved version is.

Kafka suffixes a filter's resource, name, pattern, principal and host fields with
"_filter" and calls a creation's pattern type "resource_pattern_type": the native
names are the ones without (a filter is an AclFilterSpec, a creation an AclCreation)."""

from __future__ import annotations

from protocol.api import ApiKey
from protocol.kafka.api_spec import KafkaApi
from protocol.kafka.api_spec import throttle_time
from protocol.kafka.schema import INT8
from protocol.kafka.schema import INT16
from protocol.kafka.schema import STRING
from protocol.kafka.schema import Array
from protocol.kafka.schema import Field
from protocol.kafka.schema import KStruct
from protocol.messages import AclCreation
from protocol.messages import AclCreationResult
from protocol.messages import AclDescription
from protocol.messages import AclFilterSpec
from protocol.messages import AclResource
from protocol.messages import CreateAclsRequest
from protocol.messages import CreateAclsResponse
from protocol.messages import DeleteAclsFilterResult
from protocol.messages import DeleteAclsMatchingAcl
from protocol.messages import DeleteAclsRequest
from protocol.messages import DeleteAclsResponse
from protocol.messages import DescribeAclsRequest
from protocol.messages import DescribeAclsResponse

# Kafka's codes throughout (runtime/acl.py's enums): INT8 on the wire.
_RESOURCE = (
    Field("resource_type", INT8),
    Field("resource_name", STRING),
    Field("pattern_type", INT8),
)
_ENTRY = (
    Field("principal", STRING),
    Field("host", STRING),
    Field("operation", INT8),
    Field("permission_type", INT8),
)
# What DescribeAcls asks and each of DeleteAcls' filters: a null name, principal or
# host matches every one.
_FILTER = (
    Field("resource_type", INT8),
    Field("resource_name", STRING, nullable="0+"),
    Field("pattern_type", INT8),
    Field("principal", STRING, nullable="0+"),
    Field("host", STRING, nullable="0+"),
    Field("operation", INT8),
    Field("permission_type", INT8),
)
_ERROR = (Field("error_code", INT16), Field("error_message", STRING, nullable="0+"))


def _acl_api(key: ApiKey, request: KStruct, response: KStruct) -> KafkaApi:
    return KafkaApi(key, 1, 3, 2, request=request, response=response)


DESCRIBE_ACLS = _acl_api(
    ApiKey.DESCRIBE_ACLS,
    request=KStruct(DescribeAclsRequest, _FILTER),
    response=KStruct(
        DescribeAclsResponse,
        (
            throttle_time("0+"),
            *_ERROR,
            Field(
                "resources",
                Array(
                    KStruct(
                        AclResource,
                        (*_RESOURCE, Field("acls", Array(KStruct(AclDescription, _ENTRY)))),
                    )
                ),
            ),
        ),
    ),
)

CREATE_ACLS = _acl_api(
    ApiKey.CREATE_ACLS,
    request=KStruct(
        CreateAclsRequest,
        (Field("creations", Array(KStruct(AclCreation, (*_RESOURCE, *_ENTRY)))),),
    ),
    response=KStruct(
        CreateAclsResponse,
        (
            throttle_time("0+"),
            Field("results", Array(KStruct(AclCreationResult, _ERROR))),
        ),
    ),
)

_MATCHING_ACL = KStruct(DeleteAclsMatchingAcl, (*_ERROR, *_RESOURCE, *_ENTRY))

DELETE_ACLS = _acl_api(
    ApiKey.DELETE_ACLS,
    request=KStruct(DeleteAclsRequest, (Field("filters", Array(KStruct(AclFilterSpec, _FILTER))),)),
    response=KStruct(
        DeleteAclsResponse,
        (
            throttle_time("0+"),
            Field(
                "filter_results",
                Array(
                    KStruct(
                        DeleteAclsFilterResult,
                        (
                            *_ERROR,
                            Field("matching_acls", Array(_MATCHING_ACL)),
                        ),
                    )
                ),
            ),
        ),
    ),
)
