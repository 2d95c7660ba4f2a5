"""Container health probe: does this container's minibroker server answer requests?

Run by the image's HEALTHCHECK, without arguments. It finds the server process in the
container (`python -m controller|broker ...`, or `minibroker controller|broker ...`),
works out the addresses it listens on the way the server does (flag > `MINIBROKER_*`
environment > `--config` TOML file > default), connects to each on loopback and sends
an ApiVersions request, in Apache Kafka's protocol to a broker's Kafka listeners
(--kafka-listeners) and in minibroker's to the others; over TLS to a listener whose
security protocol is SSL or SASL_SSL (--listener-security-protocol-map, a listener named SSL, a
controller's --security-protocol), presenting the server's own certificate if it
requires client certificates. The probe checks liveness, not identity: it does not
verify the server's certificate (it reaches it at 127.0.0.1, a name the certificate
need not carry). Exit 0 when every listener
answers with a valid ApiVersions response, else 1; either way one line on stdout says
why (`docker inspect` shows it).

    python healthcheck.py [--timeout SECONDS] [HOST:PORT ...]

Explicit HOST:PORT arguments skip the discovery. A broker accepts connections only
once it is registered and caught up with the metadata log, so "healthy" means it
serves clients; a controller answers as soon as it listens.

Imports `protocol` only (the sans-I/O codec), like every client of the cluster.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple
from typing import TypeVar

from protocol.api import ApiKey
from protocol.connection import ClientConnection
from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.kafka.apis import API_VERSIONS
from protocol.kafka.codec import decode_response
from protocol.kafka.codec import encode_request
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse

T = TypeVar("T")

# The servers' own defaults (CONTRACT.md, "Process configuration").
_DEFAULTS = {"controller": "127.0.0.1:9093", "broker": "PLAINTEXT://127.0.0.1:9092"}
# The option (and its environment variable / TOML key) that holds the listen addresses.
_OPTION = {"controller": "listen", "broker": "listeners"}
_WILDCARD = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}
_MAX_RESPONSE = 1 << 20  # an ApiVersions answer is a few hundred bytes


class ProbeError(Exception):
    """The probe failed; the message says what was wrong."""


class Server(NamedTuple):
    pid: int
    role: str  # "controller" | "broker"
    args: list[str]  # the server's own arguments (after the module / subcommand name)
    env: dict[str, str]
    cwd: Path


def _server_args(argv: list[str]) -> tuple[str, list[str]] | None:
    """(role, arguments) when argv runs a minibroker server, else None."""
    # Only the interpreter itself: an init (docker run --init) or a wrapper carries the
    # same words in its command line.
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        return None
    for i, arg in enumerate(argv):
        if arg.startswith("-m") and arg[2:] in _OPTION:  # python -mbroker
            return arg[2:], argv[i + 1 :]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if nxt in _OPTION and (arg == "-m" or os.path.basename(arg) == "minibroker"):
            return nxt, argv[i + 2 :]
    return None


def _read_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return dict(os.environ)  # same container, same environment unless changed
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def find_server() -> Server | None:
    """The first (lowest pid) minibroker server process visible in /proc."""
    me = os.getpid()
    pids = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    for pid in pids:
        if pid == me:
            continue
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone, or a kernel thread
        argv = [a.decode(errors="replace") for a in raw.split(b"\0")]
        if argv and argv[-1] == "":
            argv.pop()
        found = _server_args(argv)
        if found is None:
            continue
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            cwd = Path("/")
        return Server(pid, found[0], found[1], _read_environ(pid), cwd)
    return None


def _flag(args: list[str], name: str) -> str | None:
    """The value of `--name VALUE` / `--name=VALUE` (the last one wins, as in click)."""
    value = None
    for i, arg in enumerate(args):
        if arg == f"--{name}" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
    return value


def _from_config_file(server: Server, key: str) -> str | None:
    path_text = _flag(server.args, "config") or server.env.get("MINIBROKER_CONFIG")
    if not path_text:
        return None
    path = server.cwd / path_text
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProbeError(f"cannot read the server's config file {path}: {exc}") from None
    # The servers accept a key with dashes or underscores.
    value = data.get(key, data.get(key.replace("_", "-")))
    return None if value is None else str(value)


def _setting(server: Server, key: str) -> str | None:
    """A server option as it resolves it: flag > environment > TOML file."""
    return (
        _flag(server.args, key)
        or server.env.get(f"MINIBROKER_{key.upper().replace('-', '_')}")
        or _from_config_file(server, key.replace("-", "_"))
    )


def listen_setting(server: Server) -> str:
    """The server's listen address(es) as it would resolve them."""
    return _setting(server, _OPTION[server.role]) or _DEFAULTS[server.role]


