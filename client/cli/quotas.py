"""`minibroker quota set|remove|list`: client quotas (client/quota_admin.py), as
`kafka-configs --alter --add-config producer_byte_rate=1048576 --entity-type users
--entity-name alice [--entity-type clients --entity-name app]` sets them. The entity
is --user and/or --client-id, a name or `<default>` (or --user-default /
--client-id-default): the default entity of the type."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from client.cli.plumbing import _table
from client.cli.plumbing import cli_admin
from client.cli.plumbing import client_command
from client.cli.plumbing import run
from client.cli.root import cli
from client.quota_admin import DEFAULT
from client.quota_admin import Name
from runtime.client_quotas import DEFAULT_NAME
from runtime.client_quotas import QUOTA_KEYS
from runtime.client_quotas import describe_entity
from runtime.client_quotas import value_problem

KEYS_HELP = "; ".join(f"{key}: {what}" for key, (_, what) in QUOTA_KEYS.items())


def entity_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The --user / --client-id options, handed to `command` as one `entity`
    argument: (user, client id), each a name, DEFAULT or None."""

    @functools.wraps(command)
    def with_entity(
        *args: Any,
        user: str | None,
        user_default: bool,
        client_id: str | None,
        client_id_default: bool,
        **kwargs: Any,
    ) -> Any:
        entity = entity_names(user, user_default, client_id, client_id_default)
        return command(*args, entity=entity, **kwargs)

    wrapped: Callable[..., Any] = with_entity
    for option in reversed(
        [
            click.option("--user", default=None, help=f"A user's name, or {DEFAULT_NAME}."),
            click.option("--user-default", is_flag=True, help="The default user."),
            click.option("--client-id", default=None, help=f"A client id, or {DEFAULT_NAME}."),
            click.option("--client-id-default", is_flag=True, help="The default client id."),
        ]
    ):
        wrapped = option(wrapped)
    return wrapped


def entity_names(
    user: str | None, user_default: bool, client_id: str | None, client_id_default: bool
) -> tuple[Name, Name]:
    def one(flag: str, name: str | None, default: bool) -> Name:
        if name is not None and default:
            raise click.UsageError(f"--{flag} and --{flag}-default: give one")
        if default or name == DEFAULT_NAME:
            return DEFAULT
        return name

    return one("user", user, user_default), one("client-id", client_id, client_id_default)


def parse_assignment(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    if not sep:
        raise click.UsageError(f"{text!r}: expected KEY=VALUE, e.g. producer_byte_rate=1048576")
    try:
        number = float(value)
    except ValueError:
        raise click.UsageError(f"{key}: {value!r} is not a number") from None
    problem = value_problem(key, number)
    if problem is not None:
        raise click.UsageError(problem)
    return key, number


@cli.group("quota")
def quota_cmd() -> None:
    """Set, remove and list client quotas (users and client ids; in the metadata log)."""


@quota_cmd.command("set")
@click.argument("assignments", nargs=-1, required=True, metavar="KEY=VALUE...")
@entity_options
@client_command
def quota_set(assignments: tuple[str, ...], entity: tuple[Name, Name], bootstrap: str) -> None:
    """Set quotas of one entity (a user, a client id, or both). Keys:"""
    values = dict(parse_assignment(a) for a in assignments)
    user_name, client_name = entity

    async def go() -> None:
        async with cli_admin(bootstrap) as admin:
            await admin.alter_client_quotas(
                user=user_name, client_id=client_name, set_values=values
            )

    who = _entity_text(user_name, client_name)
    run(go)
    click.echo(f"{who}: " + ", ".join(f"{k}={_value(v)}" for k, v in values.items()))


quota_set.help = (quota_set.help or "") + " Keys: " + KEYS_HELP + "."


@quota_cmd.command("remove")
@click.argument("keys", nargs=-1, required=True, metavar="KEY...")
@entity_options
@client_command
def quota_remove(keys: tuple[str, ...], entity: tuple[Name, Name], bootstrap: str) -> None:
    """Remove quotas of one entity."""
    user_name, client_name = entity

    async def go() -> None:
        async with cli_admin(bootstrap) as admin:
            await admin.alter_client_quotas(user=user_name, client_id=client_name, remove=keys)

    who = _entity_text(user_name, client_name)
    run(go)
    click.echo(f"{who}: {', '.join(keys)} removed")


@quota_cmd.command("list")
@entity_options
@client_command
def quota_list(entity: tuple[Name, Name], bootstrap: str) -> None:
    """Every entity with quotas (only those matching --user / --client-id if given)."""
    user_name, client_name = entity

    async def go() -> list[list[str]]:
        async with cli_admin(bootstrap) as admin:
            entries = await admin.describe_client_quotas(user=user_name, client_id=client_name)
        rows = []
        for entry in entries:
            names = dict(entry.entity)
            for key, value in sorted(entry.values.items()):
                rows.append([_name(names, "user"), _name(names, "client-id"), key, _value(value)])
        return rows

    rows = run(go)
    if rows:
        click.echo(_table(["USER", "CLIENT-ID", "KEY", "VALUE"], rows))
    else:
        click.echo("no quotas", err=True)


def _value(value: float) -> str:
    return f"{value:.0f}" if value.is_integer() else f"{value:g}"


def _name(names: dict[str, str | None], entity_type: str) -> str:
    if entity_type not in names:
        return "-"  # the entity has no part of this type
    name = names[entity_type]
    return DEFAULT_NAME if name is None else name


def _entity_text(user: Name, client_id: Name) -> str:
    if user is None and client_id is None:
        raise click.UsageError("give --user and/or --client-id (a name or <default>)")
    parts = [
        (t, None if n is DEFAULT else n)
        for t, n in (("user", user), ("client-id", client_id))
        if n is not None
    ]
    return describe_entity(tuple(parts))  # type: ignore[arg-type]
