"""Access control lists (issue 18), Kafka's model: what an ACL is, which ACLs a filter
selects, and the rule that decides a request. Pure: no I/O, no asyncio; the broker,
the controller and the client (for names and validation) all use it.

An ACL binds a resource pattern to an access control entry:

    (resource type, resource name, pattern type) + (principal, host, operation, permission)

- resource types: Topic, Group, Cluster (its one name is "kafka-cluster"), as Kafka;
- pattern types: LITERAL (the name, or "*" for every resource of the type) and PREFIXED
  (every name starting with it);
- principals "User:alice" or "User:*" (every principal); hosts an IP address or "*";
- permissions ALLOW and DENY; DENY wins over ALLOW.

The rule (`AclAuthorizer.authorize`), as Kafka's StandardAuthorizer:
1. a super user may do anything;
2. the ACLs whose pattern matches the resource and whose principal and host match the
   request are looked at; a DENY for the operation (or for All) refuses;
3. an ALLOW for the operation, for All, or for an operation that implies it allows:
   Read, Write, Delete and Alter imply Describe; AlterConfigs implies DescribeConfigs;
4. otherwise refused, unless no ACL at all matches the resource and
   allow.everyone.if.no.acl.found is set.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol
from typing import TypeVar

from protocol.errors import ErrorCode
from protocol.invariants import invariant
from protocol.messages import AclFilterSpec
from protocol.metadata_records import AccessControlEntryRecord

CLUSTER_NAME = "kafka-cluster"  # the cluster resource's one name, as Kafka's
WILDCARD = "*"  # a LITERAL name, a principal's name or a host matching every one

E = TypeVar("E", bound=IntEnum)


class ResourceType(IntEnum):
    """Kafka's codes (AclResourceType)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only: LITERAL or PREFIXED with exactly the name
    MATCH = 2  # filters only: every pattern that applies to the name
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermission(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


# An ALLOW for any of these also allows the key (Kafka's implied operations).
IMPLIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset(
        {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.ALTER_CONFIGS}),
}

# The operations an ACL on each resource type may name (Kafka's table); others are
# refused at creation, since no request would ever be checked against them.
OPERATIONS_OF: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset(
        {
            AclOperation.ALL,
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.CREATE,
            AclOperation.DELETE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
        }
    ),
    ResourceType.GROUP: frozenset(
        {AclOperation.ALL, AclOperation.READ, AclOperation.DELETE, AclOperation.DESCRIBE}
    ),
    ResourceType.CLUSTER: frozenset(
        {
            AclOperation.ALL,
            AclOperation.CREATE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE,
            AclOperation.CLUSTER_ACTION,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
            AclOperation.IDEMPOTENT_WRITE,
        }
    ),
}


KIND_LABELS: dict[type, str] = {
    ResourceType: "resource type",
    PatternType: "pattern type",
    AclOperation: "operation",
    AclPermission: "permission",
}


def display_name(value: IntEnum) -> str:
    """Kafka's spelling in tools: "ClusterAction", "Topic", "Prefixed"."""
    return "".join(part.capitalize() for part in value.name.split("_"))


def parse_enum(kind: type[E], text: str, *, allowed: Iterable[E]) -> E:
    """`text` as a member of `kind`, in Kafka's spelling or ours, any case
    ("ClusterAction", "cluster-action", "CLUSTER_ACTION"). Raises ValueError naming
    the accepted values."""
    wanted = text.replace("-", "").replace("_", "").lower()
    choices = list(allowed)
    for member in choices:
        if member.name.replace("_", "").lower() == wanted:
            return member
    accepted = ", ".join(display_name(m) for m in choices)
    label = KIND_LABELS.get(kind, kind.__name__)
    raise ValueError(f"{text!r} is not an ACL {label}: use one of {accepted}")


