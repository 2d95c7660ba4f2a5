"""The bounds of a server connection, sans-I/O (protocol/connection.py and
protocol/connection_limits.py): the bytes a connection may make the server hold,
the frame / first-request / idle deadlines, and the per-process connection table
(total, per IP, slots kept for brokers, displacing silent connections), with no
sockets and a clock the test moves."""

from __future__ import annotations

import pytest

from protocol.api import ApiKey
from protocol.connection import FIRST_REQUEST_TIMEOUT
from protocol.connection import FRAME_TIMEOUT
from protocol.connection import IDLE
from protocol.connection import ClientConnection
from protocol.connection import CloseReason
from protocol.connection import RejectedRequest
from protocol.connection import Request
from protocol.connection import ServerConnection
from protocol.connection_limits import ConnectionLimits
from protocol.connection_limits import ConnectionTable
from protocol.connection_limits import LogThrottle
from protocol.connection_limits import normalize_host
from protocol.connection_limits import parse_per_ip_overrides
from protocol.messages import ApiVersionsRequest
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import FetchTopic
from protocol.messages import Message
from protocol.messages import MetadataResponse

RESERVED_PER_FETCH = 1000


def fetch_reservation(body: Message) -> int:
    return RESERVED_PER_FETCH if isinstance(body, FetchRequest) else 0


def fetch() -> FetchRequest:
    return FetchRequest(
        max_bytes=2**31 - 1,
        topics=[FetchTopic(topic="t", partitions=[FetchPartition(partition=0, fetch_offset=0)])],
    )


def request_bytes(client: ClientConnection, *bodies: Message) -> bytes:
    return b"".join(client.send_request(body)[1] for body in bodies)


def drain(server: ServerConnection, unsent: int = 0) -> list[Request | RejectedRequest]:
    events = []
    while (event := server.next_event(unsent)) is not None:
        events.append(event)
    return events


# ---------------------------------------------------------------- pending bytes


def test_pipelined_fetches_wait_for_the_bytes_reserved_by_earlier_ones() -> None:
    """The issue's attack in miniature: 40 pipelined fetches that may each return far
    more than the bound. Only as many start as their reservations fit; the rest wait
    undecoded work, and the connection reports itself blocked (stop reading)."""
    client = ClientConnection()
    server = ServerConnection(
        max_pending_bytes=2500, response_reservation=fetch_reservation, max_in_flight=100
    )
    server.receive_data(request_bytes(client, *[fetch() for _ in range(40)]))
    first = drain(server)
    assert len(first) == 2  # 2 x (1000 + frame) fit in 2500, a third does not
    assert server.blocked
    assert RESERVED_PER_FETCH * 2 < server.pending_bytes <= 2500
    # An answer out of order is held, and still counts, until the earlier one goes.
    assert server.send_response(first[1], MetadataResponse(cluster_id="x" * 300)) == b""
    assert server.pending_bytes > RESERVED_PER_FETCH + 300
    assert drain(server) == []
    out = server.send_response(first[0], MetadataResponse())
    assert out and server.pending_bytes == 0
    assert len(drain(server)) == 2


def test_unsent_bytes_of_the_transport_count_against_the_bound() -> None:
    client = ClientConnection()
    server = ServerConnection(max_pending_bytes=10_000)
    server.receive_data(request_bytes(client, ApiVersionsRequest(), ApiVersionsRequest()))
    [first] = drain(server, unsent=9_990)  # the first runs alone whatever is unsent
    assert server.next_event(unsent=9_990) is None and server.blocked
    second = server.next_event(unsent=0)
    assert isinstance(second, Request) and second.seq == first.seq + 1
    assert not server.blocked


def test_one_request_always_runs_alone_even_when_larger_than_the_bound() -> None:
    client = ClientConnection()
    server = ServerConnection(max_pending_bytes=10, response_reservation=fetch_reservation)
    server.receive_data(request_bytes(client, fetch(), fetch()))
    [only] = drain(server)
    assert server.blocked
    server.send_response(only, MetadataResponse())
    assert len(drain(server)) == 1


def test_rejected_requests_reserve_nothing() -> None:
    client = ClientConnection()
    server = ServerConnection(
        max_pending_bytes=10, api_filter=lambda key: key != ApiKey.FETCH, max_in_flight=5
    )
    server.receive_data(request_bytes(client, fetch(), fetch(), fetch()))
    events = drain(server)
    assert [type(e) for e in events] == [RejectedRequest] * 3
    assert server.pending_bytes == 0
    for event in events:
        assert isinstance(event, RejectedRequest)
        assert server.send_rejection(event)


# ---------------------------------------------------------------- deadlines


def test_a_frame_trickled_one_byte_per_100_ms_is_cut_at_the_frame_deadline() -> None:
    """Slowloris: a steady trickle is activity, so only the frame deadline stops it."""
    client = ClientConnection()
    server = ServerConnection(frame_timeout_s=30.0, idle_timeout_s=600.0)
    data = request_bytes(client, ApiVersionsRequest(client_software_name="x" * 400))
    now = 0.0
    for byte in data[:300]:
        server.receive_data(bytes([byte]), now)
        assert server.next_event() is None
        if now < 30.0:
            assert server.expired(now) is None
        now += 0.1
    reason = server.expired(now)
    assert reason is not None and reason.kind == FRAME_TIMEOUT
    assert "300 bytes received" in reason.message


