"""What the controller quorum looks like (issue 17), as `kafka-metadata-quorum
describe` shows it: ask any controller which voter is active, then the active one for
every voter's progress (log end offset, lag behind the leader, last fetch).

`check_quorum` is that plus a probe of every voter, for `cluster health`: a voter that
does not answer DescribeQuorum is down, whatever the leader last heard from it."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from client.errors import ConnectionFailedError
from client.errors import short_reason
from client.health import STALE_FETCH_MS
from client.health import QuorumHealth
from client.health import VoterHealth
from client.health import quorum_health
from client.health import voter_is_down
from protocol.messages import DescribeQuorumResponse
from runtime.active_controller import WILDCARDS
from runtime.active_controller import ActiveController
from runtime.active_controller import Address
from runtime.active_controller import describe_quorum_at
from runtime.peer_rpc import RpcError
from runtime.peer_rpc import RpcErrorResponse
from runtime.sasl import SaslCredentials

REQUEST_TIMEOUT_S = 5.0
CLIENT_ID = "minibroker-metadata-quorum"


@dataclass(frozen=True)
class ControllerSecurity:
    """How to reach controllers that listen with SSL or SASL_SSL: the TLS context (with
    a client certificate when they ask for one) and the user to authenticate as."""

    tls: ssl.SSLContext | None = None
    sasl: SaslCredentials | None = None


PLAINTEXT = ControllerSecurity()


@dataclass(frozen=True)
class VoterStatus:
    node_id: int
    host: str
    port: int
    log_end_offset: int  # -1: not known to the leader (never fetched in this epoch)
    lag: int  # entries behind the leader's log end; -1 when unknown
    last_fetch_ms_ago: int  # -1: never
    role: str  # "leader", "follower", or "unknown" (the leader has not heard from it)


@dataclass(frozen=True)
class QuorumDescription:
    leader_id: int
    leader_epoch: int
    high_watermark: int
    leader_log_end_offset: int
    voters: list[VoterStatus]
    leader_address: Address  # where the active controller answered

    @property
    def max_follower_lag(self) -> int:
        lags = [v.lag for v in self.voters if v.role != "leader"]
        return max(lags, default=0)


async def _ask(address: tuple[str, int], security: ControllerSecurity) -> DescribeQuorumResponse:
    try:
        return await describe_quorum_at(
            address, CLIENT_ID, REQUEST_TIMEOUT_S, tls=security.tls, sasl=security.sasl
        )
    except RpcError as exc:
        raise ConnectionFailedError(f"controller at {address[0]}:{address[1]}: {exc}") from None


async def describe_quorum(
    controllers: Sequence[tuple[str, int]], security: ControllerSecurity = PLAINTEXT
) -> QuorumDescription:
    """The quorum as its active controller sees it (any controller's address will
    do). Raises ConnectionFailedError when no controller answers or none is active."""
    active = ActiveController(
        controllers, client_id=CLIENT_ID, tls=security.tls, sasl=security.sasl
    )
    await active.find()
    if active.leader_id < 0:
        raise ConnectionFailedError(
            f"no active controller known to {', '.join(f'{h}:{p}' for h, p in controllers)} "
            "(an election under way, or not a majority of the voters up)"
        )
    answer = await _ask(active.address, security)
    if answer.role != "leader":
        # A voter that stepped down (check-quorum) still names the leader it knew.
        raise ConnectionFailedError(
            f"controller {answer.node_id} is no longer the active controller (it is "
            f"{answer.role or 'unknown'} in epoch {answer.leader_epoch}); try again"
        )
    voters = [
        VoterStatus(
            node_id=v.replica_id,
            host=v.host,
            port=v.port,
            log_end_offset=v.log_end_offset,
            lag=answer.log_end_offset - v.log_end_offset if v.log_end_offset >= 0 else -1,
            last_fetch_ms_ago=v.last_fetch_ms_ago,
            role=(
                "leader"
                if v.replica_id == answer.node_id
                else "follower"
                if v.log_end_offset >= 0
                else "unknown"
            ),
        )
        for v in answer.voters
    ]
    return QuorumDescription(
        leader_id=answer.node_id,
        leader_epoch=answer.leader_epoch,
        high_watermark=answer.high_watermark,
        leader_log_end_offset=answer.log_end_offset,
        voters=voters,
        leader_address=active.address,
    )


@dataclass(frozen=True)
class VoterProbe:
    """One voter's own DescribeQuorum answer, or why there is none."""

    node_id: int
    address: Address | None  # None: listed at a wildcard address only, not asked
    answer: DescribeQuorumResponse | None
    error: str = ""


async def _probe(
    address: Address, timeout_s: float, security: ControllerSecurity
) -> DescribeQuorumResponse | str:
    """Its answer, or why there is none (one line)."""
    try:
        return await describe_quorum_at(
            address, CLIENT_ID, timeout_s, tls=security.tls, sasl=security.sasl
        )
    except RpcErrorResponse as exc:  # e.g. a broker's address given for a controller's
        return f"answered DescribeQuorum with {exc}: is it a controller's address?"
    except RpcError as exc:
        return str(exc) or type(exc).__name__