def kafka_listener_names(server: Server) -> set[str]:
    """The broker's listeners that speak Apache Kafka's protocol."""
    if server.role != "broker":
        return set()
    value = _setting(server, "kafka-listeners") or ""
    return {n.strip().upper() for n in value.split(",") if n.strip()}


def _split_host_port(text: str) -> tuple[str, int]:
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not port_text.isdigit():
        raise ProbeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port_text)


class Target(NamedTuple):
    host: str
    port: int
    kafka: bool  # a Kafka listener: probed in Apache Kafka's protocol
    tls: ssl.SSLContext | None = None  # an SSL listener


def ssl_listener_names(server: Server) -> set[str]:
    """The listeners that speak TLS (a controller's is named CONTROLLER here)."""
    if server.role == "controller":
        protocol = (_setting(server, "security-protocol") or "PLAINTEXT").upper()
        # SASL_SSL too: ApiVersions is answered before SASL authentication.
        return {"CONTROLLER"} if protocol in ("SSL", "SASL_SSL") else set()
    names = {s.partition("://")[0].strip().upper() for s in listen_setting(server).split(",")}
    mapped = {}
    for item in (_setting(server, "listener-security-protocol-map") or "").split(","):
        name, _, protocol = item.partition(":")
        mapped[name.strip().upper()] = protocol.strip().upper()
    # SASL_SSL too: ApiVersions is answered before SASL authentication.
    protocols = {n: mapped.get(n, "SSL" if n == "SSL" else "PLAINTEXT") for n in names}
    return {n for n, p in protocols.items() if p in ("SSL", "SASL_SSL")}


def probe_tls(server: Server) -> ssl.SSLContext:
    """An unverified TLS 1.2+ context; with the server's own certificate when it requires
    client certificates."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    certfile = _setting(server, "ssl-certfile")
    if (_setting(server, "ssl-client-auth") or "none").lower() == "required" and certfile:
        keyfile = _setting(server, "ssl-keyfile")
        try:
            context.load_cert_chain(server.cwd / certfile, keyfile and server.cwd / keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ProbeError(f"cannot load the server's certificate {certfile}: {exc}") from None
    return context


def probe_addresses(
    role: str,
    setting: str,
    kafka: set[str] | None = None,
    tls: tuple[set[str], ssl.SSLContext] | None = None,
) -> list[Target]:
    """A loopback-reachable target for each listen address of the setting; `kafka`:
    the names of the listeners that speak Apache Kafka's protocol; `tls`: those that
    speak TLS (a controller's listener is CONTROLLER), and the context to probe them."""
    items = [setting] if role == "controller" else [s for s in setting.split(",") if s.strip()]
    out: list[Target] = []
    for item in items:
        name, _, address = item.strip().rpartition("://")
        host, port = _split_host_port(address)
        if port == 0:
            raise ProbeError(
                f"the {role} listens on port 0 (a port picked at start): "
                "give this probe HOST:PORT arguments"
            )
        name = name.upper() or ("CONTROLLER" if role == "controller" else "")
        context = tls[1] if tls is not None and name in tls[0] else None
        out.append(Target(_WILDCARD.get(host, host), port, name in (kafka or set()), context))
    if not out:
        raise ProbeError(f"no listen address in {setting!r}")
    return out


def _exchange(
    target: Target, request: bytes, deadline: float, answered: Callable[[bytes], T | None]
) -> T:
    """Send `request`, feed what comes back to `answered` until it returns an answer."""
    host, port = target.host, target.port
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ProbeError(f"{host}:{port}: no time left")
    try:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.create_connection((host, port), timeout=remaining))
            if target.tls is not None:
                sock = stack.enter_context(target.tls.wrap_socket(sock, server_hostname=host))
            sock.sendall(request)
            received = 0
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                chunk = sock.recv(65536)
                if not chunk:
                    raise ProbeError(f"{host}:{port} closed the connection without answering")
                received += len(chunk)
                if received > _MAX_RESPONSE:
                    raise ProbeError(f"{host}:{port} sent more than {_MAX_RESPONSE} bytes")
                answer = answered(chunk)
                if answer is not None:
                    return answer
    except TimeoutError:
        raise ProbeError(f"{host}:{port} did not answer ApiVersions in time") from None
    except ssl.SSLError as exc:
        raise ProbeError(f"TLS with {host}:{port} failed: {exc}") from None
    except OSError as exc:
        raise ProbeError(f"cannot reach {host}:{port}: {exc.strerror or exc}") from None
    except DecodeError as exc:
        raise ProbeError(f"{host}:{port} sent a malformed answer: {exc}") from None


