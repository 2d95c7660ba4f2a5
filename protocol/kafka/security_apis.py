"""SASL on the Kafka listener: SaslHandshake (v1: the tokens then travel in
SaslAuthenticate; v0's raw tokens are not served, as no client this project serves
needs them) and SaslAuthenticate v0-2 (KIP-152), declared onto the native messages
(written from Kafka's protocol guide and message definitions)."""

from __future__ import annotations

from protocol.api import ApiKey
from protocol.kafka.api_spec import KafkaApi
from protocol.kafka.schema import BYTES
from protocol.kafka.schema import INT16
from protocol.kafka.schema import INT64
from protocol.kafka.schema import STRING
from protocol.kafka.schema import Array
from protocol.kafka.schema import Field
from protocol.kafka.schema import KStruct
from protocol.messages import SaslAuthenticateRequest
from protocol.messages import SaslAuthenticateResponse
from protocol.messages import SaslHandshakeRequest
from protocol.messages import SaslHandshakeResponse

SASL_HANDSHAKE = KafkaApi(
    ApiKey.SASL_HANDSHAKE,
    1,
    1,
    99,  # never flexible
    request=KStruct(SaslHandshakeRequest, (Field("mechanism", STRING),)),
    response=KStruct(
        SaslHandshakeResponse,
        (Field("error_code", INT16), Field("mechanisms", Array(STRING))),
    ),
)

SASL_AUTHENTICATE = KafkaApi(
    ApiKey.SASL_AUTHENTICATE,
    0,
    2,
    2,
    request=KStruct(SaslAuthenticateRequest, (Field("auth_bytes", BYTES),)),
    response=KStruct(
        SaslAuthenticateResponse,
        (
            Field("error_code", INT16),
            Field("error_message", STRING, nullable="0+"),
            Field("auth_bytes", BYTES),
            Field("session_lifetime_ms", INT64, "1+", default=0),
        ),
    ),
)
