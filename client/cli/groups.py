"""`minibroker group list|describe|reset-offsets|delete`: consumer groups for operators,
as kafka-consumer-groups shows and changes them (client/group_admin.py)."""

from __future__ import annotations

import datetime

import click

from client.admin import GroupDescription
from client.admin import PartitionLag
from client.cli.plumbing import _fail
from client.cli.plumbing import _plural
from client.cli.plumbing import _table
from client.cli.plumbing import cli_admin
from client.cli.plumbing import client_command
from client.cli.plumbing import run
from client.cli.root import cli
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from protocol.api import EARLIEST_TIMESTAMP
from protocol.api import LATEST_TIMESTAMP
from protocol.api import NO_EPOCH

CLI_ID = "minibroker-cli"


@cli.group("group")
def group_cmd() -> None:
    """List, describe, reset and delete consumer groups."""


@group_cmd.command("list")
@client_command
def group_list(bootstrap: str) -> None:
    """Every group, with its state and coordinator."""

    async def go() -> list[list[str]]:
        async with cli_admin(bootstrap, CLI_ID) as admin:
            groups = await admin.list_groups()
        return [[g.group_id, g.state, g.protocol_type or "-", str(g.coordinator)] for g in groups]

    rows = run(go)
    if rows:
        click.echo(_table(["GROUP", "STATE", "PROTOCOL-TYPE", "COORDINATOR"], rows))
    else:
        click.echo("no groups", err=True)


@group_cmd.command("describe")
@click.argument("group")
@client_command
def group_describe(group: str, bootstrap: str) -> None:
    """A group's state, generation and members, and per partition its committed
    offset, the leader epoch committed with it, the log end (high watermark), the lag
    and the member it is assigned to."""

    async def go() -> tuple[GroupDescription, list[PartitionLag]]:
        async with cli_admin(bootstrap, CLI_ID) as admin:
            return await admin.describe_group(group), await admin.group_lag(group)

    description, lags = run(go)
    click.echo(
        f"group {description.group_id}  (state {description.state}, generation "
        f"{description.generation}, assignor {description.protocol or '-'}, coordinator "
        f"{description.coordinator}, {_plural(len(description.members), 'member')})"
    )
    if description.members:
        rows = [
            [
                m.member_id,
                m.client_id,
                m.host,
                ",".join(f"{tp.topic}-{tp.partition}" for tp in sorted(m.assignment)) or "-",
            ]
            for m in description.members
        ]
        click.echo(_table(["MEMBER", "CLIENT-ID", "HOST", "PARTITIONS"], rows))
    if lags:
        rows = [
            [
                lag.partition.topic,
                str(lag.partition.partition),
                str(lag.committed.offset) if lag.committed else "-",
                str(lag.committed.leader_epoch) if lag.committed else "-",
                str(lag.log_end_offset) if lag.log_end_offset >= 0 else "-",
                str(lag.lag) if lag.lag is not None else "-",
                lag.owner or "-",
            ]
            for lag in lags
        ]
        header = ["TOPIC", "PARTITION", "COMMITTED", "EPOCH", "LOG-END", "LAG", "MEMBER"]
        click.echo(_table(header, rows))


def _partitions(specs: tuple[str, ...]) -> dict[str, list[int] | None]:
    """--topic T (every partition) or T:0,2 (those)."""
    out: dict[str, list[int] | None] = {}
    for spec in specs:
        name, _, parts = spec.partition(":")
        if not name:
            _fail(f"--topic {spec!r}: give TOPIC or TOPIC:PARTITION[,PARTITION...]")
        try:
            out[name] = [int(p) for p in parts.split(",")] if parts else None
        except ValueError:
            _fail(f"--topic {spec!r}: partitions are numbers, e.g. {name}:0,2")
    return out


def _timestamp(text: str) -> int:
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        _fail(f"--to-datetime {text!r} is not an ISO date-time, e.g. 2026-11-25T08:00:00")
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


