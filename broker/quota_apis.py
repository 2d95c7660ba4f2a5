"""The client quota APIs on a broker (KIP-546): DescribeClientQuotas answered from this
broker's metadata image, AlterClientQuotas forwarded to the controller and answered
once this broker's image shows the changes that succeeded (so a Describe right after,
and the enforcement, see them)."""

from __future__ import annotations

from collections.abc import Awaitable
from collections.abc import Callable

from broker.metadata_image import MetadataImage
from protocol.errors import ErrorCode
from protocol.messages import AlterClientQuotasEntryResult
from protocol.messages import AlterClientQuotasRequest
from protocol.messages import AlterClientQuotasResponse
from protocol.messages import ClientQuotaFilterComponent
from protocol.messages import ClientQuotaValue
from protocol.messages import DescribeClientQuotasEntry
from protocol.messages import DescribeClientQuotasRequest
from protocol.messages import DescribeClientQuotasResponse
from protocol.messages import Message
from protocol.messages import QuotaEntityPart
from protocol.messages.quota_apis import MATCH_ANY
from protocol.messages.quota_apis import MATCH_DEFAULT
from protocol.messages.quota_apis import MATCH_EXACT
from runtime.client_quotas import ENTITY_TYPES
from runtime.client_quotas import QuotaEntity
from runtime.client_quotas import entity_of
from runtime.client_quotas import entity_order
from runtime.peer_rpc import RpcError
from runtime.server import RequestContext

Forward = Callable[[Message, float], Awaitable[Message]]
ForwardError = Callable[[RpcError], tuple[int, str]]
WaitForImage = Callable[[Callable[[], bool], float], Awaitable[None]]


def filter_problem(components: list[ClientQuotaFilterComponent]) -> str | None:
    types = [c.entity_type for c in components]
    if len(set(types)) != len(types):
        return "an entity type named twice in the filter"
    for c in components:
        if c.entity_type not in ENTITY_TYPES:
            return f"unknown quota entity type {c.entity_type!r}; use one of {ENTITY_TYPES}"
        if c.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY):
            return f"unknown match type {c.match_type} for {c.entity_type}"
        if c.match_type == MATCH_EXACT and c.match is None:
            return f"an exact match on {c.entity_type} needs a name"
    return None


def matches(
    entity: QuotaEntity, components: list[ClientQuotaFilterComponent], strict: bool
) -> bool:
    names = dict(entity)
    if strict and set(names) != {c.entity_type for c in components}:
        return False
    for c in components:
        if c.entity_type not in names:
            return False
        name = names[c.entity_type]
        if c.match_type == MATCH_EXACT and name != c.match:
            return False
        if c.match_type == MATCH_DEFAULT and name is not None:
            return False
        if c.match_type == MATCH_ANY and name is None:
            return False
    return True


class QuotaApis:
    def __init__(
        self,
        image: MetadataImage,
        forward: Forward,
        forward_error: ForwardError,
        wait_for_image: WaitForImage,
        max_wait_s: float,
    ) -> None:
        self.image = image
        self._forward = forward
        self._forward_error = forward_error
        self._wait_for_image = wait_for_image
        self.max_wait_s = max_wait_s

    async def describe_client_quotas(
        self, ctx: RequestContext, req: DescribeClientQuotasRequest
    ) -> DescribeClientQuotasResponse:
        problem = filter_problem(req.components)
        if problem is not None:
            return DescribeClientQuotasResponse(
                error_code=int(ErrorCode.INVALID_REQUEST), error_message=problem, entries=None
            )
        quotas = self.image.client_quotas
        entries = [
            DescribeClientQuotasEntry(
                entity=[QuotaEntityPart(entity_type=t, entity_name=n) for t, n in entity],
                values=[
                    ClientQuotaValue(key=k, value=v) for k, v in sorted(quotas[entity].items())
                ],
            )
            for entity in sorted(quotas, key=entity_order)
            if matches(entity, req.components, req.strict)
        ]
        return DescribeClientQuotasResponse(entries=entries)

    async def alter_client_quotas(
        self, ctx: RequestContext, req: AlterClientQuotasRequest
    ) -> AlterClientQuotasResponse:
        try:
            resp = await self._forward(req, self.max_wait_s)
        except RpcError as exc:
            code, message = self._forward_error(exc)
            return AlterClientQuotasResponse(
                entries=[
                    AlterClientQuotasEntryResult(
                        error_code=code, error_message=message, entity=e.entity
                    )
                    for e in req.entries
                ]
            )
        assert isinstance(resp, AlterClientQuotasResponse)
        if req.validate_only:
            return resp
        # What the image must show: each successful entry's operations.
        expected: list[tuple[QuotaEntity, str, float | None]] = []
        for entry, result in zip(req.entries, resp.entries, strict=False):
            if result.error_code == ErrorCode.NONE:
                entity = entity_of((p.entity_type, p.entity_name) for p in entry.entity)
                expected.extend(
                    (entity, op.key, None if op.remove else float(op.value)) for op in entry.ops
                )

        def visible() -> bool:
            quotas = self.image.client_quotas
            return all(quotas.get(e, {}).get(k) == v for e, k, v in expected)

        await self._wait_for_image(visible, self.max_wait_s)
        return resp
