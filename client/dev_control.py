"""The control socket of a running `minibroker dev`: how a second shell asks it for
`status`, or to `kill`, `stop` or `restart` one of its nodes.

The socket is DATA_DIR/dev.sock (a unix socket, mode 0600, made by `minibroker dev` and
removed when it stops). One request per connection: a JSON line
``{"op": "status"|"kill"|"stop"|"restart", "node": "<name>"}`` of at most
MAX_REQUEST_BYTES; one JSON line back, ``{"ok": true, "lines": [...]}`` or
``{"ok": false, "error": "..."}``.

Node names: a broker by its node id (``2``, or ``broker-2``), a controller by ``c`` and
its node id (``c0``, or ``controller-0``; a quorum's are c0, c1, c2...; a single
controller is c0, also ``controller``).
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

SOCKET_NAME = "dev.sock"
MAX_REQUEST_BYTES = 1024
MAX_RESPONSE_BYTES = 64 * 1024
MAX_CONNECTIONS = 4
# A request waits at most this for the client to send its line.
REQUEST_READ_TIMEOUT_S = 5.0
OPERATIONS = ("status", "kill", "stop", "restart")
# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107

_NODE_PATTERN = re.compile(
    r"^(?:(?P<broker>\d+)|broker-(?P<named>\d+)|(?:c|controller-)(?P<c>\d+))$"
)


class DevControlError(Exception):
    """One line for the user: what went wrong and what to do."""


def socket_path(data_dir: Path) -> Path:
    return data_dir.absolute() / SOCKET_NAME


def parse_node(text: str) -> tuple[str, int]:
    """("broker", id) or ("controller", id) from a node name; DevControlError if none."""
    name = text.strip().lower()
    if name == "controller":
        return "controller", 0
    match = _NODE_PATTERN.match(name)
    if match is None:
        raise DevControlError(
            f"unknown node name {text!r}: use a broker's node id (2 or broker-2) or a "
            "controller's (c0 or controller-0)"
        )
    if match["c"] is not None:
        return "controller", int(match["c"])
    return "broker", int(match["broker"] or match["named"])


def request(
    data_dir: Path, op: str, node: str | None = None, timeout_s: float = 120.0
) -> list[str]:
    """Send one request to the dev cluster at data_dir; its reply lines, or
    DevControlError with the cluster's (or the connection's) one-line error."""
    path = socket_path(data_dir)
    if len(str(path).encode()) > MAX_SOCKET_PATH_BYTES:
        raise DevControlError(
            f"{path} is too long for a unix socket ({MAX_SOCKET_PATH_BYTES} bytes at most): "
            "use a shorter --data-dir"
        )
    if not path.exists():
        raise DevControlError(
            f"no `minibroker dev` running at {data_dir.absolute()} (no {SOCKET_NAME}): start "
            "one there, or pass the --data-dir it was started with"
        )
    body = json.dumps({"op": op, "node": node}).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
            sock.sendall(body)
            reply = _read_line(sock, MAX_RESPONSE_BYTES)
        except ConnectionRefusedError:
            raise DevControlError(
                f"no `minibroker dev` running at {data_dir.absolute()} ({path} is left over "
                "from one that died): start one there"
            ) from None
        except TimeoutError:
            raise DevControlError(
                f"the dev cluster at {data_dir.absolute()} did not answer within {timeout_s:.0f} s"
            ) from None
        except OSError as exc:
            raise DevControlError(f"cannot talk to the dev cluster at {path}: {exc}") from None
    try:
        decoded: dict[str, Any] = json.loads(reply)
    except ValueError:
        raise DevControlError(f"the dev cluster at {path} sent a malformed reply") from None
    if not decoded.get("ok"):
        raise DevControlError(str(decoded.get("error", "request failed")))
    return [str(line) for line in decoded.get("lines", [])]


def _read_line(sock: socket.socket, limit: int) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise DevControlError(f"the dev cluster's reply is over {limit} bytes")
    return data


def encode_reply(*, lines: list[str] | None = None, error: str | None = None) -> bytes:
    payload: dict[str, Any] = {"ok": False, "error": error} if error else {"ok": True}
    if lines is not None:
        payload["lines"] = lines
    return json.dumps(payload).encode() + b"\n"


def decode_request(line: bytes) -> tuple[str, str | None]:
    """(op, node) from a request line; DevControlError saying what is wrong."""
    try:
        decoded = json.loads(line)
    except ValueError:
        raise DevControlError("request is not a JSON line") from None
    if not isinstance(decoded, dict) or decoded.get("op") not in OPERATIONS:
        raise DevControlError(f"unknown operation: use one of {', '.join(OPERATIONS)}")
    node = decoded.get("node")
    if decoded["op"] != "status" and not isinstance(node, str):
        raise DevControlError(f"{decoded['op']} needs a node name")
    return decoded["op"], node
