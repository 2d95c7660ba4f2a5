"""`parse_bootstrap_servers`: a client's bootstrap list, "h1:9092,h2:9094" or a list of
"HOST:PORT", as (host, port) pairs. A module of its own so that option parsing (the
Spark source checks `kafka.bootstrap.servers` in every Python process Spark starts)
does not import the networking client."""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_PORT = 9092


def parse_bootstrap_servers(
    servers: str | Iterable[str], *, what: str = "bootstrap server"
) -> list[tuple[str, int]]:
    """'h1:9092,h2:9094' or ['h1:9092', ...] -> [(host, port)]; port defaults to 9092;
    IPv6 literals in brackets ('[::1]:9092'). `what` names an entry in errors."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out: list[tuple[str, int]] = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        host, port_text = item, ""
        if item.startswith("["):
            end = item.find("]")
            if end < 0:
                raise ValueError(f"bad {what} {item!r}: missing ']'")
            host, rest = item[1:end], item[end + 1 :]
            port_text = rest[1:] if rest.startswith(":") else rest
        elif item.count(":") == 1:
            host, port_text = item.split(":")
        try:
            port = int(port_text) if port_text else DEFAULT_PORT
        except ValueError:
            raise ValueError(f"bad {what} {item!r}: port must be a number") from None
        if not host or not 0 < port < 65536:
            raise ValueError(f"bad {what} {item!r}: expected HOST:PORT")
        out.append((host, port))
    if not out:
        raise ValueError("no bootstrap servers given: pass HOST:PORT[,HOST:PORT...]")
    return out
