"""The connection bounds both servers have, declared once (Kafka's names where Kafka has
the setting): broker/config.py and controller/config.py place these fields among their
own settings, and `connection_limits()` turns either config into the ConnectionLimits
its server's connection table enforces.

The total and per-address counts stay declared per server: the controller keeps slots
for brokers and exempts them from the per-address count, the broker has no such class
of connection, so the two settings mean different things.
"""

from __future__ import annotations

from typing import Any
from typing import Protocol

from protocol.connection_limits import ConnectionLimits
from protocol.connection_limits import parse_per_ip_overrides
from runtime.settings import setting


def per_ip_overrides_setting() -> Any:
    return setting(
        "",
        parse=parse_per_ip_overrides,
        shown_default="none",
        doc="Per-address limits that replace --max-connections-per-ip: ADDRESS:COUNT,... "
        "(IP addresses, e.g. 10.0.0.5:5000) (max.connections.per.ip.overrides).",
    )


def idle_timeout_setting(*, exempt: str = "") -> Any:
    """`exempt`: the connections the server never closes as idle, e.g. "a broker's"."""
    which = f"that is not {exempt} " if exempt else ""
    return setting(
        600_000,
        minimum=1,
        doc=f"Close a connection {which}with nothing received, nothing of its answers taken "
        "and no request in service for this long (connections.max.idle.ms).",
    )


def frame_timeout_setting(server: str) -> Any:
    return setting(
        30_000,
        minimum=1,
        doc="Close a connection whose request frame, once begun, is not complete within this "
        f"long (slowloris); the clock stops while the {server} itself is not reading it.",
    )


def pending_bytes_setting(server: str, *, held: str) -> Any:
    """`held`: what counts toward the bytes, in the server's words."""
    return setting(
        64 * 1024 * 1024,
        minimum=1,
        doc=f"Bytes one connection may make the {server} hold ({held}); past it the "
        f"{server} stops reading that connection. One request at a time always runs.",
    )


class ConnectionSettings(Protocol):
    """What `connection_limits` reads from a server's config."""

    @property
    def max_connections(self) -> int: ...
    @property
    def max_connections_per_ip(self) -> int: ...
    @property
    def max_connections_per_ip_overrides(self) -> dict[str, int]: ...
    @property
    def connections_max_idle_ms(self) -> int: ...
    @property
    def request_frame_timeout_ms(self) -> int: ...
    @property
    def max_pending_bytes_per_connection(self) -> int: ...
    @property
    def max_in_flight_per_connection(self) -> int: ...


def connection_limits(
    config: ConnectionSettings, *, max_frame_bytes: int, **extra: Any
) -> ConnectionLimits:
    """The config's bounds as a ConnectionLimits; `extra`: the server's own fields of it
    (the controller's reserved slots and first-request timeout)."""
    return ConnectionLimits(
        max_connections=config.max_connections,
        max_connections_per_ip=config.max_connections_per_ip,
        max_connections_per_ip_overrides=config.max_connections_per_ip_overrides,
        max_in_flight=config.max_in_flight_per_connection,
        max_frame_bytes=max_frame_bytes,
        max_pending_bytes=config.max_pending_bytes_per_connection,
        idle_timeout_ms=config.connections_max_idle_ms,
        frame_timeout_ms=config.request_frame_timeout_ms,
        **extra,
    )
