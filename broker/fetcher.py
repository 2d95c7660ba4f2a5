"""The follower fetcher: replicates the partitions this broker follows from their
leaders, in the manner of Kafka's ReplicaFetcherManager / AbstractFetcherThread.

One `SourceFetcher` task per leader broker (its address from the metadata image,
the listener with the name of our own first listener), each with one RpcClient
connection and ONE Fetch request for all the partitions it follows from that leader
(replica_id = our node id, replica_epoch = our broker epoch, per partition
current_leader_epoch, fetch_offset = LEO, last_fetched_epoch = the latest epoch of
our epoch cache, log_start_offset).

Each partition moves through two phases:

- TRUNCATING, on becoming follower at epoch E (and whenever the leader or the epoch
  changes): OffsetsForLeaderEpoch(current_leader_epoch=E, leader_epoch=our latest
  epoch), then truncate log and epoch cache as `offset_truncation_state` says
  (Kafka's getOffsetTruncationState: to min(our LEO, the leader's end offset) when
  the leader knows our epoch; when it answers an older epoch, truncate to our end
  of that epoch and ask again with the next lower epoch we have, until the largest
  common epoch: KIP-101 / KIP-279). A log without epochs is empty: nothing to do.
- FETCHING: append the leader's batches as they are (append_as_follower), then apply
  the leader's high watermark as min(leader HW, our LEO), never backwards. A
  diverging_epoch answer truncates the same way (KIP-595 style) before going on.

Never to the high watermark: except with the test-only switch
`unsafe_truncate_to_high_watermark`, which restores pre-KIP-101 behaviour (truncate
to the checkpointed HW on becoming follower, no OffsetsForLeaderEpoch, no
last_fetched_epoch, and the leader's LEO on an out-of-range answer), logged loudly.

Errors: FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER and the
like back the partition off (replica_fetch_backoff_ms with jitter) and retry; the
metadata log brings the new state. OFFSET_OUT_OF_RANGE below the leader's log start
restarts the log empty at the leader's log start (Kafka's rule); above the leader's
LEO it cannot happen after epoch truncation, so it is logged as an error and the
partition reconciles again, and if that does not help Kafka's last resort applies
(ListOffsets: truncate to the leader's LEO). Connection failures back the whole
source off; the RpcClient reconnects. Everything is bounded: request timeouts, one
request in flight per source, backoffs, truncation rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import random
from collections.abc import Awaitable
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING

from broker.faults import NO_FAULTS
from broker.faults import Faults
from broker.fetch_sessions import NO_SESSION
from broker.fetch_state import IDLE_WAKE_S
from broker.fetch_state import MAX_BACKOFF_FACTOR
from broker.fetch_state import Client
from broker.fetch_state import ClientFactory
from broker.fetch_state import PartitionFetchState
from broker.fetch_state import Phase
from broker.fetch_state import TopicPartition
from broker.follower_fetch_session import FollowerFetchSession
from broker.follower_truncation import FollowerTruncation
from broker.partition import Partition
from broker.partition import Role
from broker.storage.errors import InvalidAppendError
from broker.storage.errors import StorageError
from protocol.errors import ErrorCode
from protocol.messages import FetchPartition
from protocol.messages import FetchPartitionResponse
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from runtime import hop_trace
from runtime.epoch_lineage import impossible_epoch_answer
from runtime.epoch_lineage import offset_truncation_state
from runtime.peer_rpc import RpcClient
from runtime.peer_rpc import RpcError
from runtime.tls_settings import outgoing_tls

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.metadata_image import MetadataImage

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- the rule


# ---------------------------------------------------------------------- per partition


# ---------------------------------------------------------------------- the manager


class FetcherManager:
    """Which partitions follow which leader; one SourceFetcher per leader address."""

    def __init__(
        self,
        config: BrokerConfig,
        image: MetadataImage,
        *,
        broker_epoch: Callable[[], int],
        notify: Callable[[TopicPartition], None] = lambda tp: None,
        after_append: Callable[[Partition], Awaitable[None]] | None = None,
        client_factory: ClientFactory | None = None,
        faults: Faults = NO_FAULTS,
        epoch_writer: Executor | None = None,
    ) -> None:
        self.config = config
        # Where the checkpoints of new leader epochs are written before their batches
        # are appended (None: on the loop, by the append).
        self.epoch_writer = epoch_writer
        self.node_id = config.node_id
        self.image = image
        self.broker_epoch = broker_epoch
        self.notify = notify
        self.after_append = after_append
        self.faults = faults
        self._client_factory = client_factory or self._rpc_client
        self._listener_name = config.listeners[0].name if config.listeners else "PLAINTEXT"
        # Read once (the start checked it can be): a password file that goes away later
        # does not stop new fetchers.
        self._sasl = config.inter_broker_sasl()
        self.sources: dict[tuple[int, str, int], SourceFetcher] = {}
        # Followers whose leader has no known address yet (retried on broker changes).
        self._unresolved: dict[TopicPartition, Partition] = {}
        self._started = False
        self._closed = False
        if config.unsafe_truncate_to_high_watermark:
            log.warning(
                "UNSAFE TEST SWITCH: followers truncate to their high watermark instead of "
                "reconciling by leader epoch (pre-KIP-101); acknowledged records can be lost"
            )

    def set_faults(self, faults: Faults) -> None:
        """Test faults for connections made from now on."""
        self.faults = faults

    def _rpc_client(self, leader_id: int, host: str, port: int) -> Client:
        return RpcClient(
            host,
            port,
            name=f"broker {leader_id}",
            client_id=f"broker-{self.node_id}-fetcher",
            request_timeout_s=self.config.request_timeout_ms / 1000,
            connect_timeout_s=min(5.0, self.config.request_timeout_ms / 1000),
            faults=self.faults,
            peer_id=leader_id,
            # Brokers replicate over the first listener, with its security protocol.
            tls=outgoing_tls(self.config, self.config.inter_broker_protocol),
            sasl=self._sasl,  # the first listener may be SASL
        )

    def _address(self, leader_id: int) -> tuple[str, int] | None:
        broker = self.image.brokers.get(leader_id)
        if broker is None or not broker.listeners:
            return None
        listener = broker.listener(self._listener_name) or broker.listeners[0]
        return listener.host, listener.port

    # ------------------------------------------------------------------ membership

    def add_partition(self, p: Partition) -> None:
        """(Re)start following `p.leader_id` at `p.leader_epoch`: TRUNCATING first."""
        self.remove_partition(p.tp)
        address = self._address(p.leader_id)
        if address is None:
            log.warning(
                "%s: leader %d has no known address yet; will fetch once it is registered",
                p.name,
                p.leader_id,
            )
            self._unresolved[p.tp] = p
            return
        key = (p.leader_id, *address)
        source = self.sources.get(key)
        if source is None:
            client = self._client_factory(p.leader_id, *address)
            source = self.sources[key] = SourceFetcher(self, p.leader_id, address, client)
            if self._started:
                source.start()
        source.add(PartitionFetchState(p, p.leader_id, p.leader_epoch))

    def remove_partition(self, tp: TopicPartition) -> None:
        self._unresolved.pop(tp, None)
        for key, source in list(self.sources.items()):
            if source.remove(tp) and not source.states:
                # An idle source goes away (its task may be stuck on a dead leader).
                del self.sources[key]
                source.stop()

    def on_brokers_changed(self) -> None:
        for tp, p in list(self._unresolved.items()):
            if p.role is Role.FOLLOWER and self._address(p.leader_id) is not None:
                self.add_partition(p)
            elif p.role is not Role.FOLLOWER:
                del self._unresolved[tp]

    def state_of(self, tp: TopicPartition) -> PartitionFetchState | None:
        for source in self.sources.values():
            state = source.states.get(tp)
            if state is not None:
                return state
        return None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._started or self._closed:
            return
        self._started = True
        for source in self.sources.values():
            source.start()

    async def shutdown(self) -> None:
        self._closed = True
        sources = list(self.sources.values())
        self.sources.clear()
        self._unresolved.clear()
        for source in sources:
            source.stop()
        for source in sources:
            await source.wait_stopped()


class SourceFetcher(FollowerTruncation):
    """The partitions followed from one leader, and the task that replicates them."""

    def __init__(
        self,
        manager: FetcherManager,
        leader_id: int,
        address: tuple[str, int],
        client: Client,
    ) -> None:
        self.manager = manager
        self.config = manager.config
        self.leader_id = leader_id
        self.address = address
        self.client = client
        self.states: dict[TopicPartition, PartitionFetchState] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._failures = 0
        # KIP-227: the leader is told only what changed, and nothing here walks every
        # partition per fetch: a partition whose state may have changed is touched,
        # and only touched ones are looked at again (`_refresh`).
        self.session = FollowerFetchSession()
        self._touched: dict[TopicPartition, None] = {}
        self._fetching: dict[TopicPartition, PartitionFetchState] = {}  # ready to fetch
        self._truncating: dict[TopicPartition, PartitionFetchState] = {}
        self._backoffs: list[tuple[float, int, TopicPartition]] = []  # heap: ready at
        self._backoff_seq = itertools.count()
        cfg = self.config
        self.backoff_s = max(0.001, cfg.replica_fetch_backoff_ms / 1000)
        self.unsafe_hw = cfg.unsafe_truncate_to_high_watermark
        # A Fetch long-polls up to replica_fetch_wait_max_ms: wait that plus a margin,
        # so a leader that stopped answering is noticed in seconds, not minutes.
        self.fetch_timeout_s = cfg.replica_fetch_wait_max_ms / 1000 + min(
            10.0, cfg.request_timeout_ms / 1000
        )
        self.rpc_timeout_s = min(30.0, cfg.request_timeout_ms / 1000)

    @property
    def name(self) -> str:
        return f"fetcher to broker {self.leader_id} at {self.address[0]}:{self.address[1]}"

    def add(self, state: PartitionFetchState) -> None:
        self.states[state.tp] = state
        self._touch(state.tp)
        self._wake.set()

    def remove(self, tp: TopicPartition) -> bool:
        self._touch(tp)
        return self.states.pop(tp, None) is not None

    def _touch(self, tp: TopicPartition) -> None:
        self._touched[tp] = None

    def _refresh(self, now: float) -> None:
        """Sort the touched partitions (and those whose backoff ended) into truncating,
        fetching (their position goes to the session) or waiting."""
        backoffs = self._backoffs
        while backoffs and backoffs[0][0] <= now:
            self._touch(heapq.heappop(backoffs)[2])
        touched, self._touched = self._touched, {}
        for tp in touched:
            self._fetching.pop(tp, None)
            self._truncating.pop(tp, None)
            s = self.states.get(tp)
            if s is None or not s.still_valid():
                if s is not None:
                    del self.states[tp]
                self.session.drop(tp)
            elif s.phase is Phase.TRUNCATING:
                self._truncating[tp] = s
                self.session.drop(tp)
            elif s.ready_at > now:
                heapq.heappush(backoffs, (s.ready_at, next(self._backoff_seq), tp))
                self.session.drop(tp)
            else:
                self._fetching[tp] = s
                self.session.set(tp, self._position(s))

    def _position(self, s: PartitionFetchState) -> FetchPartition:
        p = s.partition
        return FetchPartition(
            partition=p.index,
            current_leader_epoch=s.leader_epoch,
            fetch_offset=p.log_end_offset,
            last_fetched_epoch=-1 if self.unsafe_hw else p.log.latest_epoch,
            log_start_offset=p.log_start_offset,
            partition_max_bytes=self.config.replica_fetch_max_bytes,
        )

    def start(self) -> None:
        if self._task is None and not self._stopped:
            self._task = asyncio.create_task(self._run(), name=self.name)

    def stop(self) -> None:
        """Cancel the task; it closes the connection on its way out. A source that
        never started never connected (RpcClient connects on the first request)."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()

    async def wait_stopped(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._stopped:
                now = loop.time()
                self._refresh(now)
                truncating = [s for s in self._truncating.values() if s.ready_at <= now]
                try:
                    if truncating:
                        try:
                            await self._truncate(truncating)
                        finally:
                            for s in truncating:
                                self._touch(s.tp)
                    elif self._fetching:
                        await self._fetch()
                    else:
                        await self._idle(now)
                        continue
                    self._failures = 0
                    # Let the loop run even when the leader answered without waiting
                    # (e.g. a leader shutting down answers every long-poll at once).
                    await asyncio.sleep(0)
                except RpcError as exc:
                    self._failures += 1
                    if self._failures in (1, 10) or self._failures % 100 == 0:
                        log.warning(
                            "%s: %s (%d in a row); backing off", self.name, exc, self._failures
                        )
                    await asyncio.sleep(self._backoff(self._failures))
                except (StorageError, OSError) as exc:
                    log.error("%s: storage error: %s; backing off", self.name, exc)
                    await asyncio.sleep(self._backoff(MAX_BACKOFF_FACTOR))
                except Exception:
                    # A bug (or a broken invariant): loud, but replication goes on.
                    log.exception("%s: unexpected failure; backing off", self.name)
                    await asyncio.sleep(self._backoff(MAX_BACKOFF_FACTOR))
        except asyncio.CancelledError:
            pass
        finally:
            await self.client.close()

    async def _idle(self, now: float) -> None:
        self._wake.clear()
        if self._touched:
            return
        waits = [s.ready_at for s in self._truncating.values()]
        if self._backoffs:
            waits.append(self._backoffs[0][0])
        next_at = min(waits, default=now + IDLE_WAKE_S)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(IDLE_WAKE_S, max(0.0, next_at - now))):
                await self._wake.wait()

    def _backoff(self, failures: int) -> float:
        factor = min(MAX_BACKOFF_FACTOR, 2 ** max(0, failures - 1))
        return self.backoff_s * factor * random.uniform(0.8, 1.2)

    def _back_off(self, state: PartitionFetchState, why: str) -> None:
        state.failures += 1
        state.ready_at = asyncio.get_running_loop().time() + self._backoff(state.failures)
        self._touch(state.tp)
        if state.failures in (1, 10) or state.failures % 100 == 0:  # not every retry
            log.info(
                "%s: fetch from broker %d at leader epoch %d: %s (%d in a row); backing off",
                state.partition.name,
                self.leader_id,
                state.leader_epoch,
                why,
                state.failures,
            )

    def _prune(self, state: PartitionFetchState) -> None:
        """Forget a state whose partition no longer follows this leader at its epoch
        (the replica manager re-adds the partition when it follows again)."""
        if self.states.get(state.tp) is state:
            del self.states[state.tp]
            self._touch(state.tp)

    def _current(self, state: PartitionFetchState) -> bool:
        """`state` is still this source's state for its partition, and valid."""
        return self.states.get(state.tp) is state and state.still_valid()

    # ------------------------------------------------------------------ truncation

    # ------------------------------------------------------------------ fetching

    async def _fetch(self) -> None:
        """One Fetch for the ready partitions: in a session, naming only those whose
        position changed; the answer is applied partition by partition."""
        cfg = self.config
        session = self.session.request()
        request = FetchRequest(
            replica_id=self.manager.node_id,
            replica_epoch=self.manager.broker_epoch(),
            max_wait_ms=cfg.replica_fetch_wait_max_ms,
            min_bytes=1,
            max_bytes=cfg.replica_fetch_response_max_bytes,
            topics=session.topics,
            session_id=session.session_id,
            session_epoch=session.session_epoch,
            forgotten=session.forgotten,
        )
        try:
            resp = await self.client.request(request, timeout_s=self.fetch_timeout_s)
        except BaseException:
            self.session.reset()  # the leader may or may not have served it
            raise
        assert isinstance(resp, FetchResponse)
        code = ErrorCode.of(resp.error_code)
        if code in (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH):
            # The leader restarted or dropped the session: the next fetch is full.
            log.info(
                "%s: fetch session %d: %s; opening a new one",
                self.name,
                session.session_id,
                code.name,
            )
            self.session.reset()
            return
        if code != ErrorCode.NONE:
            self.session.reset()
            for s in list(self._fetching.values()):
                self._back_off(s, f"Fetch answered {code.name}")
            return
        positions = self.session.answered(resp.session_id)
        sessionless = resp.session_id == NO_SESSION
        await self._write_new_epochs_first(resp, positions)
        seen: set[TopicPartition] = set()
        reset: list[PartitionFetchState] = []
        for topic in resp.responses:
            for r in topic.partitions:
                tp = (topic.topic, r.partition_index)
                position = positions.get(tp)
                s = self.states.get(tp)
                if position is None or s is None:
                    continue
                seen.add(tp)
                fetch_offset = position.fetch_offset
                self._touch(tp)  # its position may change, or it backs off
                if r.error_code:
                    self.session.unsend(tp)
                if not self._answer_applies(s, position):
                    continue  # the partition moved on while the fetch was out
                if r.records:
                    # Kafka's fairness: who got data goes to the back, so a partition
                    # whose next batch is larger than its share gets the "at least
                    # one batch" turn (KIP-74) soon.
                    self.states[tp] = self.states.pop(tp)
                if await self._process_partition(s, fetch_offset, r):
                    reset.append(s)
        if sessionless:
            # A full answer names every partition; in a session, silence is "no news".
            for tp in positions.keys() - seen:
                s = self.states.get(tp)
                if s is not None and self._current(s):
                    self._back_off(s, "no Fetch answer for the partition")
        if reset:
            try:
                await self._reset_to_leader_end(reset)
            finally:
                for s in reset:
                    self._touch(s.tp)

    def _answer_applies(self, s: PartitionFetchState, position: FetchPartition) -> bool:
        """The partition is where it was when the fetch went out."""
        return (
            self._current(s)
            and s.phase is Phase.FETCHING
            and s.leader_epoch == position.current_leader_epoch
            and s.partition.log_end_offset == position.fetch_offset
        )

    async def _write_new_epochs_first(
        self, resp: FetchResponse, positions: dict[TopicPartition, FetchPartition]
    ) -> None:
        """The partitions whose answer starts a new leader epoch have its checkpoint
        written on the epoch writer's threads, all at once, before any is appended:
        the appends then find it on disk, and the event loop pays no fsync pair per
        partition (a broker following thousands of partitions through a failover).
        What changed meanwhile is caught by the appends, which settle every write."""
        executor = self.manager.epoch_writer
        if executor is None:
            return
        writes: list[asyncio.Future[None]] = []
        for topic in resp.responses:
            for r in topic.partitions:
                diverging = r.diverging_epoch
                if r.error_code or not r.records or diverging.epoch >= 0:
                    continue
                tp = (topic.topic, r.partition_index)
                position = positions.get(tp)
                s = self.states.get(tp)
                if position is None or s is None or not self._answer_applies(s, position):
                    continue
                future = s.partition.log.learn_epochs_ahead(
                    r.records, executor, max_epoch=s.leader_epoch
                )
                if future is not None:
                    writes.append(asyncio.wrap_future(future))
        if writes:
            await asyncio.gather(*writes, return_exceptions=True)

    async def _process_partition(
        self, s: PartitionFetchState, fetch_offset: int, r: FetchPartitionResponse
    ) -> bool:
        """Apply one partition's Fetch answer. True when it needs Kafka's out-of-range
        last resort (ListOffsets to the leader)."""
        p = s.partition
        code = ErrorCode.of(r.error_code)
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            return self._out_of_range(s, fetch_offset, r)
        if code != ErrorCode.NONE:
            self._back_off(s, code.name)
            return False
        diverging = r.diverging_epoch
        # A divergence names an epoch (Kafka's FetchResponse.isDivergingEpoch): an end
        # offset without one is no leader's answer, nothing to truncate by.
        if not self.unsafe_hw and diverging.epoch >= 0:
            impossible = impossible_epoch_answer(diverging.epoch, diverging.end_offset)
            if impossible is not None:
                self._back_off(s, f"diverging epoch: {impossible}")
                return False
            log.info(
                "%s: leader %d reports our log diverges after epoch %d offset %d (fetch offset "
                "%d, our latest epoch %d)",
                p.name,
                self.leader_id,
                diverging.epoch,
                diverging.end_offset,
                fetch_offset,
                p.log.latest_epoch,
            )
            leo = p.log_end_offset
            decision = offset_truncation_state(
                diverging.epoch,
                diverging.end_offset,
                follower_end_offset_for=lambda e: p.log.epoch_cache.end_offset_for(e, leo),
                follower_leo=leo,
                fetch_offset=fetch_offset,
            )
            # Not complete: the next Fetch carries our new latest epoch and the leader
            # answers again (KIP-595), as Kafka's fetcher does.
            p.truncate_to(decision.offset, reason=f"diverging epoch from leader {self.leader_id}")
            self.manager.notify(p.tp)
            return False
        s.failures = 0
        s.out_of_range = 0
        if r.records:
            tracer = hop_trace.TRACER
            if tracer is not None:
                tracer.stamp_batches("follower.fetched", p.topic, p.index, r.records)
            try:
                info = p.append_as_follower(r.records)
            except InvalidAppendError as exc:
                log.error("%s: cannot append the leader's batches: %s", p.name, exc)
                self._back_off(s, "invalid batches")
                return False
            if tracer is not None and info.batch_count:
                first, last = info.first_offset, info.last_offset
                tracer.stamp("follower.append", p.topic, p.index, first, last)
            after = self.manager.after_append
            if after is not None:
                await after(p)
                if not self._current(s):
                    return False
        if r.high_watermark >= 0:
            p.update_follower_high_watermark(r.high_watermark)
        self.manager.notify(p.tp)
        return False
