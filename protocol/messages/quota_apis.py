"""Client quota APIs (issue 18): Kafka's DescribeClientQuotas and AlterClientQuotas
(KIP-546). An entity is a list of (type, name) parts: "user" and/or "client-id", a
null name meaning that type's default (Kafka's `<default>`). The quota keys and the
precedence of entities: runtime/quotas.py."""

from __future__ import annotations

from protocol.messages.client_apis import Message

__all__ = [
    "AlterClientQuotasEntry",
    "AlterClientQuotasEntryResult",
    "AlterClientQuotasRequest",
    "AlterClientQuotasResponse",
    "ClientQuotaFilterComponent",
    "ClientQuotaOp",
    "ClientQuotaValue",
    "DescribeClientQuotasEntry",
    "DescribeClientQuotasRequest",
    "DescribeClientQuotasResponse",
    "QuotaEntityPart",
]

# DescribeClientQuotas filter match types (Kafka's numbers).
MATCH_EXACT = 0  # the name given
MATCH_DEFAULT = 1  # the type's default entity
MATCH_ANY = 2  # any named (non-default) entity of the type


class QuotaEntityPart(Message, kw_only=True):
    entity_type: str  # "user" or "client-id"
    entity_name: str | None = None  # None: the default entity of the type


class ClientQuotaFilterComponent(Message, kw_only=True):
    entity_type: str
    match_type: int = MATCH_EXACT
    match: str | None = None  # the name, for MATCH_EXACT


class DescribeClientQuotasRequest(Message, kw_only=True):
    components: list[ClientQuotaFilterComponent] = []
    strict: bool = False  # True: only entities with no other types than the components'


class ClientQuotaValue(Message, kw_only=True):
    key: str
    value: float


class DescribeClientQuotasEntry(Message, kw_only=True):
    entity: list[QuotaEntityPart]
    values: list[ClientQuotaValue]


class DescribeClientQuotasResponse(Message, kw_only=True):
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None
    entries: list[DescribeClientQuotasEntry] | None = []


class ClientQuotaOp(Message, kw_only=True):
    key: str
    value: float = 0.0  # ignored when `remove`
    remove: bool = False


class AlterClientQuotasEntry(Message, kw_only=True):
    entity: list[QuotaEntityPart]
    ops: list[ClientQuotaOp]


class AlterClientQuotasRequest(Message, kw_only=True):
    entries: list[AlterClientQuotasEntry]
    validate_only: bool = False


class AlterClientQuotasEntryResult(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    entity: list[QuotaEntityPart]


class AlterClientQuotasResponse(Message, kw_only=True):
    throttle_time_ms: int = 0
    entries: list[AlterClientQuotasEntryResult] = []