def _where(address: Address | None) -> str:
    return f"{address[0]}:{address[1]}" if address is not None else "-"


async def probe_voters(
    controllers: Sequence[Address], timeout_s: float, security: ControllerSecurity = PLAINTEXT
) -> tuple[list[VoterProbe], list[str]]:
    """Every voter asked DescribeQuorum once: the given controllers at the same time,
    then, at the same time, the voters their answers list that none of them is (a
    voter is reached where it answered: a listed address may be one only the quorum
    can dial). Also returns the failures of given addresses that are no known voter's
    (one line each)."""
    given = list(dict.fromkeys(controllers))
    first = await asyncio.gather(*(_probe(a, timeout_s, security) for a in given))
    reached: dict[int, VoterProbe] = {}
    failed: dict[Address, str] = {}
    listed: dict[int, Address | None] = {}
    for address, result in zip(given, first, strict=True):
        if isinstance(result, str):
            failed[address] = result
            continue
        reached.setdefault(result.node_id, VoterProbe(result.node_id, address, result))
        for v in result.voters:
            if listed.get(v.replica_id) is None:
                dialable = v.port > 0 and v.host not in WILDCARDS
                listed[v.replica_id] = (v.host, v.port) if dialable else None
    probes = list(reached.values())
    to_ask: list[tuple[int, Address]] = []
    for node_id in sorted(set(listed) - set(reached)):
        address = listed[node_id]
        if address is None:
            why = "listed at a wildcard address only: give its address in --controller"
            probes.append(VoterProbe(node_id, None, None, why))
        elif address in failed:  # given, and silent already
            probes.append(VoterProbe(node_id, address, None, failed.pop(address)))
        else:
            to_ask.append((node_id, address))
    second = await asyncio.gather(*(_probe(a, timeout_s, security) for _, a in to_ask))
    for (node_id, address), result in zip(to_ask, second, strict=True):
        if isinstance(result, str):
            probes.append(VoterProbe(node_id, address, None, result))
        else:
            probes.append(VoterProbe(node_id, address, result))
    return probes, [f"controller {_where(a)}: {why}" for a, why in failed.items()]


@dataclass(frozen=True)
class QuorumCheck:
    """`check_quorum`'s findings: no quorum when no controller answered."""

    quorum: QuorumHealth | None
    leader_address: Address | None  # where the active controller answered
    errors: list[str]


async def check_quorum(
    controllers: Sequence[Address], timeout_s: float, security: ControllerSecurity = PLAINTEXT
) -> QuorumCheck:
    """The quorum for `cluster health`: every voter probed (`probe_voters`), the
    active controller found and asked for every voter's progress (`describe_quorum`),
    and each voter judged down or not (client/health.py's voter_is_down)."""
    probes, errors = await probe_voters(controllers, timeout_s, security)
    answers = [p.answer for p in probes if p.answer is not None]
    if not answers:
        return QuorumCheck(None, None, errors)
    described: QuorumDescription | None = None
    try:
        # Only the voters that answered, in order: no time lost on the silent ones.
        described = await describe_quorum(
            [p.address for p in probes if p.answer is not None and p.address is not None],
            security,
        )
    except ConnectionFailedError as exc:
        errors.append(f"controller quorum: {short_reason(exc)}")
    probes.sort(key=lambda p: p.node_id)
    voters = [_voter_health(p, described) for p in probes]
    for probe, voter in zip(probes, voters, strict=True):
        if not voter.answered:
            errors.append(f"controller voter {voter.node_id} at {voter.address}: {probe.error}")
        elif voter.down:
            since = (
                f"for {voter.last_fetch_ms_ago} ms (down after {STALE_FETCH_MS} ms)"
                if voter.last_fetch_ms_ago >= 0
                else "in this epoch"
            )
            errors.append(
                f"controller voter {voter.node_id}: the active controller has not had a "
                f"fetch from it {since}"
            )
    if described is None:
        # No active controller: the newest epoch and commit point a voter knows.
        epoch = max(a.leader_epoch for a in answers)
        return QuorumCheck(
            quorum_health(-1, epoch, max(a.high_watermark for a in answers), voters), None, errors
        )
    quorum = quorum_health(
        described.leader_id, described.leader_epoch, described.high_watermark, voters
    )
    return QuorumCheck(quorum, described.leader_address, errors)


def _voter_health(probe: VoterProbe, described: QuorumDescription | None) -> VoterHealth:
    """One voter: its own answer, and its progress as the active controller has it."""
    voters = described.voters if described is not None else []
    status = next((v for v in voters if v.node_id == probe.node_id), None)
    last_fetch = status.last_fetch_ms_ago if status is not None else -1
    return VoterHealth(
        node_id=probe.node_id,
        address=_where(probe.address),
        answered=probe.answer is not None,
        role=probe.answer.role if probe.answer is not None else "",
        log_end_offset=status.log_end_offset if status is not None else -1,
        lag=status.lag if status is not None else -1,
        last_fetch_ms_ago=last_fetch,
        down=voter_is_down(
            answered=probe.answer is not None,
            is_leader=described is not None and probe.node_id == described.leader_id,
            leader_known=described is not None,
            last_fetch_ms_ago=last_fetch,
        ),
    )
