"""Client quotas (Kafka's ClientQuotaControlManager, KIP-546): AlterClientQuotas checks
each entry's entity and operations (runtime/client_quotas.py) and writes one
ClientQuotaRecord per operation to the metadata log. Every entry's result is its own:
an entry with a bad entity, an unknown key or a bad value changes nothing and says
why, the others go ahead; `validate_only` checks and writes nothing. Removing a key
the entity does not have is no error (there is nothing left to remove), as in Kafka."""

from __future__ import annotations

import logging

from controller.context import ControllerPart
from controller.state import MetadataImage
from protocol.errors import ErrorCode
from protocol.messages import AlterClientQuotasEntry
from protocol.messages import AlterClientQuotasEntryResult
from protocol.messages import AlterClientQuotasRequest
from protocol.messages import AlterClientQuotasResponse
from protocol.metadata_records import ClientQuotaRecord
from protocol.metadata_records import MetadataRecord
from protocol.metadata_records import QuotaEntityData
from runtime.client_quotas import describe_entity
from runtime.client_quotas import entity_of
from runtime.client_quotas import entity_problem
from runtime.client_quotas import key_problem
from runtime.client_quotas import value_problem

log = logging.getLogger(__name__)

# Entries, and operations of one entry, in one request at most (a bound, as every list).
MAX_ENTRIES = 1000
MAX_OPS = 16


def entry_problem(entry: AlterClientQuotasEntry) -> str | None:
    """What is wrong with one entry of AlterClientQuotas, or None."""
    parts = [(p.entity_type, p.entity_name) for p in entry.entity]
    problem = entity_problem(parts)
    if problem is not None:
        return problem
    if not entry.ops:
        return f"no quota to set or remove for {describe_entity(entity_of(parts))}"
    if len(entry.ops) > MAX_OPS:
        return f"{len(entry.ops)} operations on one entity; at most {MAX_OPS}"
    keys = [op.key for op in entry.ops]
    if len(set(keys)) != len(keys):
        return f"a quota key named twice for {describe_entity(entity_of(parts))}"
    for op in entry.ops:
        problem = key_problem(op.key) if op.remove else value_problem(op.key, op.value)
        if problem is not None:
            return problem
    return None


class QuotaControl(ControllerPart):
    async def alter_client_quotas(
        self, request: AlterClientQuotasRequest
    ) -> AlterClientQuotasResponse:
        if len(request.entries) > MAX_ENTRIES:
            message = f"{len(request.entries)} entries in one request; at most {MAX_ENTRIES}"
            return AlterClientQuotasResponse(
                entries=[
                    AlterClientQuotasEntryResult(
                        error_code=int(ErrorCode.INVALID_REQUEST),
                        error_message=message,
                        entity=e.entity,
                    )
                    for e in request.entries
                ]
            )
        problems = [entry_problem(e) for e in request.entries]
        results = [
            AlterClientQuotasEntryResult(
                error_code=int(ErrorCode.INVALID_REQUEST if problem else ErrorCode.NONE),
                error_message=problem,
                entity=entry.entity,
            )
            for entry, problem in zip(request.entries, problems, strict=True)
        ]
        response = AlterClientQuotasResponse(entries=results)
        records: list[MetadataRecord] = []
        for entry, problem in zip(request.entries, problems, strict=True):
            if problem is not None:
                continue
            parts = [
                QuotaEntityData(entity_type=p.entity_type, entity_name=p.entity_name)
                for p in entry.entity
            ]
            records.extend(
                ClientQuotaRecord(
                    entity=parts,
                    key=op.key,
                    value=0.0 if op.remove else float(op.value),
                    remove=op.remove,
                )
                for op in entry.ops
            )
        if request.validate_only or not records:
            return response

        def build(
            image: MetadataImage,
        ) -> tuple[list[MetadataRecord], AlterClientQuotasResponse]:
            return records, response

        await self.writer.commit(build)
        for entry, problem in zip(request.entries, problems, strict=True):
            if problem is None:
                entity = entity_of((p.entity_type, p.entity_name) for p in entry.entity)
                changes = ", ".join(
                    f"{op.key} removed" if op.remove else f"{op.key}={op.value:g}"
                    for op in entry.ops
                )
                log.info("client quotas of %s: %s", describe_entity(entity), changes)
        return response
