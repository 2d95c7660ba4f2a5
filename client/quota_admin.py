"""Client quotas from AsyncAdmin (issue 18; Kafka's Admin.alterClientQuotas /
describeClientQuotas, `kafka-configs --alter --add-config producer_byte_rate=...
--entity-type users --entity-name u`). An entity is given as `user=` and/or
`client_id=`, a name or DEFAULT (the type's default entity, Kafka's `<default>`).
Keys and values are checked here first (runtime/client_quotas.py), so a bad one fails
with a clear ValueError before anything is sent; the controller checks them again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from client.cluster import ClusterClient
from client.errors import error_for
from protocol.errors import ErrorCode
from protocol.messages import AlterClientQuotasEntry
from protocol.messages import AlterClientQuotasRequest
from protocol.messages import AlterClientQuotasResponse
from protocol.messages import ClientQuotaFilterComponent
from protocol.messages import ClientQuotaOp
from protocol.messages import DescribeClientQuotasRequest
from protocol.messages import DescribeClientQuotasResponse
from protocol.messages import QuotaEntityPart
from protocol.messages.quota_apis import MATCH_DEFAULT
from protocol.messages.quota_apis import MATCH_EXACT
from runtime.client_quotas import CLIENT_ID
from runtime.client_quotas import USER
from runtime.client_quotas import QuotaEntity
from runtime.client_quotas import describe_entity
from runtime.client_quotas import entity_of
from runtime.client_quotas import entity_problem
from runtime.client_quotas import key_problem
from runtime.client_quotas import value_problem


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default()  # the default entity of a type (Kafka's <default>)
Name = str | _Default | None  # None: the entity has no part of this type


@dataclass(frozen=True)
class ClientQuotaEntry:
    """One entity's quotas: `user` / `client_id` a name, None for the default entity,
    absent from `entity` when the entity has no such part."""

    entity: QuotaEntity
    values: dict[str, float]

    @property
    def description(self) -> str:
        return describe_entity(self.entity)


def _parts(user: Name, client_id: Name) -> list[tuple[str, str | None]]:
    parts: list[tuple[str, str | None]] = []
    for entity_type, name in ((USER, user), (CLIENT_ID, client_id)):
        if name is not None:
            parts.append((entity_type, None if isinstance(name, _Default) else name))
    problem = entity_problem(parts)
    if problem is not None:
        raise ValueError(problem)
    return parts


class QuotaAdmin:
    """Mixed into AsyncAdmin."""

    _cluster: ClusterClient

    async def alter_client_quotas(
        self,
        *,
        user: Name = None,
        client_id: Name = None,
        set_values: dict[str, float] | None = None,
        remove: list[str] | tuple[str, ...] = (),
        validate_only: bool = False,
    ) -> None:
        """Set `set_values` and remove the keys `remove` of one entity (a user, a
        client id, or both; DEFAULT for a type's default)."""
        parts = _parts(user, client_id)
        ops = []
        for key, value in (set_values or {}).items():
            problem = value_problem(key, float(value))
            if problem is not None:
                raise ValueError(problem)
            ops.append(ClientQuotaOp(key=key, value=float(value)))
        for key in remove:
            problem = key_problem(key)
            if problem is not None:
                raise ValueError(problem)
            ops.append(ClientQuotaOp(key=key, remove=True))
        if not ops:
            raise ValueError("nothing to set or remove")
        entity = [QuotaEntityPart(entity_type=t, entity_name=n) for t, n in parts]
        request = AlterClientQuotasRequest(
            entries=[AlterClientQuotasEntry(entity=entity, ops=ops)], validate_only=validate_only
        )
        self._check()  # type: ignore[attr-defined]
        answer = await self._cluster.send_any(request)
        assert isinstance(answer, AlterClientQuotasResponse)
        for result in answer.entries:
            if result.error_code != ErrorCode.NONE:
                raise error_for(
                    ErrorCode.of(result.error_code),
                    f"{describe_entity(entity_of(parts))}: {result.error_message or 'refused'}",
                )

    async def describe_client_quotas(
        self, *, user: Name = None, client_id: Name = None, strict: bool = False
    ) -> list[ClientQuotaEntry]:
        """The entities with quotas, filtered: `user` / `client_id` a name or DEFAULT
        to match only that, None to match anything (`strict`: only entities with no
        other part than those given)."""
        components = [
            ClientQuotaFilterComponent(entity_type=t, match_type=MATCH_DEFAULT)
            if isinstance(name, _Default)
            else ClientQuotaFilterComponent(entity_type=t, match_type=MATCH_EXACT, match=name)
            for t, name in ((USER, user), (CLIENT_ID, client_id))
            if name is not None
        ]
        self._check()  # type: ignore[attr-defined]
        answer = await self._cluster.send_any(
            DescribeClientQuotasRequest(components=components, strict=strict)
        )
        assert isinstance(answer, DescribeClientQuotasResponse)
        if answer.error_code != ErrorCode.NONE:
            raise error_for(ErrorCode.of(answer.error_code), answer.error_message or "refused")
        return [
            ClientQuotaEntry(
                entity_of((p.entity_type, p.entity_name) for p in e.entity),
                {v.key: v.value for v in e.values},
            )
            for e in answer.entries or []
        ]
