"""Client quotas, the model (issue 18; Kafka's client quotas, KIP-13, KIP-124, KIP-546):
which entities may carry a quota, which keys, which values are valid, and which entity's
quota applies to a request. Pure: no I/O. The metadata log holds the quotas
(ClientQuotaRecord, replayed by runtime/metadata_image.py); the controller checks
changes with the functions here (controller/quota_control.py), the client library
checks them before sending (client/quota_admin.py), and the broker enforces them
(broker/quota_enforcement.py).

An entity is a user, a client id, or a user and a client id; either name may be the
default of its type (None here, Kafka's `<default>`), which applies to every user (or
client id) that has no quota of its own. A request from user u with client id c takes,
for each key separately, the value of the first entity in QUOTA_PRECEDENCE that has
the key: the most specific match wins, as in Kafka.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

USER = "user"
CLIENT_ID = "client-id"
ENTITY_TYPES = (USER, CLIENT_ID)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
# key -> (is an integer, what it limits)
QUOTA_KEYS: dict[str, tuple[bool, str]] = {
    PRODUCER_BYTE_RATE: (True, "bytes a second of Produce requests"),
    CONSUMER_BYTE_RATE: (True, "bytes a second of consumer Fetch answers"),
    REQUEST_PERCENTAGE: (False, "percent of one event loop's time handling requests"),
}
# Kafka has these too; minibroker does not enforce them (refused, said so).
UNSUPPORTED_KEYS = ("controller_mutation_rate", "connection_creation_rate")
# A byte rate above this is no limit at all (and a float holds it exactly).
MAX_QUOTA_VALUE = float(2**53)

# An entity, canonical: its (type, name) parts sorted by type ("client-id" < "user"),
# a None name being the type's default.
QuotaEntity = tuple[tuple[str, str | None], ...]
DEFAULT_NAME = "<default>"  # how Kafka's tools print a default entity's name


def entity_of(parts: Iterable[tuple[str, str | None]]) -> QuotaEntity:
    return tuple(sorted(parts))


def entity_order(entity: QuotaEntity) -> tuple[tuple[str, bool, str], ...]:
    """A sort key (a default name, None, sorts before every name)."""
    return tuple((t, name is not None, name or "") for t, name in entity)


def entity_problem(parts: list[tuple[str, str | None]]) -> str | None:
    """What is wrong with an entity given as (type, name) parts, or None."""
    if not parts:
        return "a quota entity needs a user, a client id, or both"
    types = [t for t, _ in parts]
    for t in types:
        if t == "ip":
            return "ip quotas (connection rates) are not supported; use user or client-id"
        if t not in ENTITY_TYPES:
            return f"unknown quota entity type {t!r}; use {USER!r} or {CLIENT_ID!r}"
    if len(set(types)) != len(types):
        return f"entity type named twice in {describe_entity(entity_of(parts))}"
    for t, name in parts:
        if name is not None and not name:
            return f"empty {t} name; give a name, or the default entity (<default>)"
    return None


def value_problem(key: str, value: float) -> str | None:
    """What is wrong with setting quota `key` to `value`, or None."""
    if key in UNSUPPORTED_KEYS:
        return f"quota key {key!r} is not supported; use one of {', '.join(QUOTA_KEYS)}"
    if key not in QUOTA_KEYS:
        return f"unknown quota key {key!r}; use one of {', '.join(QUOTA_KEYS)}"
    integer, _ = QUOTA_KEYS[key]
    if math.isnan(value) or value <= 0:
        return f"{key} must be positive, got {value:g}"
    if value > MAX_QUOTA_VALUE:
        return f"{key} must be at most {MAX_QUOTA_VALUE:.0f}, got {value:g}"
    if integer and value != math.floor(value):
        return f"{key} is a whole number of bytes a second, got {value:g}"
    return None


def key_problem(key: str) -> str | None:
    """What is wrong with removing quota `key`, or None."""
    if key not in QUOTA_KEYS:
        return f"unknown quota key {key!r}; use one of {', '.join(QUOTA_KEYS)}"
    return None


def describe_entity(entity: QuotaEntity) -> str:
    """Kafka's way to name an entity: "user 'alice', client-id <default>"."""
    return ", ".join(
        f"{t} {DEFAULT_NAME if name is None else repr(name)}"
        for t, name in sorted(entity, key=lambda p: ENTITY_TYPES.index(p[0]))
    )


def quota_precedence(user: str, client_id: str) -> tuple[QuotaEntity, ...]:
    """The entities whose quota applies to user `user` with client id `client_id`,
    most specific first (Kafka's order: /users/u/clients/c, /users/u/clients/<default>,
    /users/u, /users/<default>/clients/c, /users/<default>/clients/<default>,
    /users/<default>, /clients/c, /clients/<default>)."""
    return (
        ((CLIENT_ID, client_id), (USER, user)),
        ((CLIENT_ID, None), (USER, user)),
        ((USER, user),),
        ((CLIENT_ID, client_id), (USER, None)),
        ((CLIENT_ID, None), (USER, None)),
        ((USER, None),),
        ((CLIENT_ID, client_id),),
        ((CLIENT_ID, None),),
    )


def resolve(
    quotas: dict[QuotaEntity, dict[str, float]], user: str, client_id: str, key: str
) -> tuple[float, tuple[str, str]] | None:
    """The quota on `key` for this user and client id, and who shares it: (value,
    (user, client id)) where a part the matched entity does not name is "" (a quota on
    /users/u is shared by all of u's client ids; one on /clients/<default> is each
    client id's own, as Kafka's metric tags). None: no quota."""
    for entity in quota_precedence(user, client_id):
        values = quotas.get(entity)
        if values is not None and key in values:
            types = {t for t, _ in entity}
            sharer = (user if USER in types else "", client_id if CLIENT_ID in types else "")
            return values[key], sharer
    return None


def user_of(principal: str) -> str:
    """The user name of a principal ("User:alice" -> "alice"; "User:ANONYMOUS" ->
    "ANONYMOUS", which the user default applies to, as in Kafka)."""
    return principal.removeprefix("User:")
