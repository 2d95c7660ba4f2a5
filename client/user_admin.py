"""Users' SCRAM credentials from AsyncAdmin (issue 18; Kafka's
Admin.alterUserScramCredentials / describeUserScramCredentials, kafka-configs
--add-config 'SCRAM-SHA-256=[password=...]'): the password is salted and hashed here
(PBKDF2, runtime/scram.py) and only the salt and the salted password travel, as Kafka's
admin client does."""

from __future__ import annotations

from dataclasses import dataclass

from client.cluster import ClusterClient
from client.errors import error_for
from protocol.errors import ErrorCode
from protocol.messages import AlterUserScramCredentialsRequest
from protocol.messages import AlterUserScramCredentialsResponse
from protocol.messages import DescribeUserScramCredentialsRequest
from protocol.messages import DescribeUserScramCredentialsResponse
from protocol.messages import ScramCredentialDeletion
from protocol.messages import ScramCredentialUpsertion
from runtime.scram import DEFAULT_ITERATIONS
from runtime.scram import MECHANISMS
from runtime.scram import mechanism_number
from runtime.scram import new_upsertion


@dataclass(frozen=True)
class UserCredential:
    mechanism: str  # SCRAM-SHA-256 | SCRAM-SHA-512
    iterations: int


class UserAdmin:
    """Mixed into AsyncAdmin."""

    _cluster: ClusterClient

    async def _alter_credentials(self, request: AlterUserScramCredentialsRequest) -> None:
        self._check()  # type: ignore[attr-defined]
        answer = await self._cluster.send_any(request)
        assert isinstance(answer, AlterUserScramCredentialsResponse)
        for result in answer.results:
            if result.error_code != ErrorCode.NONE:
                raise error_for(
                    ErrorCode.of(result.error_code),
                    f"user {result.user!r}: {result.error_message or 'refused'}",
                )

    async def create_user(
        self,
        name: str,
        password: str,
        *,
        mechanism: str = "SCRAM-SHA-256",
        iterations: int = DEFAULT_ITERATIONS,
    ) -> None:
        """Create the user, or replace its credential for `mechanism`."""
        if not password:
            raise ValueError("the password is empty")
        number = mechanism_number(mechanism)
        salt, salted = new_upsertion(password, number, iterations)
        upsertion = ScramCredentialUpsertion(
            name=name, mechanism=number, iterations=iterations, salt=salt, salted_password=salted
        )
        await self._alter_credentials(AlterUserScramCredentialsRequest(upsertions=[upsertion]))

    async def delete_user(self, name: str, *, mechanism: str | None = None) -> None:
        """Remove the user's credential for `mechanism` (None: every one it has)."""
        if mechanism is not None:
            mechanisms = [mechanism_number(mechanism)]
        else:
            found = await self.describe_users([name])
            mechanisms = [mechanism_number(c.mechanism) for c in found[name]]
        deletions = [ScramCredentialDeletion(name=name, mechanism=m) for m in mechanisms]
        await self._alter_credentials(AlterUserScramCredentialsRequest(deletions=deletions))

    async def describe_users(
        self, users: list[str] | None = None
    ) -> dict[str, list[UserCredential]]:
        """Each user's mechanisms and iteration counts (None: every user). A user named
        that has no credential raises ResourceNotFoundError."""
        self._check()  # type: ignore[attr-defined]
        answer = await self._cluster.send_any(DescribeUserScramCredentialsRequest(users=users))
        assert isinstance(answer, DescribeUserScramCredentialsResponse)
        out: dict[str, list[UserCredential]] = {}
        for result in answer.results:
            if result.error_code != ErrorCode.NONE:
                raise error_for(
                    ErrorCode.of(result.error_code), result.error_message or result.user
                )
            out[result.user] = [
                UserCredential(MECHANISMS[c.mechanism][0], c.iterations)
                for c in result.credential_infos
                if c.mechanism in MECHANISMS
            ]
        return out