def _native_api_versions(target: Target, deadline: float) -> ApiVersionsResponse:
    host, port = target.host, target.port
    conn = ClientConnection("minibroker-healthcheck")
    _cid, request = conn.send_request(
        ApiVersionsRequest(client_software_name="minibroker-healthcheck")
    )
    response = _exchange(
        target, request, deadline, lambda c: next(iter(conn.receive_data(c)), None)
    )
    if response.error_code != ErrorCode.NONE:
        raise ProbeError(
            f"{host}:{port} answered ApiVersions with {response.error_code.name}: "
            f"{response.error_message}"
        )
    body = response.body
    if not isinstance(body, ApiVersionsResponse):
        raise ProbeError(f"{host}:{port} answered ApiVersions with {body!r}")
    return body


def _kafka_api_versions(target: Target, deadline: float) -> ApiVersionsResponse:
    request = encode_request(API_VERSIONS, 0, 1, "minibroker-healthcheck", ApiVersionsRequest())
    buffer = bytearray()

    def answered(chunk: bytes) -> ApiVersionsResponse | None:
        buffer.extend(chunk)
        if len(buffer) < 4 or len(buffer) < 4 + int.from_bytes(buffer[:4], "big"):
            return None
        body = decode_response(API_VERSIONS, 0, bytes(buffer[4:]))[1]
        assert isinstance(body, ApiVersionsResponse)
        return body

    return _exchange(target, request, deadline, answered)


def probe(target: Target, deadline: float) -> int:
    """Send ApiVersions to the target; return the number of APIs it announces."""
    host, port = target.host, target.port
    ask = _kafka_api_versions if target.kafka else _native_api_versions
    body = ask(target, deadline)
    if body.error_code != 0:
        raise ProbeError(f"{host}:{port} answered ApiVersions with {body!r}")
    if not any(k.api_key == ApiKey.API_VERSIONS for k in body.api_keys):
        raise ProbeError(f"{host}:{port} does not announce ApiVersions itself")
    return len(body.api_keys)


def main(argv: list[str]) -> int:
    timeout = 2.0
    targets: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            print(__doc__)
            return 0
        if arg == "--timeout" or arg.startswith("--timeout="):
            text = arg.split("=", 1)[1] if "=" in arg else next(args, "")
            try:
                timeout = float(text)
            except ValueError:
                print(f"unhealthy: --timeout {text!r} is not a number of seconds")
                return 1
        else:
            targets.append(arg)
    deadline = time.monotonic() + timeout
    try:
        if targets:
            what = "server"
            addresses = [Target(*_split_host_port(t), kafka=False) for t in targets]
        else:
            server = find_server()
            if server is None:
                print("unhealthy: no minibroker controller or broker process in this container")
                return 1
            what = f"{server.role} (pid {server.pid})"
            secure = ssl_listener_names(server)
            addresses = probe_addresses(
                server.role,
                listen_setting(server),
                kafka_listener_names(server),
                (secure, probe_tls(server)) if secure else None,
            )
        answers = [f"{t.host}:{t.port} ({probe(t, deadline)} APIs)" for t in addresses]
    except ProbeError as exc:
        print(f"unhealthy: {exc}")
        return 1
    except Exception as exc:  # exit 1, never 2 (reserved by Docker) or a traceback
        print(f"unhealthy: probe failed: {type(exc).__name__}: {exc}")
        return 1
    print(f"healthy: {what} answered ApiVersions on {', '.join(answers)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
