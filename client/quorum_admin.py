"""What the controller quorum looks like (issue 17), as `kafka-metadata-quorum
describe` shows it: ask any controller which voter is active, then the active one for
every voter's progress (log end offset, lag behind the leader, last fetch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from client.errors import ConnectionFailedError
from protocol.messages import DescribeQuorumResponse
from runtime.active_controller import ActiveController
from runtime.active_controller import describe_quorum_at
from runtime.peer_rpc import RpcError

REQUEST_TIMEOUT_S = 5.0


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

    @property
    def max_follower_lag(self) -> int:
        lags = [v.lag for v in self.voters if v.role != "leader"]
        return max(lags, default=0)


async def _ask(address: tuple[str, int]) -> DescribeQuorumResponse:
    try:
        return await describe_quorum_at(address, "minibroker-metadata-quorum", REQUEST_TIMEOUT_S)
    except RpcError as exc:
        raise ConnectionFailedError(f"controller at {address[0]}:{address[1]}: {exc}") from None


async def describe_quorum(controllers: Sequence[tuple[str, int]]) -> QuorumDescription:
    """The quorum as its active controller sees it (any controller's address will
    do). Raises ConnectionFailedError when no controller answers or none is active."""
    active = ActiveController(controllers, client_id="minibroker-metadata-quorum")
    await active.find()
    if active.leader_id < 0:
        raise ConnectionFailedError(
            f"no active controller known to {', '.join(f'{h}:{p}' for h, p in controllers)} "
            "(an election under way, or not a majority of the voters up)"
        )
    answer = await _ask(active.address)
    if answer.role != "leader":
        raise ConnectionFailedError(
            f"controller {answer.node_id} is no longer the active controller; try again"
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
    )