@group_cmd.command("reset-offsets")
@click.argument("group")
@click.option(
    "-t",
    "--topic",
    "topics",
    multiple=True,
    required=True,
    metavar="TOPIC[:P,...]",
    help="A topic (every partition) or some of its partitions; repeatable.",
)
@click.option("--to-earliest", "to", flag_value="earliest", help="The log start offset.")
@click.option("--to-latest", "to", flag_value="latest", help="The log end (nothing left to read).")
@click.option("--to-offset", type=int, default=None, help="This offset on every partition.")
@click.option(
    "--to-datetime",
    default=None,
    metavar="ISO",
    help="The first offset at or after this time (UTC unless it says), else the log end.",
)
@click.option(
    "--execute",
    is_flag=True,
    help="Commit the new offsets. Without it, only show them (a dry run, as "
    "kafka-consumer-groups does).",
)
@client_command
def group_reset_offsets(
    group: str,
    topics: tuple[str, ...],
    to: str | None,
    to_offset: int | None,
    to_datetime: str | None,
    execute: bool,
    bootstrap: str,
) -> None:
    """Move GROUP's committed offsets (the group must have no members: stop its
    consumers first). Exactly one of --to-earliest, --to-latest, --to-offset,
    --to-datetime. Offsets found by ListOffsets keep the leader epoch it gives them,
    so the consumers' truncation check stays armed."""
    chosen = [x for x in (to, to_offset, to_datetime) if x is not None]
    if len(chosen) != 1:
        _fail("give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime")
    wanted = _partitions(topics)

    async def go() -> list[tuple[TopicPartition, OffsetAndMetadata | None, OffsetAndMetadata]]:
        async with cli_admin(bootstrap, CLI_ID) as admin:
            described = await admin.describe_topics(sorted(wanted), include_offsets=False)
            partitions = [
                TopicPartition(t.name, p.partition)
                for t in described
                for p in t.partitions
                if wanted[t.name] is None or p.partition in (wanted[t.name] or ())
            ]
            if not partitions:
                _fail(f"no such partitions: {', '.join(topics)}")
            current = await admin.list_group_offsets(group)
            if to_offset is not None:
                new = {tp: OffsetAndMetadata(to_offset, "", NO_EPOCH) for tp in partitions}
            else:
                if to_datetime is not None:
                    spec = _timestamp(to_datetime)
                else:
                    spec = EARLIEST_TIMESTAMP if to == "earliest" else LATEST_TIMESTAMP
                found = await admin.list_offsets(dict.fromkeys(partitions, spec))
                ends = (
                    await admin.list_offsets(dict.fromkeys(partitions, "latest"))
                    if to_datetime is not None
                    else found
                )
                new = {
                    tp: OffsetAndMetadata(o.offset, "", o.leader_epoch)
                    if o.offset >= 0
                    else OffsetAndMetadata(ends[tp].offset, "", ends[tp].leader_epoch)
                    for tp, o in found.items()
                }
            if execute:
                await admin.alter_group_offsets(group, new)
            return [(tp, current.get(tp), new[tp]) for tp in sorted(partitions)]

    plan = run(go)
    rows = [
        [
            tp.topic,
            str(tp.partition),
            str(old.offset) if old else "-",
            str(new.offset),
            str(new.leader_epoch),
        ]
        for tp, old, new in plan
    ]
    click.echo(_table(["TOPIC", "PARTITION", "CURRENT", "NEW", "NEW-EPOCH"], rows))
    if execute:
        click.echo(f"reset {_plural(len(plan), 'partition')} of group {group}")
    else:
        click.echo("dry run: nothing changed; add --execute to commit these offsets", err=True)


@group_cmd.command("delete")
@click.argument("groups", nargs=-1, required=True)
@client_command
def group_delete(groups: tuple[str, ...], bootstrap: str) -> None:
    """Delete empty groups with their committed offsets."""

    async def go() -> None:
        async with cli_admin(bootstrap, CLI_ID) as admin:
            await admin.delete_groups(groups)

    run(go)
    for group in groups:
        click.echo(f"deleted group {group}")
