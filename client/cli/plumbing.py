"""What every command shares: the bootstrap option and its environment variable, the
--debug switch, running a coroutine with errors mapped to one line and exit code 1,
and small text tables."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import NoReturn
from typing import TypeVar

import click
import uvloop

from client.admin import AsyncAdmin
from client.admin_diagnostics import DEFAULT_CONTROLLER_PORT
from client.admin_diagnostics import parse_addresses
from client.errors import MinibrokerError
from client.quorum_admin import ControllerSecurity
from client.security import connection_sasl
from client.security import connection_tls
from client.security import create_ssl_context
from runtime.tls import TlsConfigError
from runtime.tls import uses_sasl
from runtime.tls import uses_tls

SASL_PASSWORD_ENV = "MINIBROKER_CLIENT_SASL_PASSWORD"

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "MINIBROKER_BOOTSTRAP_SERVERS"
# How long produce/consume wait for a topic to show up (a new one takes milliseconds).
TOPIC_WAIT_MS = 10_000
LOG_FORMAT = "%(asctime)s %(levelname)s [client] %(name)s: %(message)s"


def number_option(
    *decls: str,
    at_least: float,
    at_most: float | None = None,
    default: float | None = None,
    help: str,
    **extra: Any,
) -> Callable[[F], F]:
    """A number option that click bounds to [at_least, at_most] (its error names the
    bound), a float one when any of the numbers is; a default is shown in --help."""
    floats = any(isinstance(n, float) for n in (at_least, at_most, default))
    kind = click.FloatRange if floats else click.IntRange
    return click.option(
        *decls,
        type=kind(at_least, at_most),
        default=default,
        show_default=default is not None,
        help=help,
        **extra,
    )


# ------------------------------------------------------------------ plumbing


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(dict)["debug"] = True
        logging.getLogger().setLevel(logging.DEBUG)


def _debug_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_debug,
        help="Show tracebacks and the client's debug log.",
    )(f)


def _resolve_bootstrap(
    ctx: click.Context, _param: click.Parameter | None, value: str | None
) -> str:
    # The command's own -b wins, then `minibroker -b ...`, then the env var, then the default.
    if value:
        return value
    root = ctx.find_root().obj or {}
    return root.get("bootstrap") or os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP


def _controller_addresses(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> list[tuple[str, int]] | None:
    """--controller HOST:PORT[,HOST:PORT...] (port 9093 if left out), checked before
    anything runs: a malformed address is a usage error naming the option."""
    if value is None:
        return None
    try:
        return parse_addresses(value, DEFAULT_CONTROLLER_PORT)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def connection_options() -> dict[str, Any]:
    """The client library's security options from `minibroker --security-protocol ...`
    (the root command's), for every client the command makes."""
    ctx = click.get_current_context(silent=True)
    root = (ctx.find_root().obj if ctx is not None else None) or {}
    protocol = (root.get("security_protocol") or "PLAINTEXT").upper()
    options: dict[str, Any] = {}
    if uses_tls(protocol):
        try:
            options["ssl_context"] = create_ssl_context(
                cafile=root.get("ssl_cafile"),
                certfile=root.get("ssl_certfile"),
                keyfile=root.get("ssl_keyfile"),
            )
        except TlsConfigError as exc:
            raise click.UsageError(str(exc)) from None
    if uses_sasl(protocol):
        user = root.get("sasl_username")
        if not user:
            raise click.UsageError(f"--security-protocol {protocol} needs --sasl-username")
        if "sasl_password" not in root:  # asked once per command, never from argv
            root["sasl_password"] = os.environ.get(SASL_PASSWORD_ENV) or click.prompt(
                f"password of {user}", hide_input=True, err=True
            )
        options.update(
            sasl_mechanism=root.get("sasl_mechanism"),
            sasl_plain_username=user,
            sasl_plain_password=root["sasl_password"],
        )
    if options or protocol != "PLAINTEXT":
        options["security_protocol"] = protocol
    return options


def controller_security() -> ControllerSecurity:
    """The command line's security options for connections to the controllers."""
    options = connection_options()
    protocol = options.get("security_protocol", "PLAINTEXT")
    return ControllerSecurity(
        connection_tls(protocol, options.get("ssl_context")),
        connection_sasl(
            protocol,
            options.get("sasl_mechanism"),
            options.get("sasl_plain_username"),
            options.get("sasl_plain_password"),
        ),
    )


def cli_admin(bootstrap: str | list[str], client_id: str = "minibroker-cli") -> AsyncAdmin:
    """An AsyncAdmin with the command line's security options."""
    return AsyncAdmin(bootstrap, client_id=client_id, **connection_options())


def client_command(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options every command that talks to a cluster has."""
    f = click.option(
        "-b",
        "--bootstrap-server",
        "bootstrap",
        default=None,
        callback=_resolve_bootstrap,
        help="Brokers to bootstrap from, HOST:PORT[,HOST:PORT...] (`minibroker dev` "
        f"prints this list).  [default: `minibroker -b`, else env {BOOTSTRAP_ENV}, "
        f"else {DEFAULT_BOOTSTRAP}]",
    )(f)
    return _debug_option(f)


def _is_debug() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def run(fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Run a coroutine on uvloop, turning errors into one line and exit code 1."""
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(fn(*args, **kwargs))
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.exceptions.Exit:
        raise
    except (MinibrokerError, ValueError, OSError) as exc:
        if _is_debug():
            raise
        _fail(str(exc))
    except Exception as exc:
        if _is_debug():
            raise
        _fail(f"unexpected {type(exc).__name__}: {exc} (run again with --debug for details)")


def _parse_configs(pairs: tuple[str, ...]) -> dict[str, str]:
    configs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--config")
        configs[key.strip()] = value.strip()
    return configs


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    return "\n".join(lines)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _nodes(ids: tuple[int, ...]) -> str:
    return "[" + " ".join(map(str, ids)) + "]"
