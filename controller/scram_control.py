"""Users' SCRAM credentials (Kafka's ScramControlManager, KIP-554): AlterUserScram-
Credentials turns each upsertion's salted password into the stored and server keys
(runtime/scram.py) and writes them to the metadata log, deletions remove them; every
user's result is its own, and a request whose results are all errors writes nothing.
The password itself never reaches the controller, and nothing derived from it beyond
what checks a proof is kept.

The bootstrap user (KIP-900's `kafka-storage format --add-scram`): a SASL controller
listener needs a user before the first broker can register, and only the controller
can write one then. With --sasl-bootstrap-username, each controller that becomes
active writes that user's credentials for the SCRAM mechanisms it lacks, and nothing
when it has them all: a restart or a failover writes nothing, a password changed since
(AlterUserScramCredentials) stays changed. The password comes from the controller's
own file; only the derived keys reach the log."""

from __future__ import annotations

import logging

from controller.context import ControllerPart
from controller.state import MetadataImage
from protocol.errors import ErrorCode
from protocol.messages import AlterUserScramCredentialsRequest
from protocol.messages import AlterUserScramCredentialsResponse
from protocol.messages import AlterUserScramCredentialsResult
from protocol.metadata_records import MetadataRecord
from protocol.metadata_records import RemoveScramCredentialRecord
from protocol.metadata_records import ScramCredentialRecord
from runtime.scram import DEFAULT_ITERATIONS
from runtime.scram import MECHANISMS
from runtime.scram import ScramCredential
from runtime.scram import credential_problem
from runtime.scram import new_upsertion

log = logging.getLogger(__name__)

# Upsertions and deletions in one request, at most (a bound, as every list here).
MAX_CHANGES = 1000


class ScramControl(ControllerPart):
    async def write_bootstrap_user(self, name: str, password: str) -> list[str]:
        """Credentials of `name` for each SCRAM mechanism it has none of (the
        mechanisms' names written; empty: it had them all). Raises NotLeaderError
        when this controller is not the active one."""

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], list[str]]:
            new: list[ScramCredentialRecord] = []
            for mechanism in sorted(MECHANISMS):
                if (name, mechanism) in image.scram_credentials:
                    continue
                salt, salted = new_upsertion(password, mechanism, DEFAULT_ITERATIONS)
                cred = ScramCredential.from_salted_password(
                    mechanism, DEFAULT_ITERATIONS, salt, salted
                )
                new.append(_record(name, cred))
            return list(new), [MECHANISMS[r.mechanism][0] for r in new]

        written = await self.writer.commit(build)
        if written:
            log.info("bootstrap user %r created (%s)", name, ", ".join(written))
        return written

    async def alter_user_scram_credentials(
        self, request: AlterUserScramCredentialsRequest
    ) -> AlterUserScramCredentialsResponse:
        changes = len(request.upsertions) + len(request.deletions)
        if changes > MAX_CHANGES:
            names = {c.name for c in [*request.upsertions, *request.deletions]}
            return _all_failed(
                names,
                ErrorCode.INVALID_REQUEST,
                f"{changes} credential changes in one request; at most {MAX_CHANGES}",
            )

        def build(
            image: MetadataImage,
        ) -> tuple[list[MetadataRecord], AlterUserScramCredentialsResponse]:
            errors: dict[str, tuple[ErrorCode, str]] = {}
            seen: set[tuple[str, int]] = set()
            for change in [*request.upsertions, *request.deletions]:
                key = (change.name, change.mechanism)
                if key in seen:
                    errors[change.name] = (
                        ErrorCode.DUPLICATE_RESOURCE,
                        f"user {change.name!r} mechanism {change.mechanism} named twice",
                    )
                seen.add(key)
            for d in request.deletions:
                if d.mechanism not in MECHANISMS:
                    errors.setdefault(
                        d.name,
                        (ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"mechanism {d.mechanism}"),
                    )
                elif (d.name, d.mechanism) not in image.scram_credentials:
                    errors.setdefault(
                        d.name,
                        (
                            ErrorCode.RESOURCE_NOT_FOUND,
                            f"user {d.name!r} has no {MECHANISMS[d.mechanism][0]} credential",
                        ),
                    )
            for u in request.upsertions:
                problem = credential_problem(
                    u.name, u.mechanism, u.iterations, u.salt, u.salted_password
                )
                if problem is not None:
                    code = (
                        ErrorCode.UNSUPPORTED_SASL_MECHANISM
                        if u.mechanism not in MECHANISMS
                        else ErrorCode.UNACCEPTABLE_CREDENTIAL
                    )
                    errors.setdefault(u.name, (code, problem))
            records: list[MetadataRecord] = []
            for d in request.deletions:
                if d.name not in errors:
                    records.append(RemoveScramCredentialRecord(name=d.name, mechanism=d.mechanism))
            for u in request.upsertions:
                if u.name not in errors:
                    cred = ScramCredential.from_salted_password(
                        u.mechanism, u.iterations, u.salt, u.salted_password
                    )
                    records.append(_record(u.name, cred))
            names = dict.fromkeys(c.name for c in [*request.deletions, *request.upsertions])
            results = [
                AlterUserScramCredentialsResult(
                    user=name,
                    error_code=int(errors[name][0]) if name in errors else 0,
                    error_message=errors[name][1] if name in errors else None,
                )
                for name in names
            ]
            return records, AlterUserScramCredentialsResponse(results=results)

        response = await self.writer.commit(build)
        for r in response.results:
            if r.error_code == 0:
                log.info("SCRAM credentials of user %r changed", r.user)
        return response


def _record(name: str, cred: ScramCredential) -> ScramCredentialRecord:
    return ScramCredentialRecord(
        name=name,
        mechanism=cred.mechanism,
        iterations=cred.iterations,
        salt=cred.salt,
        stored_key=cred.stored_key,
        server_key=cred.server_key,
    )


def _all_failed(
    names: set[str], code: ErrorCode, message: str
) -> AlterUserScramCredentialsResponse:
    return AlterUserScramCredentialsResponse(
        results=[
            AlterUserScramCredentialsResult(user=n, error_code=int(code), error_message=message)
            for n in sorted(names)
        ]
    )
