"""The authorization settings both servers have, declared once (Kafka's names:
authorizer, super.users, allow.everyone.if.no.acl.found), and the AuthorizerSettings
they make (runtime/acl.py decides with them)."""

from __future__ import annotations

from typing import Any
from typing import Protocol

from runtime.acl import AuthorizerSettings
from runtime.acl import principal_problem
from runtime.settings import ConfigError
from runtime.settings import setting


def parse_super_users(value: str, *, option: str = "--super-users") -> frozenset[str]:
    """`User:admin;User:CN=broker-1,O=minibroker` (semicolons: a certificate's subject
    has commas)."""
    users = frozenset(u.strip() for u in value.split(";") if u.strip())
    for user in users:
        problem = principal_problem(user)
        if problem is not None:
            raise ConfigError(f"{option}: {problem}")
    return users


def authorizer_enabled_setting() -> Any:
    return setting(
        False,
        doc="Check every request against the ACLs in the metadata log (`minibroker acl`); "
        "off, every principal may do everything (authorizer.class.name).",
    )


def super_users_setting() -> Any:
    return setting(
        "",
        parse=parse_super_users,
        shown_default="none",
        doc="Principals that pass every ACL check, separated by semicolons: "
        "User:admin;User:CN=broker-1 (a SASL user, or a TLS client certificate's subject). "
        "With the authorizer on, the servers' own principals belong here or need "
        "ClusterAction on the cluster (super.users).",
    )


def allow_everyone_if_no_acl_found_setting() -> Any:
    return setting(
        False,
        doc="With the authorizer on, allow a request on a resource that no ACL names at "
        "all (allow.everyone.if.no.acl.found); off, such a request is refused.",
    )


class AuthorizationSettings(Protocol):
    @property
    def authorizer_enabled(self) -> bool: ...
    @property
    def super_users(self) -> frozenset[str]: ...
    @property
    def allow_everyone_if_no_acl_found(self) -> bool: ...


def authorizer_settings(config: AuthorizationSettings) -> AuthorizerSettings:
    return AuthorizerSettings(
        enabled=config.authorizer_enabled,
        super_users=config.super_users,
        allow_everyone_if_no_acl_found=config.allow_everyone_if_no_acl_found,
    )
