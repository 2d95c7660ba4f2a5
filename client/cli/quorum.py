"""`minibroker metadata-quorum describe`: the controller quorum, as
`kafka-metadata-quorum describe --status / --replication` shows it."""

from __future__ import annotations

import click

from client.admin import DEFAULT_CONTROLLER_PORT
from client.cli.plumbing import _controller_addresses
from client.cli.plumbing import _debug_option
from client.cli.plumbing import _table
from client.cli.plumbing import controller_security
from client.cli.plumbing import run
from client.cli.root import cli
from client.quorum_admin import QuorumDescription
from client.quorum_admin import describe_quorum

CONTROLLER_ENV = "MINIBROKER_CONTROLLER"


@cli.group("metadata-quorum")
def metadata_quorum_cmd() -> None:
    """The controller quorum (`--quorum-voters`): its active controller and voters."""


@metadata_quorum_cmd.command("describe")
@click.option(
    "--controller",
    "controllers",
    default="127.0.0.1:9093",
    show_default=True,
    envvar=CONTROLLER_ENV,
    callback=_controller_addresses,
    metavar="HOST:PORT[,HOST:PORT...]",
    help=f"Any controllers of the quorum (port {DEFAULT_CONTROLLER_PORT} if left out); the "
    f"active one is found from them.  [env {CONTROLLER_ENV}]",
)
@click.option(
    "--status",
    "what",
    flag_value="status",
    default=True,
    help="Leader, epoch, high watermark, lag (the default).",
)
@click.option(
    "--replication",
    "what",
    flag_value="replication",
    help="Each voter's log end offset, lag and last fetch.",
)
@_debug_option
def describe_cmd(controllers: list[tuple[str, int]], what: str) -> None:
    """Describe the controller quorum (like kafka-metadata-quorum describe)."""
    quorum = run(describe_quorum, controllers, controller_security())
    click.echo(_status(quorum) if what == "status" else _replication(quorum))


def _status(q: QuorumDescription) -> str:
    voters = ",".join(str(v.node_id) for v in q.voters)
    rows = [
        ("LeaderId", q.leader_id),
        ("LeaderEpoch", q.leader_epoch),
        ("HighWatermark", q.high_watermark),
        ("MaxFollowerLag", q.max_follower_lag),
        ("CurrentVoters", f"[{voters}]"),
    ]
    return "\n".join(f"{name + ':':<16}{value}" for name, value in rows)


def _replication(q: QuorumDescription) -> str:
    rows = [
        [
            str(v.node_id),
            f"{v.host}:{v.port}",
            str(v.log_end_offset) if v.log_end_offset >= 0 else "-",
            str(v.lag) if v.lag >= 0 else "-",
            f"{v.last_fetch_ms_ago} ms ago" if v.last_fetch_ms_ago >= 0 else "-",
            v.role.capitalize(),
        ]
        for v in q.voters
    ]
    header = ["NodeId", "Address", "LogEndOffset", "Lag", "LastFetch", "Status"]
    return _table(header, rows)
