"""ACLs (Kafka's AclControlManager): CreateAcls writes an AccessControlEntryRecord per
new binding (an identical binding that exists already is a success that writes
nothing), DeleteAcls a RemoveAccessControlEntryRecord per ACL its filters match. Each
creation and each filter has its own result; one that fails writes nothing. The model,
its validation and the matching are runtime/acl.py's."""

from __future__ import annotations

import logging
import uuid

from controller.context import ControllerPart
from controller.state import MetadataImage
from protocol.errors import ErrorCode
from protocol.messages import AclCreation
from protocol.messages import AclCreationResult
from protocol.messages import CreateAclsRequest
from protocol.messages import CreateAclsResponse
from protocol.messages import DeleteAclsFilterResult
from protocol.messages import DeleteAclsMatchingAcl
from protocol.messages import DeleteAclsRequest
from protocol.messages import DeleteAclsResponse
from protocol.metadata_records import MetadataRecord
from protocol.metadata_records import RemoveAccessControlEntryRecord
from runtime.acl import AclBinding
from runtime.acl import binding_of
from runtime.acl import binding_problem
from runtime.acl import filter_of

log = logging.getLogger(__name__)

# Creations or filters in one request, and ACLs in the cluster, at most (bounds).
MAX_CHANGES = 1000
MAX_ACLS = 100_000


class AclControl(ControllerPart):
    async def create_acls(self, request: CreateAclsRequest) -> CreateAclsResponse:
        if len(request.creations) > MAX_CHANGES:
            message = f"{len(request.creations)} ACLs in one request; at most {MAX_CHANGES}"
            return CreateAclsResponse(
                results=[
                    AclCreationResult(
                        error_code=int(ErrorCode.INVALID_REQUEST), error_message=message
                    )
                    for _ in request.creations
                ]
            )

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], CreateAclsResponse]:
            existing = set(image.acls.values())
            records: list[MetadataRecord] = []
            results = []
            for creation in request.creations:
                binding, problem = _checked(creation)
                if problem is None and len(existing) >= MAX_ACLS:
                    problem = f"the cluster holds {MAX_ACLS} ACLs, the most it may"
                if binding is None or problem is not None:
                    results.append(
                        AclCreationResult(
                            error_code=int(ErrorCode.INVALID_REQUEST),
                            error_message=f"ACL refused: {problem}",
                        )
                    )
                    continue
                if binding not in existing:
                    existing.add(binding)
                    records.append(binding.to_record(str(uuid.uuid4())))
                results.append(AclCreationResult())
            return records, CreateAclsResponse(results=results)

        response = await self.writer.commit(build)
        created = sum(1 for r in response.results if r.error_code == 0)
        if created:
            log.info("%d ACL(s) created or already present", created)
        return response

    async def delete_acls(self, request: DeleteAclsRequest) -> DeleteAclsResponse:
        if len(request.filters) > MAX_CHANGES:
            message = f"{len(request.filters)} filters in one request; at most {MAX_CHANGES}"
            return DeleteAclsResponse(
                filter_results=[
                    DeleteAclsFilterResult(
                        error_code=int(ErrorCode.INVALID_REQUEST), error_message=message
                    )
                    for _ in request.filters
                ]
            )

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], DeleteAclsResponse]:
            removed: set[str] = set()
            records: list[MetadataRecord] = []
            results = []
            for spec in request.filters:
                try:
                    acl_filter = filter_of(spec)
                    problem = acl_filter.problem()
                except ValueError as exc:
                    problem = str(exc)
                if problem is not None:
                    results.append(
                        DeleteAclsFilterResult(
                            error_code=int(ErrorCode.INVALID_REQUEST), error_message=problem
                        )
                    )
                    continue
                matching = []
                for acl_id, b in sorted(image.acls.items(), key=lambda item: item[1]):
                    if not acl_filter.matches(b):
                        continue
                    matching.append(DeleteAclsMatchingAcl(**b.wire_fields()))  # type: ignore[arg-type]
                    if acl_id not in removed:
                        removed.add(acl_id)
                        records.append(RemoveAccessControlEntryRecord(id=acl_id))
                results.append(DeleteAclsFilterResult(matching_acls=matching))
            return records, DeleteAclsResponse(filter_results=results)

        response = await self.writer.commit(build)
        deleted = sum(len(r.matching_acls) for r in response.filter_results)
        if deleted:
            log.info("%d ACL(s) deleted", deleted)
        return response


def _checked(creation: AclCreation) -> tuple[AclBinding | None, str | None]:
    """The binding a creation asks for, or why it cannot be created."""
    try:
        binding = binding_of(creation)
    except ValueError as exc:
        return None, str(exc)
    return binding, binding_problem(binding)
