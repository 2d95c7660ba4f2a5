"""Security APIs (issue 18): ACLs (Kafka's CreateAcls, DescribeAcls, DeleteAcls; the
model and its integer codes are runtime/acl.py's), SCRAM credentials (Kafka's
DescribeUserScramCredentials and AlterUserScramCredentials, KIP-554). As in Kafka, a
client never sends a password: an upsertion carries the salt, the iteration count and
the salted password (PBKDF2), from which the controller derives what it stores
(runtime/scram.py); an answer never carries more than a user's mechanisms and
iteration counts."""

from __future__ import annotations

from protocol.messages.client_apis import Message

__all__ = [
    "AclCreation",
    "AclCreationResult",
    "AclDescription",
    "AclFilterSpec",
    "AclResource",
    "AlterUserScramCredentialsRequest",
    "AlterUserScramCredentialsResponse",
    "AlterUserScramCredentialsResult",
    "CreateAclsRequest",
    "CreateAclsResponse",
    "CredentialInfo",
    "DeleteAclsFilterResult",
    "DeleteAclsMatchingAcl",
    "DeleteAclsRequest",
    "DeleteAclsResponse",
    "DescribeAclsRequest",
    "DescribeAclsResponse",
    "DescribeUserScramCredentialsRequest",
    "DescribeUserScramCredentialsResponse",
    "DescribeUserScramCredentialsResult",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "ScramCredentialDeletion",
    "ScramCredentialUpsertion",
]


class SaslHandshakeRequest(Message, kw_only=True):
    """The mechanism the client wants (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)."""

    mechanism: str


class SaslHandshakeResponse(Message, kw_only=True):
    error_code: int = 0
    mechanisms: list[str] = []  # what this listener offers


class SaslAuthenticateRequest(Message, kw_only=True):
    """One SASL token of the exchange (Kafka's SaslAuthenticate, KIP-152)."""

    auth_bytes: bytes


class SaslAuthenticateResponse(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    auth_bytes: bytes = b""
    session_lifetime_ms: int = 0  # 0: no re-authentication (KIP-368 not used)


class ScramCredentialDeletion(Message, kw_only=True):
    name: str
    mechanism: int  # 1: SCRAM-SHA-256, 2: SCRAM-SHA-512 (Kafka's ScramMechanism)


class ScramCredentialUpsertion(Message, kw_only=True):
    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes


class AlterUserScramCredentialsRequest(Message, kw_only=True):
    deletions: list[ScramCredentialDeletion] = []
    upsertions: list[ScramCredentialUpsertion] = []


class AlterUserScramCredentialsResult(Message, kw_only=True):
    user: str
    error_code: int = 0
    error_message: str | None = None


class AlterUserScramCredentialsResponse(Message, kw_only=True):
    throttle_time_ms: int = 0
    results: list[AlterUserScramCredentialsResult] = []


class DescribeUserScramCredentialsRequest(Message, kw_only=True):
    users: list[str] | None = None  # None: every user


class CredentialInfo(Message, kw_only=True):
    mechanism: int
    iterations: int


class DescribeUserScramCredentialsResult(Message, kw_only=True):
    user: str
    error_code: int = 0
    error_message: str | None = None
    credential_infos: list[CredentialInfo] = []


class DescribeUserScramCredentialsResponse(Message, kw_only=True):
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None
    results: list[DescribeUserScramCredentialsResult] = []


# ------------------------------------------------------------------ ACLs


class AclCreation(Message, kw_only=True):
    resource_type: int
    resource_name: str
    pattern_type: int = 3  # LITERAL
    principal: str
    host: str = "*"
    operation: int
    permission_type: int


class CreateAclsRequest(Message, kw_only=True):
    creations: list[AclCreation]


class AclCreationResult(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None


class CreateAclsResponse(Message, kw_only=True):
    throttle_time_ms: int = 0
    results: list[AclCreationResult] = []  # one per creation, in order


class AclFilterSpec(Message, kw_only=True):
    """Which ACLs to describe or delete: ANY (1) and None match everything; pattern
    type MATCH (2) selects every ACL that applies to the name."""

    resource_type: int = 1
    resource_name: str | None = None
    pattern_type: int = 1
    principal: str | None = None
    host: str | None = None
    operation: int = 1
    permission_type: int = 1


class DescribeAclsRequest(AclFilterSpec, kw_only=True):
    pass


class AclDescription(Message, kw_only=True):
    principal: str
    host: str
    operation: int
    permission_type: int


class AclResource(Message, kw_only=True):
    resource_type: int
    resource_name: str
    pattern_type: int
    acls: list[AclDescription] = []


class DescribeAclsResponse(Message, kw_only=True):
    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = None
    resources: list[AclResource] = []


class DeleteAclsRequest(Message, kw_only=True):
    filters: list[AclFilterSpec]


class DeleteAclsMatchingAcl(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int


class DeleteAclsFilterResult(Message, kw_only=True):
    error_code: int = 0
    error_message: str | None = None
    matching_acls: list[DeleteAclsMatchingAcl] = []


class DeleteAclsResponse(Message, kw_only=True):
    throttle_time_ms: int = 0
    filter_results: list[DeleteAclsFilterResult] = []  # one per filter, in order
