"""Who may hold a connection to a server, and for how long: sans-I/O.

The server loop (runtime/server.py, for broker listeners and the controller) keeps one
`ConnectionTable` per process and asks it at each accept and at each connection's first request; the
per-connection clocks (idle time, time to finish a frame) and the bytes a connection
may hold live in `protocol.connection.ServerConnection`. The rules, once:

- at most `max_connections` open. When full, a new connection takes the place of the
  oldest one that has not sent a request yet (an idle flood cannot lock anyone out);
  with none such, it is refused;
- at most `max_connections_per_ip` from one address (`overrides` per address). Over
  it, a connection is refused, unless the server keeps slots for privileged peers
  (the controller, for brokers): then it is let in on probation and closed unless its
  first request is a privileged API;
- connections whose first request is not privileged hold at most
  `max_connections - reserved_connections` slots together, so the reserved slots
  are always free, held by privileged peers, or held by silent connections that the
  next newcomer displaces. Privileged connections count against neither bound; one
  whose privileged API the server refuses as not authorized is closed (`on_refused`).

Kafka counts `max.connections.per.ip` per broker across its listeners; so does this
table (one per process). Which API is privileged is the server's business; the
controller calls the APIs only brokers send it privileged. Nothing authenticates a
peer yet, so a client that speaks a broker API first is taken for a broker.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import NamedTuple

from protocol.api import api_name
from protocol.connection import IDLE
from protocol.connection import NATIVE
from protocol.connection import CloseReason
from protocol.connection import ServerConnection
from protocol.connection import WireCodec
from protocol.messages import Message


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """The bounds of one server's connections (each process fills it from its config)."""

    max_connections: int = 10_000
    max_connections_per_ip: int = 10_000
    max_connections_per_ip_overrides: Mapping[str, int] = field(default_factory=dict)
    # Slots that only connections whose first request is a privileged API may use.
    reserved_connections: int = 0
    privileged_api_keys: frozenset[int] = frozenset()
    # Per connection (ServerConnection):
    max_in_flight: int = 100
    max_frame_bytes: int = 100 * 1024 * 1024
    max_pending_bytes: int = 64 * 1024 * 1024
    idle_timeout_ms: int | None = None
    frame_timeout_ms: int | None = None
    first_request_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_in_flight", "max_frame_bytes", "max_pending_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_connections_per_ip < 0:
            raise ValueError("max_connections_per_ip must be >= 0")
        if not 0 <= self.reserved_connections < self.max_connections:
            raise ValueError(
                f"reserved connections ({self.reserved_connections}) must be >= 0 and below "
                f"max connections ({self.max_connections})"
            )
        for name in ("idle_timeout_ms", "frame_timeout_ms", "first_request_timeout_ms"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or None: no limit), got {value}")

    def per_ip_limit(self, host: str) -> int:
        return self.max_connections_per_ip_overrides.get(host, self.max_connections_per_ip)

    def server_connection(
        self,
        now: float,
        *,
        api_filter: Callable[[int], bool] | None = None,
        response_reservation: Callable[[Message], int] | None = None,
        codec: WireCodec = NATIVE,
    ) -> ServerConnection:
        """A ServerConnection with these per-connection bounds, speaking `codec`."""

        def seconds(ms: int | None) -> float | None:
            return None if ms is None else ms / 1000

        return ServerConnection(
            max_frame_size=self.max_frame_bytes,
            max_in_flight=self.max_in_flight,
            api_filter=api_filter,
            max_pending_bytes=self.max_pending_bytes,
            response_reservation=response_reservation,
            idle_timeout_s=seconds(self.idle_timeout_ms),
            frame_timeout_s=seconds(self.frame_timeout_ms),
            first_request_timeout_s=seconds(self.first_request_timeout_ms),
            now=now,
            codec=codec,
        )

    def sweep_interval_s(self) -> float:
        """How often a server checks its connections' deadlines: a tenth of the
        shortest one, between 10 ms and 1 s (a deadline is met within that much)."""
        timeouts = [
            t
            for t in (self.idle_timeout_ms, self.frame_timeout_ms, self.first_request_timeout_ms)
            if t is not None
        ]
        if not timeouts:
            return 1.0
        return min(1.0, max(0.01, min(timeouts) / 10_000))


