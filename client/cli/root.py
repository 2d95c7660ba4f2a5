"""The `minibroker` group, the server commands (`controller`, `broker`: the module run
as a subprocess, never imported) and `dev`, and `main`."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from typing import NoReturn

import click
import uvloop

from client import dev_control
from client.cli.plumbing import BOOTSTRAP_ENV
from client.cli.plumbing import DEFAULT_BOOTSTRAP
from client.cli.plumbing import LOG_FORMAT
from client.cli.plumbing import _fail
from client.cli.plumbing import number_option
from client.dev_cluster import DevCluster
from client.dev_cluster import DevClusterError
from runtime.sasl import SASL_MECHANISMS
from runtime.tls import LISTENER_PROTOCOLS

# ------------------------------------------------------------------ the group


def _client_tls_file(flag: str, what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    env = "MINIBROKER_CLIENT_" + flag.lstrip("-").replace("-", "_").upper()
    return click.option(
        flag, type=click.Path(dir_okay=False), envvar=env, help=f"With SSL: {what}.  [env {env}]"
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--debug",
    is_flag=True,
    envvar="MINIBROKER_DEBUG",
    help="Show tracebacks and the client's debug log.",
)
@click.option(
    "-b",
    "--bootstrap-server",
    "bootstrap",
    default=None,
    help="Brokers for every client command, HOST:PORT[,HOST:PORT...]  "
    f"[default: env {BOOTSTRAP_ENV}, else {DEFAULT_BOOTSTRAP}]",
)
@click.option(
    "--security-protocol",
    type=click.Choice(LISTENER_PROTOCOLS, case_sensitive=False),
    default="PLAINTEXT",
    show_default=True,
    envvar="MINIBROKER_CLIENT_SECURITY_PROTOCOL",
    help="As the brokers' listener: SSL connects with TLS, SASL_PLAINTEXT / SASL_SSL "
    "authenticate as --sasl-username (the password from env "
    "MINIBROKER_CLIENT_SASL_PASSWORD, else asked).  [env MINIBROKER_CLIENT_SECURITY_PROTOCOL]",
)
@click.option(
    "--sasl-mechanism",
    type=click.Choice(SASL_MECHANISMS, case_sensitive=False),
    default="SCRAM-SHA-256",
    show_default=True,
    envvar="MINIBROKER_CLIENT_SASL_MECHANISM",
    help="With SASL_*: the mechanism.  [env MINIBROKER_CLIENT_SASL_MECHANISM]",
)
@click.option(
    "--sasl-username",
    envvar="MINIBROKER_CLIENT_SASL_USERNAME",
    help="With SASL_*: the user.  [env MINIBROKER_CLIENT_SASL_USERNAME]",
)
@_client_tls_file("--ssl-cafile", "the CAs to trust, PEM (the system's without it)")
@_client_tls_file("--ssl-certfile", "a client certificate, PEM, for brokers that ask for one")
@_client_tls_file("--ssl-keyfile", "the key of --ssl-certfile, PEM")
@click.version_option(package_name="minibroker", message="%(prog)s %(version)s")
@click.pass_context
def cli(
    ctx: click.Context,
    debug: bool,
    bootstrap: str | None,
    security_protocol: str,
    sasl_mechanism: str,
    sasl_username: str | None,
    ssl_cafile: str | None,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
) -> None:
    """minibroker: a replicated, Kafka-style log broker with leader epochs.

    Start a local cluster with `minibroker dev`, then in another terminal:

    \b
      minibroker topic create t --partitions 3
      seq 1 10 | minibroker produce t
      minibroker consume t --from-beginning -n 10
    """
    obj = ctx.ensure_object(dict)
    obj["debug"] = obj.get("debug", False) or debug
    obj["bootstrap"] = bootstrap
    obj.update(
        security_protocol=security_protocol.upper(),
        sasl_mechanism=sasl_mechanism.upper(),
        sasl_username=sasl_username,
        ssl_cafile=ssl_cafile,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )
    logging.basicConfig(
        level=logging.DEBUG if obj["debug"] else logging.WARNING,
        format=LOG_FORMAT,
        stream=sys.stderr,
    )


# ------------------------------------------------------------------ servers


def _exec_module(module: str, args: tuple[str, ...]) -> NoReturn:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the directory holding client/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    # exec: signals and the exit code are the server's own.
    os.execve(sys.executable, [sys.executable, "-m", module, *args], env)


_PASSTHROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


@cli.command(context_settings=_PASSTHROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def controller(args: tuple[str, ...]) -> None:
    """Run the controller: `python -m controller ARGS` (try `minibroker controller --help`)."""
    _exec_module("controller", args)


@cli.command(context_settings=_PASSTHROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def broker(args: tuple[str, ...]) -> None:
    """Run a broker: `python -m broker ARGS` (try `minibroker broker --help`)."""
    _exec_module("broker", args)


_DEV_DATA_DIR = Path("minibroker-data")


@cli.group(invoke_without_command=True)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=_DEV_DATA_DIR,
    show_default=True,
    help="Where the controller (controller/), the brokers (broker-N/) and the logs "
    "(logs/) live. Reused across runs.",
)
@number_option(
    "--brokers", at_least=1, at_most=32, default=3, help="Number of brokers (node ids 1..N)."
)
@number_option(
    "--controllers",
    at_least=1,
    at_most=5,
    default=1,
    help="Number of controllers: 1, or a quorum of 3 or 5 (node ids 0..N-1, on "
    "controller-port, +2, +4...; any one may die, the others elect a new active one).",
)
@number_option(
    "--base-port",
    at_least=1,
    at_most=65535,
    default=9092,
    help="Port of broker 1; broker N listens on base-port + 2*(N-1) (9092, 9094, 9096).",
)
@number_option(
    "--controller-port",
    at_least=1,
    at_most=65535,
    help="Controller port.  [default: base-port + 1, i.e. 9093]",
)
@number_option(
    "--kafka-base-port",
    at_least=1,
    at_most=65535,
    help="Port of broker 1's Kafka listener (Apache Kafka's protocol, for Kafka clients "
    "and tools); broker N's is kafka-base-port + 2*(N-1).  [default: base-port + 10000, "
    "i.e. 19092]",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--secure",
    is_flag=True,
    help="SASL_SSL (SCRAM) on every listener and between the servers, ACLs on: a throwaway "
    "CA, the servers' certificates and passwords in DATA_DIR/secure/ (reused), an admin "
    "user (password in DATA_DIR/secure/admin.password, mode 0600); prints the client "
    "settings.",
)
@number_option(
    "--startup-timeout",
    at_least=1,
    at_most=600,
    default=60.0,
    help="Seconds to wait for the controller and every broker to be up.",
)
@number_option(
    "--stop-timeout",
    at_least=1,
    at_most=600,
    default=20.0,
    help="Seconds to wait for each group (brokers, then controller) after SIGTERM "
    "before killing it.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="Log level of the servers (their logs go to DATA_DIR/logs/).",
)
@click.pass_context
def dev(ctx: click.Context, log_level: str, **options: Any) -> None:
    """Run a local cluster in the foreground: one controller (or a quorum of 3 or 5)
    and N brokers; or, with a subcommand, control one that runs.

    Prints the bootstrap address once every broker is up; Ctrl-C (or SIGTERM) stops
    the brokers, then the controller, and exits 0 when all stopped cleanly. A server
    that dies once the cluster is up is reported in one line and the others keep
    serving; from another shell, `minibroker dev status`, `dev kill N`, `dev stop N`
    and `dev restart N` (N: a broker's node id, or c0, c1... for a controller) act on
    the running cluster at --data-dir. If a server dies at startup or a port is busy
    it exits 1 and shows that server's last log lines.
    """
    if ctx.invoked_subcommand is not None:
        return
    # The options are DevCluster's parameters, by name.
    try:
        cluster = DevCluster(**options, log_level=log_level.upper())
    except DevClusterError as exc:
        _fail(str(exc))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        code = runner.run(cluster.run())
    sys.exit(code)


_control_data_dir = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=_DEV_DATA_DIR,
    show_default=True,
    help="The running dev cluster's --data-dir.",
)


def _dev_request(data_dir: Path, op: str, node: str | None = None) -> None:
    try:
        lines = dev_control.request(data_dir, op, node)
    except dev_control.DevControlError as exc:
        _fail(str(exc))
    for line in lines:
        click.echo(line)


@dev.command("status")
@_control_data_dir
def dev_status(data_dir: Path) -> None:
    """Each node of the running dev cluster: its name, role, address, state."""
    _dev_request(data_dir, "status")


def _dev_node_command(op: str, help_text: str) -> None:
    @dev.command(op, help=help_text)
    @click.argument("node")
    @_control_data_dir
    def command(node: str, data_dir: Path) -> None:
        _dev_request(data_dir, op, node)


_dev_node_command("kill", "SIGKILL node NODE (a broker's node id, or c0, c1... for a controller).")
_dev_node_command(
    "stop", "Stop node NODE cleanly (SIGTERM; SIGKILL after the dev cluster's --stop-timeout)."
)
_dev_node_command(
    "restart",
    "Start node NODE again (stopping it first if it runs), same data dir and ports; "
    "returns once it is back (a broker: registered).",
)


def _reserve_std_fds() -> None:
    # With stdin/stdout/stderr closed (`<&-`), sockets would get fds 0-2, which uvloop
    # refuses to close; park /dev/null there (open() takes the lowest free fd).
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)


def main() -> None:
    _reserve_std_fds()
    cli(prog_name="minibroker")
