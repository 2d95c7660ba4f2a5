"""Security on the Kafka listener: SASL, SaslHandshake v0-1 (one body; after v1 the
tokens travel in SaslAuthenticate v0-2, KIP-152; after v0 as raw length-prefixed frames,
KIP-43, which the connection then reads as such: protocol/connection.py's SaslToken;
librdkafka 2.0, Debian's kcat, starts SASL only if v0 is offered, though it then uses
v1), and users' SCRAM credentials, DescribeUserScramCredentials and
AlterUserScramCredentials v0 (KIP-554). Declared onto the native messages (written from
Kafka's protocol guide and message definitions)."""

from __future__ import annotations

from protocol.api import ApiKey
from protocol.kafka.api_spec import KafkaApi
from protocol.kafka.api_spec import named
from protocol.kafka.api_spec import names_of
from protocol.kafka.schema import BYTES
from protocol.kafka.schema import INT8
from protocol.kafka.schema import INT16
from protocol.kafka.schema import INT32
from protocol.kafka.schema import INT64
from protocol.kafka.schema import STRING
from protocol.kafka.schema import Array
from protocol.kafka.schema import Field
from protocol.kafka.schema import KStruct
from protocol.messages import AlterUserScramCredentialsRequest
from protocol.messages import AlterUserScramCredentialsResponse
from protocol.messages import AlterUserScramCredentialsResult
from protocol.messages import CredentialInfo
from protocol.messages import DescribeUserScramCredentialsRequest
from protocol.messages import DescribeUserScramCredentialsResponse
from protocol.messages import DescribeUserScramCredentialsResult
from protocol.messages import SaslAuthenticateRequest
from protocol.messages import SaslAuthenticateResponse
from protocol.messages import SaslHandshakeRequest
from protocol.messages import SaslHandshakeResponse
from protocol.messages import ScramCredentialDeletion
from protocol.messages import ScramCredentialUpsertion

SASL_HANDSHAKE = KafkaApi(
    ApiKey.SASL_HANDSHAKE,
    0,
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

# Users' SCRAM credentials (KIP-554): the same native messages as the native listener,
# so confluent-kafka's AdminClient.describe_user_scram_credentials and
# alter_user_scram_credentials reach the same handlers (only version 0 exists, flexible).

DESCRIBE_USER_SCRAM_CREDENTIALS = KafkaApi(
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
    0,
    0,
    0,
    request=KStruct(
        DescribeUserScramCredentialsRequest,
        (
            Field(
                "users",
                Array(KStruct(None, (Field("name", STRING),))),
                nullable="0+",
                # Kafka describes every user for a null or an empty list alike.
                to_native=lambda users: names_of(users) or None,
                from_native=named,
            ),
        ),
    ),
    response=KStruct(
        DescribeUserScramCredentialsResponse,
        (
            Field("throttle_time_ms", INT32),
            Field("error_code", INT16),
            Field("error_message", STRING, nullable="0+"),
            Field(
                "results",
                Array(
                    KStruct(
                        DescribeUserScramCredentialsResult,
                        (
                            Field("user", STRING),
                            Field("error_code", INT16),
                            Field("error_message", STRING, nullable="0+"),
                            Field(
                                "credential_infos",
                                Array(
                                    KStruct(
                                        CredentialInfo,
                                        (Field("mechanism", INT8), Field("iterations", INT32)),
                                    )
                                ),
                            ),
                        ),
                    )
                ),
            ),
        ),
    ),
)

ALTER_USER_SCRAM_CREDENTIALS = KafkaApi(
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
    0,
    0,
    0,
    request=KStruct(
        AlterUserScramCredentialsRequest,
        (
            Field(
                "deletions",
                Array(
                    KStruct(
                        ScramCredentialDeletion,
                        (Field("name", STRING), Field("mechanism", INT8)),
                    )
                ),
            ),
            Field(
                "upsertions",
                Array(
                    KStruct(
                        ScramCredentialUpsertion,
                        (
                            Field("name", STRING),
                            Field("mechanism", INT8),
                            Field("iterations", INT32),
                            Field("salt", BYTES),
                            Field("salted_password", BYTES),
                        ),
                    )
                ),
            ),
        ),
    ),
    response=KStruct(
        AlterUserScramCredentialsResponse,
        (
            Field("throttle_time_ms", INT32),
            Field(
                "results",
                Array(
                    KStruct(
                        AlterUserScramCredentialsResult,
                        (
                            Field("user", STRING),
                            Field("error_code", INT16),
                            Field("error_message", STRING, nullable="0+"),
                        ),
                    )
                ),
            ),
        ),
    ),
)
