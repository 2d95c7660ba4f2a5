"""The controller quorum on a real event loop: `QuorumDriver` gives the sans-I/O voter
(replica.py) its clock, sockets and disk.

- clock: a tick every TICK_S, and after every event the voter is fed;
- sockets: each request the voter puts in its outbox goes to that voter through a
  reconnecting client (runtime/peer_rpc.py), its answer (or its failure) is fed back;
  requests from the other voters arrive through the controller's listener
  (`handle`), a QuorumFetch with nothing new is held until an append, a new high
  watermark or its max wait (the long poll);
- disk: the voter's log journal is replayed on the metadata log (controller/
  metadata_log.py) by one task, in order, each batch fsynced before the voter is told
  it is durable; the quorum state is written (and fsynced) before the voter acts on it.

The application (the controller) appends records on the leader with `append` and
waits for them with `wait_committed`; it learns what became committed, and when this
controller becomes or stops being the leader, through the callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections.abc import Callable
from typing import Any

import msgspec

from controller.metadata_log import MetadataLog
from controller.metadata_log import Recovered
from controller.quorum.quorum_log import QuorumLog
from controller.quorum.quorum_log import Snapshot
from controller.quorum.quorum_state import QuorumStateFile
from controller.quorum.replica import QuorumReplica
from controller.quorum.replica import QuorumSettings
from controller.quorum.replica import Role
from controller.quorum.voting_rights import CATCH_UP
from controller.quorum.voting_rights import start_verdict
from protocol.messages import DescribeQuorumRequest
from protocol.messages import DescribeQuorumResponse
from protocol.messages import Message
from protocol.messages import MetadataEntry
from protocol.messages import QuorumFetchRequest
from protocol.messages import QuorumFetchResponse
from protocol.messages import QuorumVoterState
from protocol.metadata_records import MetadataRecord
from runtime.faults import Faults
from runtime.peer_rpc import RpcClient
from runtime.peer_rpc import RpcError

log = logging.getLogger(__name__)

TICK_S = 0.01
# A follower's long poll: the leader holds an empty QuorumFetch this long at most.
FETCH_MAX_WAIT_MS = 400
# Appends waiting for their commit, at most (a bound, as every queue here).
MAX_COMMIT_WAITERS = 10_000


class NotLeaderError(Exception):
    """This controller is not (or no longer) the quorum leader: the write's outcome is
    unknown, the caller answers NOT_CONTROLLER with the leader it knows."""

    def __init__(self, leader_id: int, epoch: int, address: tuple[str, int] | None = None) -> None:
        where = (
            f"controller {leader_id} at {address[0]}:{address[1]} is"
            if leader_id >= 0 and address is not None
            else "no active controller is known yet"
        )
        super().__init__(f"not the active controller; {where} (quorum epoch {epoch})")
        self.leader_id = leader_id
        self.epoch = epoch


def quorum_log_from(recovered: Recovered) -> QuorumLog:
    """The quorum's view of what `MetadataLog.open` found. Entries and a snapshot a
    single controller wrote before the quorum (epoch -1) are the quorum's epoch 0."""
    snapshot = Snapshot()
    if recovered.snapshot_offset >= 0:
        snapshot = Snapshot(
            recovered.snapshot_offset + 1,
            max(recovered.snapshot_epoch, 0),
            tuple(recovered.snapshot_records),
        )
    entries = [
        e if e.epoch >= 0 else msgspec.structs.replace(e, epoch=0) for e in recovered.entries
    ]
    return QuorumLog(snapshot, entries)