def normalize_host(host: str) -> str:
    """The address a per-IP limit counts: canonical text, an IPv4-mapped IPv6 address
    as its IPv4 form (a dual-stack socket reports 127.0.0.1 as ::ffff:127.0.0.1)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host  # e.g. a Unix socket path: counted as it is
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def parse_per_ip_overrides(text: str, *, option: str) -> dict[str, int]:
    """`ADDRESS:COUNT[,ADDRESS:COUNT...]` (Kafka's max.connections.per.ip.overrides,
    addresses only: host names are not resolved). Raises ValueError naming the fault."""
    out: dict[str, int] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        host = host.strip().strip("[]")
        if not sep or not host or not count.strip().isdigit():
            raise ValueError(
                f"{option}: {item!r} is not ADDRESS:COUNT (e.g. 10.0.0.5:2000,[::1]:50)"
            )
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(
                f"{option}: {host!r} is not an IP address (host names are not resolved; "
                "give the address the connections come from)"
            ) from None
        key = normalize_host(host)
        if key in out:
            raise ValueError(f"{option}: {host} appears twice")
        out[key] = int(count)
    return out


@dataclass(eq=False, slots=True)
class ConnectionSlot:
    """One open connection's entry in the table (compared by identity)."""

    host: str
    peer: str  # for log lines
    opened_at: float
    conn: ServerConnection
    close: Callable[[], None]  # the server's way to drop this connection at once
    unsent: Callable[[], int]  # bytes its transport has not sent yet
    on_probation: bool  # over its address's limit: must speak privileged
    spoke: bool = False
    privileged: bool = False
    anonymous: bool = False  # spoke first with an API that is not privileged
    released: bool = False


class Admission(NamedTuple):
    slot: ConnectionSlot | None  # None: refused
    refused: CloseReason | None
    evicted: CloseReason | None  # a silent connection closed to make room (to log)


