"""`minibroker user create|delete|list`: users' SCRAM credentials, as
`kafka-configs --alter --add-config 'SCRAM-SHA-256=[password=...]' --entity-type users`
sets them (client/user_admin.py). The password is read from a prompt or stdin, never
from the command line (where `ps` and shell history would show it)."""

from __future__ import annotations

import sys

import click

from client.cli.plumbing import _table
from client.cli.plumbing import cli_admin
from client.cli.plumbing import client_command
from client.cli.plumbing import run
from client.cli.root import cli
from runtime.scram import BY_NAME
from runtime.scram import DEFAULT_ITERATIONS
from runtime.scram import MAX_ITERATIONS
from runtime.scram import MIN_ITERATIONS

MECHANISM_CHOICE = click.Choice(list(BY_NAME), case_sensitive=False)


@cli.group("user")
def user_cmd() -> None:
    """Create, delete and list users (SCRAM credentials in the metadata log)."""


@user_cmd.command("create")
@click.argument("name")
@click.option(
    "--mechanism",
    type=MECHANISM_CHOICE,
    default="SCRAM-SHA-256",
    show_default=True,
    help="The SCRAM mechanism the credential is for (run twice for both).",
)
@click.option(
    "--iterations",
    type=click.IntRange(MIN_ITERATIONS, MAX_ITERATIONS),
    default=DEFAULT_ITERATIONS,
    show_default=True,
    help="PBKDF2 iterations.",
)
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from the first line of stdin instead of a prompt.",
)
@client_command
def user_create(
    name: str, mechanism: str, iterations: int, password_stdin: bool, bootstrap: str
) -> None:
    """Create user NAME, or set its password for --mechanism. Only a salt and what
    checks a proof are stored, never the password."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.UsageError("the password is empty")

    async def go() -> None:
        async with cli_admin(bootstrap) as admin:
            await admin.create_user(name, password, mechanism=mechanism, iterations=iterations)

    run(go)
    click.echo(f"user {name}: {mechanism.upper()} credential set ({iterations} iterations)")


@user_cmd.command("delete")
@click.argument("name")
@click.option(
    "--mechanism",
    type=MECHANISM_CHOICE,
    default=None,
    help="Remove only this mechanism's credential.  [default: every one]",
)
@client_command
def user_delete(name: str, mechanism: str | None, bootstrap: str) -> None:
    """Remove user NAME's credentials."""

    async def go() -> None:
        async with cli_admin(bootstrap) as admin:
            await admin.delete_user(name, mechanism=mechanism)

    run(go)
    click.echo(f"user {name}: {mechanism.upper() if mechanism else 'every'} credential removed")


@user_cmd.command("list")
@client_command
def user_list(bootstrap: str) -> None:
    """Every user and its mechanisms (never a key or a salt)."""

    async def go() -> list[list[str]]:
        async with cli_admin(bootstrap) as admin:
            users = await admin.describe_users()
        return [
            [name, c.mechanism, str(c.iterations)] for name, creds in users.items() for c in creds
        ]

    rows = run(go)
    if rows:
        click.echo(_table(["USER", "MECHANISM", "ITERATIONS"], rows))
    else:
        click.echo("no users", err=True)
