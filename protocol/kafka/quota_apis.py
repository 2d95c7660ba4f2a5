"""Client quotas on the Kafka listener: DescribeClientQuotas and AlterClientQuotas v0-1
(KIP-546; v1 is flexible), declared onto the native messages (written from Kafka's
message definitions), so `kafka-configs --entity-type users|clients` and admin clients
work."""

from __future__ import annotations

from protocol.api import ApiKey
from protocol.kafka.api_spec import KafkaApi
from protocol.kafka.api_spec import throttle_time
from protocol.kafka.schema import BOOL
from protocol.kafka.schema import FLOAT64
from protocol.kafka.schema import INT8
from protocol.kafka.schema import INT16
from protocol.kafka.schema import STRING
from protocol.kafka.schema import Array
from protocol.kafka.schema import Field
from protocol.kafka.schema import KStruct
from protocol.messages import AlterClientQuotasEntry
from protocol.messages import AlterClientQuotasEntryResult
from protocol.messages import AlterClientQuotasRequest
from protocol.messages import AlterClientQuotasResponse
from protocol.messages import ClientQuotaFilterComponent
from protocol.messages import ClientQuotaOp
from protocol.messages import ClientQuotaValue
from protocol.messages import DescribeClientQuotasEntry
from protocol.messages import DescribeClientQuotasRequest
from protocol.messages import DescribeClientQuotasResponse
from protocol.messages import QuotaEntityPart

_ENTITY = Array(
    KStruct(
        QuotaEntityPart,
        (Field("entity_type", STRING), Field("entity_name", STRING, nullable="0+")),
    )
)

DESCRIBE_CLIENT_QUOTAS = KafkaApi(
    ApiKey.DESCRIBE_CLIENT_QUOTAS,
    0,
    1,
    1,
    request=KStruct(
        DescribeClientQuotasRequest,
        (
            Field(
                "components",
                Array(
                    KStruct(
                        ClientQuotaFilterComponent,
                        (
                            Field("entity_type", STRING),
                            Field("match_type", INT8),
                            Field("match", STRING, nullable="0+"),
                        ),
                    )
                ),
            ),
            Field("strict", BOOL),
        ),
    ),
    response=KStruct(
        DescribeClientQuotasResponse,
        (
            throttle_time("0+"),
            Field("error_code", INT16),
            Field("error_message", STRING, nullable="0+"),
            Field(
                "entries",
                Array(
                    KStruct(
                        DescribeClientQuotasEntry,
                        (
                            Field("entity", _ENTITY),
                            Field(
                                "values",
                                Array(
                                    KStruct(
                                        ClientQuotaValue,
                                        (Field("key", STRING), Field("value", FLOAT64)),
                                    )
                                ),
                            ),
                        ),
                    )
                ),
                nullable="0+",
            ),
        ),
    ),
)

ALTER_CLIENT_QUOTAS = KafkaApi(
    ApiKey.ALTER_CLIENT_QUOTAS,
    0,
    1,
    1,
    request=KStruct(
        AlterClientQuotasRequest,
        (
            Field(
                "entries",
                Array(
                    KStruct(
                        AlterClientQuotasEntry,
                        (
                            Field("entity", _ENTITY),
                            Field(
                                "ops",
                                Array(
                                    KStruct(
                                        ClientQuotaOp,
                                        (
                                            Field("key", STRING),
                                            Field("value", FLOAT64),
                                            Field("remove", BOOL),
                                        ),
                                    )
                                ),
                            ),
                        ),
                    )
                ),
            ),
            Field("validate_only", BOOL),
        ),
    ),
    response=KStruct(
        AlterClientQuotasResponse,
        (
            throttle_time("0+"),
            Field(
                "entries",
                Array(
                    KStruct(
                        AlterClientQuotasEntryResult,
                        (
                            Field("error_code", INT16),
                            Field("error_message", STRING, nullable="0+"),
                            Field("entity", _ENTITY),
                        ),
                    )
                ),
            ),
        ),
    ),
)