class ConnectionTable:
    """The open connections of one server process and the rules in the module doc."""

    def __init__(self, limits: ConnectionLimits, *, log_interval_s: float = 10.0) -> None:
        self.limits = limits
        self._slots: set[ConnectionSlot] = set()
        self._privileged = 0
        self._anonymous = 0  # spoke, not privileged
        self._per_host: Counter[str] = Counter()  # connections not (yet) privileged
        self._silent: dict[ConnectionSlot, None] = {}  # no request yet, oldest first
        self._throttle = LogThrottle(log_interval_s)
        self._last_sweep = float("-inf")

    @property
    def open_count(self) -> int:
        return len(self._slots)

    def host_count(self, host: str) -> int:
        """Connections from `host` that count against its limit."""
        return self._per_host[normalize_host(host)]

    def open(
        self,
        host: str,
        peer: str,
        now: float,
        *,
        conn: ServerConnection,
        close: Callable[[], None],
        unsent: Callable[[], int],
    ) -> Admission:
        """Admit a new connection (a slot) or refuse it; may close the oldest silent
        connection to make room (through its `close`)."""
        limits = self.limits
        host = normalize_host(host)
        over_ip = self._per_host[host] >= limits.per_ip_limit(host)
        if over_ip and not limits.reserved_connections:
            return Admission(
                None,
                CloseReason(
                    "max-connections-per-ip",
                    f"refusing connection from {peer}: {self._per_host[host]} connections from "
                    f"{host} are open, its limit (--max-connections-per-ip)",
                ),
                None,
            )
        evicted = None
        if len(self._slots) >= limits.max_connections:
            victim = next(iter(self._silent), None)
            if victim is None:
                return Admission(
                    None,
                    CloseReason(
                        "max-connections",
                        f"refusing connection from {peer}: {len(self._slots)} connections are "
                        "open, the limit (--max-connections), and each has sent a request",
                    ),
                    None,
                )
            evicted = CloseReason(
                "evicted-silent",
                f"closing connection from {victim.peer}, open {now - victim.opened_at:.1f}s "
                f"without a request, to make room for {peer}: {len(self._slots)} connections "
                "are open, the limit (--max-connections)",
            )
            self.release(victim)
            victim.close()
        slot = ConnectionSlot(host, peer, now, conn, close, unsent, over_ip)
        self._slots.add(slot)
        self._per_host[host] += 1
        self._silent[slot] = None
        return Admission(slot, None, evicted)

    def on_request(self, slot: ConnectionSlot, api_key: int) -> CloseReason | None:
        """Classify a connection by its first request; a CloseReason: close it unanswered."""
        if slot.spoke:
            return None
        slot.spoke = True
        self._silent.pop(slot, None)
        limits = self.limits
        if api_key in limits.privileged_api_keys:
            slot.privileged = True
            self._privileged += 1
            self._release_host(slot.host)
            return None
        if slot.on_probation:
            return CloseReason(
                "max-connections-per-ip",
                f"closing connection from {slot.peer}: over the limit of connections from "
                f"{slot.host} (--max-connections-per-ip); it was let in for a broker only, but "
                f"its first request is api {api_key}",
            )
        unreserved = limits.max_connections - limits.reserved_connections
        if self._anonymous >= unreserved:
            return CloseReason(
                "reserved-connections",
                f"closing connection from {slot.peer}: {self._anonymous} connections of "
                f"clients are open, all they may hold ({limits.reserved_connections} of "
                f"{limits.max_connections} connections are kept for brokers: "
                "--reserved-broker-connections)",
            )
        slot.anonymous = True
        self._anonymous += 1
        return None

    def on_refused(self, slot: ConnectionSlot, api_key: int) -> CloseReason | None:
        """The server refused a request of the connection as not authorized; a
        CloseReason: close it once the answer is out. A privileged slot is a server's:
        a connection whose privileged API is refused is no broker, and must not keep a
        slot that neither the per-address nor the clients' bound counts, nor idleness
        closes (a user of the cluster could otherwise fill --max-connections)."""
        if not (slot.privileged and api_key in self.limits.privileged_api_keys):
            return None
        return CloseReason(
            "privileged-refused",
            f"closing connection from {slot.peer}: it holds a broker's slot, and its "
            f"{api_name(api_key)} was refused as not authorized",
        )

    def release(self, slot: ConnectionSlot) -> None:
        """The connection is gone (idempotent)."""
        if slot.released:
            return
        slot.released = True
        self._slots.discard(slot)
        self._silent.pop(slot, None)
        if slot.privileged:
            self._privileged -= 1
            return
        self._release_host(slot.host)
        if slot.anonymous:
            self._anonymous -= 1

    def _release_host(self, host: str) -> None:
        self._per_host[host] -= 1
        if self._per_host[host] <= 0:
            del self._per_host[host]

    def sweep(self, now: float) -> list[str]:
        """Close every connection whose deadline has passed (ServerConnection.expired;
        a privileged peer is not closed for idleness); return the lines to log. Calls
        closer together than half the sweep interval do nothing, so each listener of
        a process may call it on the shared table."""
        if now - self._last_sweep < self.limits.sweep_interval_s() / 2:
            return []
        self._last_sweep = now
        expired = []
        for slot in self._slots:
            reason = slot.conn.expired(now, slot.unsent())
            if reason is not None and not (reason.kind == IDLE and slot.privileged):
                expired.append((slot, reason))
        lines = []
        for slot, reason in expired:
            text = f"closing connection from {slot.peer}: {reason.message}"
            line = self.log_line(CloseReason(reason.kind, text), now)
            if line is not None:
                lines.append(line)
            self.release(slot)
            slot.close()
        return lines + self._throttle.flush(now)

    def log_line(self, event: CloseReason, now: float) -> str | None:
        """The line to log for a refusal or closure, or None (rate-limited)."""
        return self._throttle.line(event, now)


class _Throttled:
    __slots__ = ("last_logged", "latest", "skipped")

    def __init__(self, now: float, message: str) -> None:
        self.last_logged = now
        self.skipped = 0
        self.latest = message


class LogThrottle:
    """At most one log line per kind of event per `interval_s`; the events in between
    are counted and said with the next line, or by `flush` once the interval is over
    (1,000 slow connections closed at once make two lines, not 1,000)."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._kinds: dict[str, _Throttled] = {}

    def line(self, event: CloseReason, now: float) -> str | None:
        """The line to log for `event`, or None (counted for a later line)."""
        state = self._kinds.get(event.kind)
        if state is not None and now - state.last_logged < self.interval_s:
            state.skipped += 1
            state.latest = event.message
            return None
        skipped = state.skipped if state is not None else 0
        self._kinds[event.kind] = _Throttled(now, event.message)
        if skipped:
            return f"{event.message} ({skipped} more like this not logged)"
        return event.message

    def flush(self, now: float) -> list[str]:
        """Lines for the events counted but not logged, once their interval is over."""
        out = []
        for state in self._kinds.values():
            if state.skipped and now - state.last_logged >= self.interval_s:
                out.append(
                    f"{state.skipped} more like this in the last "
                    f"{now - state.last_logged:.0f}s, the latest: {state.latest}"
                )
                state.last_logged, state.skipped = now, 0
        return out