@dataclass(frozen=True, order=True)
class AclBinding:
    """One ACL: a resource pattern and an entry."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermission

    def wire_fields(self) -> dict[str, int | str]:
        """The binding as the messages and records spell it (Kafka's codes)."""
        return {
            "resource_type": int(self.resource_type),
            "resource_name": self.resource_name,
            "pattern_type": int(self.pattern_type),
            "principal": self.principal,
            "host": self.host,
            "operation": int(self.operation),
            "permission_type": int(self.permission),
        }

    def to_record(self, acl_id: str) -> AccessControlEntryRecord:
        return AccessControlEntryRecord(id=acl_id, **self.wire_fields())  # type: ignore[arg-type]

    def describe(self) -> str:
        what = f"{display_name(self.resource_type)}:{self.resource_name}"
        if self.pattern_type is PatternType.PREFIXED:
            what += "*"
        return (
            f"{display_name(self.permission)} {self.principal} from {self.host} "
            f"{display_name(self.operation)} on {what}"
        )


def binding_problem(binding: AclBinding) -> str | None:
    """Why Kafka would refuse to create `binding` (None: it may be created)."""
    if binding.resource_type not in OPERATIONS_OF:
        return f"resource type {binding.resource_type.name} cannot be given an ACL"
    if binding.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return "an ACL's pattern type is LITERAL or PREFIXED"
    if not binding.resource_name:
        return "the resource name is empty"
    if binding.resource_type is ResourceType.CLUSTER and binding.resource_name != CLUSTER_NAME:
        return f"the cluster resource is named {CLUSTER_NAME!r}"
    if binding.permission not in (AclPermission.ALLOW, AclPermission.DENY):
        return "an ACL's permission is ALLOW or DENY"
    if binding.operation not in OPERATIONS_OF[binding.resource_type]:
        allowed = ", ".join(sorted(display_name(o) for o in OPERATIONS_OF[binding.resource_type]))
        return (
            f"operation {display_name(binding.operation)} does not apply to a "
            f"{display_name(binding.resource_type)} (use one of {allowed})"
        )
    problem = principal_problem(binding.principal)
    if problem is not None:
        return problem
    if binding.host != WILDCARD:
        try:
            ipaddress.ip_address(binding.host)
        except ValueError:
            return f"host {binding.host!r} is neither an IP address nor {WILDCARD!r}"
    return None


def principal_problem(principal: str) -> str | None:
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name:
        return f"principal {principal!r} is not of the form User:<name> (or User:*)"
    return None


@dataclass(frozen=True)
class AclFilter:
    """Which ACLs a DescribeAcls or DeleteAcls names: ANY / None match everything."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermission = AclPermission.ANY

    def problem(self) -> str | None:
        """Why the filter selects nothing sensible (UNKNOWN anywhere), else None."""
        for field_name in ("resource_type", "pattern_type", "operation", "permission"):
            if getattr(self, field_name).name == "UNKNOWN":
                return f"the filter's {field_name.replace('_', ' ')} is UNKNOWN"
        return None

    def matches(self, b: AclBinding) -> bool:
        return (
            self.resource_type in (ResourceType.ANY, b.resource_type)
            and self._matches_pattern(b)
            and self.principal in (None, b.principal)
            and self.host in (None, b.host)
            and self.operation in (AclOperation.ANY, b.operation)
            and self.permission in (AclPermission.ANY, b.permission)
        )

    def _matches_pattern(self, b: AclBinding) -> bool:
        name, kind = self.resource_name, self.pattern_type
        if kind is PatternType.MATCH:
            return name is None or pattern_applies(b.pattern_type, b.resource_name, name)
        if kind not in (PatternType.ANY, b.pattern_type):
            return False
        return name is None or name == b.resource_name


def pattern_applies(pattern_type: PatternType, pattern: str, name: str) -> bool:
    """Whether an ACL with this pattern covers the resource `name`."""
    if pattern_type is PatternType.LITERAL:
        return pattern in (name, WILDCARD)
    return pattern_type is PatternType.PREFIXED and name.startswith(pattern)


class AclFields(Protocol):
    """An ACL as the messages and records spell it (Kafka's codes)."""

    @property
    def resource_type(self) -> int: ...
    @property
    def resource_name(self) -> str: ...
    @property
    def pattern_type(self) -> int: ...
    @property
    def principal(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def operation(self) -> int: ...
    @property
    def permission_type(self) -> int: ...


def binding_of(c: AclFields) -> AclBinding:
    """A CreateAcls entry, a DeleteAcls match or a record as a binding. Raises
    ValueError for a code Kafka does not define (what a client sent is checked further
    by `binding_problem`)."""
    kind, pattern, operation, permission = _codes(c)
    return AclBinding(kind, c.resource_name, pattern, c.principal, c.host, operation, permission)


def filter_of(spec: AclFilterSpec) -> AclFilter:
    """A DescribeAcls / DeleteAcls filter. Raises ValueError for an unknown code."""
    kind, pattern, operation, permission = _codes(spec)
    return AclFilter(
        kind, spec.resource_name, pattern, spec.principal, spec.host, operation, permission
    )


def _codes(
    c: AclFields | AclFilterSpec,
) -> tuple[ResourceType, PatternType, AclOperation, AclPermission]:
    try:
        return (
            ResourceType(c.resource_type),
            PatternType(c.pattern_type),
            AclOperation(c.operation),
            AclPermission(c.permission_type),
        )
    except ValueError as exc:
        raise ValueError(f"unknown code in the ACL: {exc}") from None


class NotAuthorizedError(Exception):
    """A whole request refused: the server answers it with `code` (runtime/server.py)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class AuthorizerSettings:
    enabled: bool = False
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False


# Decisions remembered between ACL changes, at most this many (then forgotten at once).
MAX_CACHED_DECISIONS = 65_536


class AclAuthorizer:
    """Decides requests against the ACLs of a metadata image (`acls`: id -> binding,
    replayed by runtime/metadata_image.py). `generation` must change whenever `acls`
    does: the index and remembered decisions are rebuilt from them lazily."""

    def __init__(self, settings: AuthorizerSettings) -> None:
        self.settings = settings
        self._built_for: tuple[int, int] = (0, -1)  # (id of the ACL map, its generation)
        # resource type -> literal name -> bindings; and the prefixed ones in a list.
        self._literal: dict[ResourceType, dict[str, list[AclBinding]]] = {}
        self._prefixed: dict[ResourceType, list[AclBinding]] = {}
        self._decisions: dict[tuple[str, str, AclOperation, ResourceType, str], bool] = {}

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def authorize(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        acls: Mapping[str, AclBinding],
        generation: int,
    ) -> bool:
        if not self.settings.enabled or principal in self.settings.super_users:
            return True
        invariant(
            operation not in (AclOperation.ANY, AclOperation.ALL, AclOperation.UNKNOWN),
            lambda: f"a request is checked for one operation, not {operation.name}",
        )
        if (id(acls), generation) != self._built_for:
            self._rebuild(acls, generation)
        key = (principal, host, operation, resource_type, name)
        decision = self._decisions.get(key)
        if decision is None:
            if len(self._decisions) >= MAX_CACHED_DECISIONS:
                self._decisions.clear()
            decision = self._decisions[key] = self._decide(*key)
        return decision

    def _rebuild(self, acls: Mapping[str, AclBinding], generation: int) -> None:
        self._literal, self._prefixed, self._decisions = {}, {}, {}
        for binding in acls.values():
            if binding.pattern_type is PatternType.LITERAL:
                by_name = self._literal.setdefault(binding.resource_type, {})
                by_name.setdefault(binding.resource_name, []).append(binding)
            else:
                self._prefixed.setdefault(binding.resource_type, []).append(binding)
        self._built_for = (id(acls), generation)

    def _decide(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        by_name = self._literal.get(resource_type, {})
        on_resource = [
            *by_name.get(name, ()),
            *(by_name.get(WILDCARD, ()) if name != WILDCARD else ()),
            *(b for b in self._prefixed.get(resource_type, ()) if name.startswith(b.resource_name)),
        ]
        if not on_resource:
            return self.settings.allow_everyone_if_no_acl_found
        kind = principal.partition(":")[0]
        principals = (principal, f"{kind}:{WILDCARD}")
        allowing = IMPLIED_BY.get(operation, frozenset()) | {operation, AclOperation.ALL}
        allowed = False
        for b in on_resource:
            if b.principal not in principals or b.host not in (host, WILDCARD):
                continue
            if b.permission is AclPermission.DENY:
                if b.operation in (operation, AclOperation.ALL):
                    return False  # DENY wins
            elif b.operation in allowing:
                allowed = True
        return allowed