class QuorumDriver:
    def __init__(
        self,
        *,
        node_id: int,
        voters: dict[int, tuple[str, int]],
        cluster_id: str,
        metadata_log: MetadataLog,
        recovered: Recovered,
        state_file: QuorumStateFile,
        settings: QuorumSettings,
        faults: Faults,
        may_vote: bool = True,
        on_committed: Callable[[int], None] = lambda hw: None,
        on_role: Callable[[Role, int, int], None] = lambda role, epoch, leader: None,
        on_fatal: Callable[[str], None] = lambda message: None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.node_id = node_id
        self.metadata_log = metadata_log
        self.state_file = state_file
        self.on_committed = on_committed
        self.on_role = on_role
        self.on_fatal = on_fatal
        self.voters = dict(voters)
        loop = asyncio.get_running_loop()
        self.replica = QuorumReplica(
            node_id,
            tuple(voters),
            cluster_id=cluster_id,
            log=quorum_log_from(recovered),
            state=state_file.read(),
            save_state=state_file.write,
            settings=settings,
            rng=random.Random(),
            now=self._now(),
            may_vote=may_vote,
        )
        self.peers = {
            v: RpcClient(
                host,
                port,
                name=f"controller {v}",
                client_id=f"controller-{node_id}",
                request_timeout_s=(FETCH_MAX_WAIT_MS + settings.fetch_timeout_ms) / 1000,
                connect_timeout_s=settings.fetch_timeout_ms / 1000,
                max_in_flight=16,
                faults=faults,
                peer_id=v,
                tls=tls,  # voters listen as this one does
            )
            for v, (host, port) in voters.items()
            if v != node_id
        }
        self._changed = asyncio.Event()  # an append, a new high watermark, a new role
        self._disk_work = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waiters: dict[int, list[tuple[int, asyncio.Future[None]]]] = {}
        self._waiter_count = 0
        self._seen = (self.replica.role, self.replica.epoch, self.replica.leader_id)
        self._hw = self.replica.high_watermark
        self._end = self.replica.log.end_offset
        self._loop = loop
        self._stopped = False
        self.failed: str | None = None

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time() * 1000

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        self.replica.tick(self._now())  # a quorum of one is its leader from here on
        self._spawn(self._ticker(), "quorum-tick")
        self._spawn(self._disk_writer(), "quorum-disk")
        if not self.replica.may_vote:
            self._spawn(self._first_start_or_lost_disk(), "quorum-bootstrap")
        self._after()

    async def _first_start_or_lost_disk(self) -> None:
        """A voter that may not vote yet (voting_rights.py: no quorum state, or a state
        whose log held entries and an empty log) is a new quorum's voter, or one that
        lost its disk or its log. It asks the others until as many as make a majority,
        itself not counted, have answered: any log among them, and it catches up
        before it votes (replica.py); none, and it votes, in epochs above the highest
        they answered (it may have voted in that one and forgotten it)."""
        replica = self.replica
        had_state = replica.epoch > 0
        while not replica.may_vote and replica.log.end_offset == 0:
            answers = await asyncio.gather(
                *(
                    peer.request(DescribeQuorumRequest(), timeout_s=1.0)
                    for peer in self.peers.values()
                ),
                return_exceptions=True,
            )
            described = [
                (a.leader_epoch, a.log_end_offset)
                for a in answers
                if isinstance(a, DescribeQuorumResponse)
            ]
            verdict = start_verdict(described, replica.majority)
            if verdict == CATCH_UP:
                log.warning(
                    "quorum: %s, and the others have a log: it catches up from them "
                    "before it votes again",
                    "this controller's quorum state says its log held entries and the log "
                    "is empty: its log was lost"
                    if had_state
                    else "this controller has no quorum state: its disk was lost",
                )
                return
            if isinstance(verdict, int):
                log.info(
                    "quorum: %d other voters of %d answered, every log empty: voting in "
                    "epochs above %d",
                    len(described),
                    len(replica.voters),
                    verdict,
                )
                replica.allow_voting(verdict, self._now())
                self._after()
                return
            await asyncio.sleep(0.2)

    def _spawn(self, coro: Any, name: str) -> None:
        task = self._loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self, *, resign: bool = True) -> None:
        """Stop; a leader first tells the others to elect a successor (graceful)."""
        if resign and not self._stopped and self.replica.is_leader:
            self.replica.resign(self._now())
            sends = [
                self.peers[dst].request(req, timeout_s=0.5)
                for dst, req in self.replica.outbox
                if dst in self.peers
            ]
            self.replica.outbox.clear()
            await asyncio.gather(*sends, return_exceptions=True)
        self._stopped = True
        self._fail_waiters()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for peer in self.peers.values():
            await peer.close()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self.replica.tick(self._now())
            self._after()

    # ------------------------------------------------------------------ after every event

    def wake(self) -> None:
        """The voter was changed from outside (a snapshot taken): act on it now."""
        self._after()

    def _after(self) -> None:
        if self._stopped:
            return
        replica = self.replica
        outbox, replica.outbox = replica.outbox, []
        for dst, request in outbox:
            if dst in self.peers:
                self._spawn(self._exchange(dst, request), f"quorum-{type(request).__name__}")
        if replica.log.journal:
            self._disk_work.set()
        seen = (replica.role, replica.epoch, replica.leader_id)
        if seen != self._seen:
            self._seen = seen
            if replica.role is not Role.LEADER:
                self._fail_waiters()
            self._changed.set()
            self.on_role(*seen)
        if replica.high_watermark > self._hw:
            self._hw = replica.high_watermark
            self._release_waiters()
            self._changed.set()
            self.on_committed(self._hw)
        if replica.log.end_offset != self._end:
            # New entries (or a truncation): a follower's long poll answers now.
            self._end = replica.log.end_offset
            self._changed.set()

    async def _exchange(self, dst: int, request: Message) -> None:
        if isinstance(request, QuorumFetchRequest):
            request = msgspec.structs.replace(request, max_wait_ms=FETCH_MAX_WAIT_MS)
        try:
            response = await self.peers[dst].request(request)
        except (RpcError, OSError) as exc:
            log.debug("quorum: %s to controller %d failed: %s", type(request).__name__, dst, exc)
            self.replica.request_failed(dst, request, self._now())
        else:
            problem = self.replica.answer_problem(request, response)
            if problem is None:
                self.replica.handle_response(dst, request, response, self._now())
            else:
                log.error(
                    "quorum: ignored the answer of controller %d at %s to %s: %s; is it a "
                    "voter of this quorum, running this version?",
                    dst,
                    self.peers[dst].peer,
                    type(request).__name__,
                    problem,
                )
                self.replica.request_failed(dst, request, self._now())
        self._after()

    # ------------------------------------------------------------------ requests in

    async def handle(self, src: int, request: Message) -> Message:
        """A quorum request from another voter (the controller's listener)."""
        if isinstance(request, DescribeQuorumRequest):
            return self.describe()
        response = self.replica.handle_request(src, request, self._now())
        self._after()
        if (
            isinstance(request, QuorumFetchRequest)
            and isinstance(response, QuorumFetchResponse)
            and self._worth_waiting(request, response)
        ):
            self._changed.clear()
            wait_s = min(request.max_wait_ms, FETCH_MAX_WAIT_MS) / 1000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._changed.wait()
            response = self.replica.handle_request(src, request, self._now())
            self._after()
        return response

    @staticmethod
    def _worth_waiting(request: QuorumFetchRequest, response: QuorumFetchResponse) -> bool:
        """An empty answer that a long poll may improve: no error, nothing new, no
        divergence, no snapshot to fetch."""
        return (
            request.max_wait_ms > 0
            and response.error_code == 0
            and not response.entries
            and response.snapshot_id is None
            and response.diverging_end_offset < 0
        )

    def describe(self) -> DescribeQuorumResponse:
        replica = self.replica
        now = self._now()
        progress = replica.progress()
        voters = []
        for v in replica.voters:
            host, port = self.voters.get(v, ("", -1))
            state = QuorumVoterState(replica_id=v, host=host, port=port)
            if v == replica.node_id:
                state.log_end_offset, state.last_fetch_ms_ago = replica.log.flushed_end, 0
            elif v in progress and progress[v].end_offset >= 0:
                p = progress[v]
                state.log_end_offset = p.end_offset
                state.last_fetch_ms_ago = int(now - p.last_fetch_ms)
            voters.append(state)
        return DescribeQuorumResponse(
            node_id=replica.node_id,
            role=replica.role.value,
            leader_id=replica.node_id if replica.is_leader else replica.leader_id,
            leader_epoch=replica.epoch,
            high_watermark=replica.high_watermark,
            log_end_offset=replica.log.end_offset,
            voters=voters,
        )

    # ------------------------------------------------------------------ disk

    async def _disk_writer(self) -> None:
        """Replay the voter's journal on the metadata log, one batch at a time, and
        tell the voter what is durable."""
        qlog = self.replica.log
        while True:
            await self._disk_work.wait()
            self._disk_work.clear()
            if not qlog.journal:
                continue
            point = qlog.flush_point()
            ops, qlog.journal = qlog.journal, []
            try:
                for op, arg in ops:
                    await self._write(op, arg)
            except Exception as exc:
                self.failed = f"the metadata log could not be written: {exc}"
                log.error("quorum: %s; this controller stops", self.failed)
                self._fail_waiters()
                self.on_fatal(self.failed)
                return
            self.replica.flushed(point, self._now())
            self._after()

    async def _write(self, op: str, arg: Any) -> None:
        mlog = self.metadata_log
        if op == "append":
            await mlog.append(arg)
        elif op == "truncate":
            await mlog.truncate(arg)
        elif op == "install":
            snap: Snapshot = arg
            await mlog.install(snap.end_offset - 1, list(snap.records), snap.epoch)
        elif op == "compact":
            snap = arg
            await mlog.write_snapshot(snap.end_offset - 1, list(snap.records), snap.epoch)
        else:
            raise ValueError(f"unknown journal entry {op}")

    # ------------------------------------------------------------------ the application

    def not_leader(self) -> NotLeaderError:
        """The error a request only the leader answers gets here, naming the leader."""
        replica = self.replica
        leader = replica.node_id if replica.is_leader else replica.leader_id
        return NotLeaderError(leader, replica.epoch, self.voters.get(leader))

    def append(self, records: list[MetadataRecord]) -> int:
        """Append as the leader; the offset after the last record (commit point)."""
        if not self.replica.is_leader:
            raise NotLeaderError(self.replica.leader_id, self.replica.epoch)
        end = self.replica.append(records, self._now())
        self._after()
        return end

    async def wait_committed(self, end: int, timeout_s: float) -> None:
        """Until the high watermark reaches `end`; NotLeaderError when leadership
        goes first (the records may or may not commit later), TimeoutError after
        `timeout_s`."""
        if self.replica.high_watermark >= end:
            return
        if self._waiter_count >= MAX_COMMIT_WAITERS:
            raise NotLeaderError(self.replica.leader_id, self.replica.epoch)
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiters.setdefault(end, []).append((self.replica.epoch, future))
        self._waiter_count += 1
        async with asyncio.timeout(timeout_s):
            await future

    def _release_waiters(self) -> None:
        hw = self.replica.high_watermark
        for end in [e for e in self._waiters if e <= hw]:
            for _, future in self._waiters.pop(end):
                self._waiter_count -= 1
                if not future.done():
                    future.set_result(None)

    def _fail_waiters(self) -> None:
        error = NotLeaderError(self.replica.leader_id, self.replica.epoch)
        for waiters in self._waiters.values():
            for _, future in waiters:
                if not future.done():
                    future.set_exception(error)
        self._waiters.clear()
        self._waiter_count = 0

    def committed_entries(self, start: int, limit: int) -> list[MetadataEntry]:
        """Committed entries from `start` (at least the log start), about `limit` of
        them: whole changes only."""
        return self.replica.log.read(start, limit, stop=self.replica.high_watermark)
