"""`minibroker acl add|list|remove`: ACLs, as `kafka-acls --add / --list / --remove`
manages them (client/acl_admin.py; the model is runtime/acl.py's). Operation and
pattern names are Kafka's, in any case: Read, Write, Describe, ClusterAction,
Literal, Prefixed..."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from client.cli.plumbing import _table
from client.cli.plumbing import cli_admin
from client.cli.plumbing import client_command
from client.cli.plumbing import run
from client.cli.root import cli
from runtime.acl import CLUSTER_NAME
from runtime.acl import OPERATIONS_OF
from runtime.acl import WILDCARD
from runtime.acl import AclBinding
from runtime.acl import AclFilter
from runtime.acl import AclOperation
from runtime.acl import AclPermission
from runtime.acl import PatternType
from runtime.acl import ResourceType
from runtime.acl import binding_problem
from runtime.acl import display_name
from runtime.acl import parse_enum

GRANTABLE = sorted({op for ops in OPERATIONS_OF.values() for op in ops}, key=lambda op: int(op))


def _operation(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> Any:
    try:
        return [parse_enum(AclOperation, v, allowed=GRANTABLE) for v in values]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _pattern(allowed: list[PatternType]) -> Callable[..., PatternType]:
    def parse(_ctx: click.Context, _param: click.Parameter, value: str) -> PatternType:
        try:
            return parse_enum(PatternType, value, allowed=allowed)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    return parse


def resource_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option("--topic", "topics", multiple=True, help="A topic (repeatable)."),
            click.option("--group", "groups", multiple=True, help="A group (repeatable)."),
            click.option("--cluster", is_flag=True, help="The cluster resource."),
        ]
    ):
        fn = option(fn)
    return fn


def _resources(
    topics: tuple[str, ...], groups: tuple[str, ...], cluster: bool
) -> list[tuple[ResourceType, str]]:
    return [
        *((ResourceType.TOPIC, t) for t in topics),
        *((ResourceType.GROUP, g) for g in groups),
        *([(ResourceType.CLUSTER, CLUSTER_NAME)] if cluster else []),
    ]


def _rows(bindings: list[AclBinding]) -> list[list[str]]:
    return [
        [
            display_name(b.resource_type),
            b.resource_name,
            display_name(b.pattern_type),
            b.principal,
            b.host,
            display_name(b.operation),
            display_name(b.permission),
        ]
        for b in bindings
    ]


HEADER = ["RESOURCE", "NAME", "PATTERN", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION"]


@cli.group("acl")
def acl_cmd() -> None:
    """Add, list and remove ACLs (the servers check them with --authorizer-enabled)."""


@acl_cmd.command("add")
@click.option("--allow-principal", multiple=True, help="User:NAME allowed (repeatable).")
@click.option("--deny-principal", multiple=True, help="User:NAME denied (repeatable).")
@click.option(
    "--operation",
    "operations",
    multiple=True,
    required=True,
    callback=_operation,
    help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
    "AlterConfigs, IdempotentWrite or All (repeatable).",
)
@resource_options
@click.option(
    "--resource-pattern-type",
    "pattern",
    default="literal",
    show_default=True,
    callback=_pattern([PatternType.LITERAL, PatternType.PREFIXED]),
    help="literal: the name (or * for all); prefixed: every name starting with it.",
)
@click.option("--host", default=WILDCARD, show_default=True, help="The client's IP address.")
@client_command
def acl_add(
    allow_principal: tuple[str, ...],
    deny_principal: tuple[str, ...],
    operations: list[AclOperation],
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    cluster: bool,
    pattern: PatternType,
    host: str,
    bootstrap: str,
) -> None:
    """Allow or deny principals operations on resources (every combination)."""
    resources = _resources(topics, groups, cluster)
    if not resources:
        raise click.UsageError("name a resource: --topic, --group or --cluster")
    principals = [(p, AclPermission.ALLOW) for p in allow_principal] + [
        (p, AclPermission.DENY) for p in deny_principal
    ]
    if not principals:
        raise click.UsageError("name a principal: --allow-principal or --deny-principal")
    bindings = [
        AclBinding(kind, name, pattern, principal, host, op, permission)
        for kind, name in resources
        for principal, permission in principals
        for op in operations
    ]

    for binding in bindings:  # before connecting: bad input needs no cluster
        problem = binding_problem(binding)
        if problem is not None:
            raise click.UsageError(f"ACL refused: {problem}")

    async def go() -> None:
        async with cli_admin(bootstrap) as admin:
            await admin.create_acls(bindings)

    run(go)
    click.echo(_table(HEADER, _rows(bindings)))
    click.echo(f"{len(bindings)} ACL(s) in place", err=True)


def _filters(
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    cluster: bool,
    pattern: PatternType,
    principal: str | None,
    operation: list[AclOperation],
) -> list[AclFilter]:
    resources: list[tuple[ResourceType, str | None]] = list(
        _resources(topics, groups, cluster)
    ) or [(ResourceType.ANY, None)]
    ops = operation or [AclOperation.ANY]
    return [
        AclFilter(kind, name, pattern, principal, None, op)
        for kind, name in resources
        for op in ops
    ]


FILTER_PATTERNS = [PatternType.ANY, PatternType.MATCH, PatternType.LITERAL, PatternType.PREFIXED]


def filter_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option(
                "--resource-pattern-type",
                "pattern",
                default="any",
                show_default=True,
                callback=_pattern(FILTER_PATTERNS),
                help="any: exactly the names given; match: every ACL that applies to them; "
                "literal / prefixed: only that kind.",
            ),
            click.option("--principal", default=None, help="Only this principal's ACLs."),
            click.option(
                "--operation",
                "operation",
                multiple=True,
                callback=_operation,
                help="Only this operation's ACLs (repeatable).",
            ),
        ]
    ):
        fn = option(fn)
    return resource_options(fn)


@acl_cmd.command("list")
@filter_options
@client_command
def acl_list(
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    cluster: bool,
    pattern: PatternType,
    principal: str | None,
    operation: list[AclOperation],
    bootstrap: str,
) -> None:
    """The ACLs (all, or those of the resources and principal named)."""
    filters = _filters(topics, groups, cluster, pattern, principal, operation)

    async def go() -> list[AclBinding]:
        async with cli_admin(bootstrap) as admin:
            found: set[AclBinding] = set()
            for f in filters:
                found.update(await admin.describe_acls(f))
            return sorted(found)

    bindings = run(go)
    if bindings:
        click.echo(_table(HEADER, _rows(bindings)))
    else:
        click.echo("no ACLs", err=True)


@acl_cmd.command("remove")
@filter_options
@click.option("--all", "everything", is_flag=True, help="Remove every ACL of the cluster.")
@client_command
def acl_remove(
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    cluster: bool,
    pattern: PatternType,
    principal: str | None,
    operation: list[AclOperation],
    everything: bool,
    bootstrap: str,
) -> None:
    """Remove the ACLs the options select (like `acl list` with the same options)."""
    if not (topics or groups or cluster or principal or operation or everything):
        raise click.UsageError(
            "this would remove every ACL: name a resource, --principal or --operation, or say --all"
        )
    filters = _filters(topics, groups, cluster, pattern, principal, operation)

    async def go() -> list[AclBinding]:
        async with cli_admin(bootstrap) as admin:
            return await admin.delete_acls(filters)

    removed = run(go)
    if removed:
        click.echo(_table(HEADER, _rows(removed)))
    click.echo(f"{len(removed)} ACL(s) removed", err=True)
