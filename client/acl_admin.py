"""ACLs from AsyncAdmin (issue 18; Kafka's Admin.createAcls / describeAcls / deleteAcls,
kafka-acls): bindings and filters in runtime/acl.py's model, sent to any broker (which
forwards changes to the controller and answers once its own image has them)."""

from __future__ import annotations

from client.cluster import ClusterClient
from client.errors import error_for
from protocol.errors import ErrorCode
from protocol.messages import AclCreation
from protocol.messages import AclFilterSpec
from protocol.messages import CreateAclsRequest
from protocol.messages import CreateAclsResponse
from protocol.messages import DeleteAclsRequest
from protocol.messages import DeleteAclsResponse
from protocol.messages import DescribeAclsRequest
from protocol.messages import DescribeAclsResponse
from runtime.acl import AclBinding
from runtime.acl import AclFilter
from runtime.acl import AclOperation
from runtime.acl import AclPermission
from runtime.acl import PatternType
from runtime.acl import ResourceType
from runtime.acl import binding_of
from runtime.acl import binding_problem


def _filter_spec(f: AclFilter, kind: type[AclFilterSpec] = AclFilterSpec) -> AclFilterSpec:
    return kind(
        resource_type=int(f.resource_type),
        resource_name=f.resource_name,
        pattern_type=int(f.pattern_type),
        principal=f.principal,
        host=f.host,
        operation=int(f.operation),
        permission_type=int(f.permission),
    )


class AclAdmin:
    """Mixed into AsyncAdmin."""

    _cluster: ClusterClient

    async def create_acls(self, bindings: list[AclBinding]) -> None:
        """Create the ACLs (one that exists already is no change). A binding Kafka
        would refuse raises ValueError before anything is sent; a refusal by the
        cluster raises its error (SecurityDisabledError: no authorizer)."""
        self._check()  # type: ignore[attr-defined]
        for b in bindings:
            problem = binding_problem(b)
            if problem is not None:
                raise ValueError(f"ACL refused: {problem}")
        creations = [AclCreation(**b.wire_fields()) for b in bindings]  # type: ignore[arg-type]
        answer = await self._cluster.send_any(CreateAclsRequest(creations=creations))
        assert isinstance(answer, CreateAclsResponse)
        for b, result in zip(bindings, answer.results, strict=False):
            if result.error_code != ErrorCode.NONE:
                raise error_for(
                    ErrorCode.of(result.error_code),
                    f"{b.describe()}: {result.error_message or 'refused'}",
                )

    async def describe_acls(self, acl_filter: AclFilter | None = None) -> list[AclBinding]:
        """The ACLs `acl_filter` selects (None: all), sorted."""
        self._check()  # type: ignore[attr-defined]
        answer = await self._cluster.send_any(
            _filter_spec(acl_filter or AclFilter(), DescribeAclsRequest)
        )
        assert isinstance(answer, DescribeAclsResponse)
        if answer.error_code != ErrorCode.NONE:
            raise error_for(
                ErrorCode.of(answer.error_code), answer.error_message or "DescribeAcls refused"
            )
        return sorted(
            AclBinding(
                ResourceType(r.resource_type),
                r.resource_name,
                PatternType(r.pattern_type),
                a.principal,
                a.host,
                AclOperation(a.operation),
                AclPermission(a.permission_type),
            )
            for r in answer.resources
            for a in r.acls
        )

    async def delete_acls(self, filters: list[AclFilter]) -> list[AclBinding]:
        """Delete every ACL one of `filters` selects; returns those deleted."""
        self._check()  # type: ignore[attr-defined]
        answer = await self._cluster.send_any(
            DeleteAclsRequest(filters=[_filter_spec(f) for f in filters])
        )
        assert isinstance(answer, DeleteAclsResponse)
        deleted: set[AclBinding] = set()
        for result in answer.filter_results:
            if result.error_code != ErrorCode.NONE:
                raise error_for(
                    ErrorCode.of(result.error_code), result.error_message or "DeleteAcls refused"
                )
            deleted.update(binding_of(m) for m in result.matching_acls)
        return sorted(deleted)