def test_a_partial_frame_that_stops_is_cut_and_a_whole_one_resets_the_clock() -> None:
    client = ClientConnection()
    server = ServerConnection(frame_timeout_s=1.0)
    one = request_bytes(client, ApiVersionsRequest())
    two = request_bytes(client, ApiVersionsRequest())
    server.receive_data(one + two[:3], now=10.0)  # a whole frame and the next one's start
    assert len(drain(server)) == 1
    assert server.expired(10.9) is None
    reason = server.expired(11.0)
    assert reason is not None and reason.kind == FRAME_TIMEOUT
    server.receive_data(two[3:], now=10.95)
    assert len(drain(server)) == 1
    assert server.expired(100.0) is None  # nothing begun: no frame deadline


def test_the_frame_clock_stops_while_the_server_does_not_read() -> None:
    client = ClientConnection()
    server = ServerConnection(frame_timeout_s=1.0)
    server.receive_data(request_bytes(client, ApiVersionsRequest())[:5], now=0.0)
    server.pause_clock()
    assert server.expired(50.0) is None
    server.resume_clock(50.0)  # a whole timeout again from here
    assert server.expired(50.9) is None
    assert server.expired(51.0) is not None


def test_first_request_deadline() -> None:
    client = ClientConnection()
    server = ServerConnection(first_request_timeout_s=2.0, now=5.0)
    assert server.expired(6.9) is None
    reason = server.expired(7.0)
    assert reason is not None and reason.kind == FIRST_REQUEST_TIMEOUT
    served = ServerConnection(first_request_timeout_s=2.0, now=5.0)
    served.receive_data(request_bytes(client, ApiVersionsRequest()), now=5.5)
    assert len(drain(served)) == 1
    assert served.expired(100.0) is None


def test_idle_counts_from_the_last_byte_either_way_or_the_last_request_in_service() -> None:
    client = ClientConnection()
    server = ServerConnection(idle_timeout_s=10.0)
    server.receive_data(request_bytes(client, ApiVersionsRequest()), now=0.0)
    [request] = drain(server)
    assert server.expired(15.0) is None  # a request in service is not idleness
    assert isinstance(request, Request)
    server.send_response(request, MetadataResponse())
    assert server.expired(24.9, unsent=5000) is None
    assert server.expired(30.0, unsent=4000) is None  # the peer took 1000 bytes: activity
    reason = server.expired(40.0, unsent=4000)  # a peer that stopped reading
    assert reason is not None and reason.kind == IDLE


# ---------------------------------------------------------------- the connection table


class Peer:
    """One connection as a server's glue holds it."""

    def __init__(self, table: ConnectionTable, host: str, now: float = 0.0) -> None:
        self.closed = False
        self.conn = table.limits.server_connection(now)
        admission = table.open(
            host, f"{host}:1", now, conn=self.conn, close=self.close, unsent=lambda: 0
        )
        self.slot = admission.slot
        self.refused = admission.refused
        self.evicted = admission.evicted

    def close(self) -> None:
        self.closed = True


def test_per_ip_limit_refuses_the_next_connection_from_that_address_only() -> None:
    table = ConnectionTable(
        ConnectionLimits(max_connections_per_ip=3, max_connections_per_ip_overrides={"10.0.0.9": 5})
    )
    peers = [Peer(table, "127.0.0.1") for _ in range(3)]
    extra = Peer(table, "127.0.0.1")
    assert extra.slot is None and extra.refused is not None
    assert extra.refused.kind == "max-connections-per-ip"
    assert Peer(table, "10.0.0.1").slot is not None  # another address is not affected
    assert all(Peer(table, "10.0.0.9").slot is not None for _ in range(5))
    assert Peer(table, "10.0.0.9").slot is None
    assert Peer(table, "::ffff:127.0.0.1").slot is None  # the same address, mapped
    assert peers[0].slot is not None
    table.release(peers[0].slot)
    table.release(peers[0].slot)  # idempotent
    assert table.host_count("127.0.0.1") == 2
    assert Peer(table, "127.0.0.1").slot is not None


def test_a_full_table_displaces_the_oldest_silent_connection_else_refuses() -> None:
    table = ConnectionTable(ConnectionLimits(max_connections=3))
    a, b, c = (Peer(table, "127.0.0.1", now=i) for i in range(3))
    assert a.slot is not None and b.slot is not None
    assert table.on_request(a.slot, ApiKey.API_VERSIONS) is None  # a has spoken
    d = Peer(table, "127.0.0.1", now=5)
    assert d.slot is not None and b.closed and not a.closed and not c.closed
    assert d.evicted is not None and d.evicted.kind == "evicted-silent"
    for p in (c, d):
        assert p.slot is not None and table.on_request(p.slot, ApiKey.API_VERSIONS) is None
    e = Peer(table, "127.0.0.1", now=6)
    assert e.slot is None and e.refused is not None and e.refused.kind == "max-connections"
    assert table.open_count == 3


def table_with_broker_slots(broker_api: ApiKey, *, total: int, per_ip: int) -> ConnectionTable:
    """A table of `total` connections (`per_ip` an address) that keeps 10 of them for
    connections speaking `broker_api` (privileged: a broker's)."""
    return ConnectionTable(
        ConnectionLimits(
            max_connections=total,
            max_connections_per_ip=per_ip,
            reserved_connections=10,
            privileged_api_keys=frozenset({int(broker_api)}),
        )
    )


def test_slots_kept_for_brokers_survive_a_flood_of_anonymous_connections() -> None:
    """994 anonymous connections locked a restarting broker out of the controller."""
    table = table_with_broker_slots(ApiKey.BROKER_REGISTRATION, total=100, per_ip=1000)
    flood = [Peer(table, "127.0.0.1") for _ in range(100)]
    spoke = 0
    for peer in flood:  # every one asks ApiVersions: only 90 may stay
        assert peer.slot is not None
        if table.on_request(peer.slot, ApiKey.API_VERSIONS) is None:
            spoke += 1
        else:
            table.release(peer.slot)
    assert spoke == 90
    silent = [Peer(table, "127.0.0.1") for _ in range(10)]  # the 10 free slots, idle
    assert all(p.slot is not None for p in silent) and table.open_count == 100
    broker = Peer(table, "127.0.0.1")
    assert broker.slot is not None and silent[0].closed  # the oldest silent one made room
    assert table.on_request(broker.slot, ApiKey.BROKER_REGISTRATION) is None
    assert broker.slot.privileged and table.host_count("127.0.0.1") == 99


def test_over_its_address_limit_a_connection_is_let_in_for_a_broker_only() -> None:
    table = table_with_broker_slots(ApiKey.BROKER_HEARTBEAT, total=50, per_ip=2)
    for _ in range(2):
        peer = Peer(table, "127.0.0.1")
        assert peer.slot is not None and table.on_request(peer.slot, ApiKey.API_VERSIONS) is None
    tool, broker = Peer(table, "127.0.0.1"), Peer(table, "127.0.0.1")
    assert tool.slot is not None and broker.slot is not None  # on probation
    reason = table.on_request(tool.slot, ApiKey.API_VERSIONS)
    assert reason is not None and reason.kind == "max-connections-per-ip"
    assert table.on_request(broker.slot, ApiKey.BROKER_HEARTBEAT) is None


def test_sweep_closes_expired_connections_with_rate_limited_log_lines() -> None:
    table = ConnectionTable(
        ConnectionLimits(
            frame_timeout_ms=1000,
            idle_timeout_ms=5000,
            privileged_api_keys=frozenset({int(ApiKey.BROKER_HEARTBEAT)}),
        ),
        log_interval_s=10.0,
    )
    client = ClientConnection()
    slow = [Peer(table, "127.0.0.1") for _ in range(200)]
    for peer in slow:
        peer.conn.receive_data(request_bytes(client, ApiVersionsRequest())[:7], now=0.0)
    broker = Peer(table, "127.0.0.2")
    assert broker.slot is not None
    broker.conn.receive_data(request_bytes(client, ApiVersionsRequest()), now=0.0)
    drain(broker.conn)
    table.on_request(broker.slot, ApiKey.BROKER_HEARTBEAT)
    assert table.sweep(0.5) == []
    lines = table.sweep(1.0)
    assert all(p.closed for p in slow) and table.open_count == 1
    assert len(lines) == 1 and "still incomplete" in lines[0]
    assert table.sweep(20.0) == ["199 more like this in the last 19s, the latest: " + lines[0]]
    assert table.sweep(60.0) == [] and not broker.closed  # a broker is not idle-closed


def test_log_throttle_counts_what_it_does_not_log() -> None:
    throttle = LogThrottle(interval_s=10.0)
    event = CloseReason("k", "closing x")
    assert throttle.line(event, 0.0) == "closing x"
    assert throttle.line(event, 1.0) is None
    assert throttle.line(CloseReason("other", "y"), 1.0) == "y"
    assert throttle.line(event, 12.0) == "closing x (1 more like this not logged)"
    assert throttle.flush(30.0) == []


def test_per_ip_overrides_are_addresses() -> None:
    assert parse_per_ip_overrides("10.0.0.5:20, [::1]:3", option="--o") == {
        "10.0.0.5": 20,
        "::1": 3,
    }
    assert parse_per_ip_overrides("", option="--o") == {}
    for bad, why in (
        ("host.example:3", "not an IP address"),
        ("10.0.0.5", "not ADDRESS:COUNT"),
        ("10.0.0.5:x", "not ADDRESS:COUNT"),
        ("10.0.0.5:1,10.0.0.5:2", "twice"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_per_ip_overrides(bad, option="--o")
    assert normalize_host("::ffff:10.1.2.3") == "10.1.2.3"
