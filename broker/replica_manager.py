"""The partitions this broker holds, and the data path over them.

- applies the local part of each metadata delta: lead (new epoch in the epoch cache,
  stamped on every append; the follower fetcher lets go of the partition), follow
  (the fetcher reconciles by epoch, then replicates: broker/fetcher.py), go offline,
  stop and delete (only when a record names the replica's topic id), or stop and set
  the replica aside as stray (anything the metadata merely no longer shows);
- Produce with acks 0/1/all (acks=all: NOT_ENOUGH_REPLICAS before the append when the
  ISR is below min.insync.replicas, then a delayed produce answered when the high
  watermark passes the batch, NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank
  below the minimum meanwhile, REQUEST_TIMED_OUT after timeout_ms), Fetch with
  long-poll (consumers below the high watermark, followers up to the LEO; a follower's
  fetch records its progress, may move the high watermark and wakes delayed produces,
  and may expand the ISR), ListOffsets, OffsetsForLeaderEpoch;
- ISR changes through AlterPartition (broker/alter_partition.py, KIP-903): expand on
  a follower's fetch, shrink on a periodic check every replica.lag.time.max.ms / 2;
- background jobs: high-watermark (and recovery point / log start) checkpoints,
  the flush.ms policy, and retention.

The controller channel (our broker epoch, AlterPartition) is attached by the server
with `attach_controller`; until then the broker epoch comes from the metadata image
and AlterPartition goes through a channel of our own.

The broker never decodes a record: storage validates batch headers and CRCs and
stamps offsets and the leader epoch in place; Fetch returns file slices as bytes.
fsync always runs in a worker thread (flush.messages, flush.ms, checkpoints).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from broker.alter_partition import AlterPartitionManager
from broker.alter_partition import SendAlterPartition
from broker.append_path import AppendPath
from broker.background_jobs import BackgroundJobs
from broker.config import BrokerConfig
from broker.controller_channel import ControllerChannel
from broker.delayed import Purgatory
from broker.delayed_requests import log
from broker.faults import NO_FAULTS
from broker.faults import Faults
from broker.fetch_sessions import FetchSessionCache
from broker.fetcher import ClientFactory
from broker.fetcher import FetcherManager
from broker.isr_maintenance import IsrMaintenance
from broker.metadata_image import MetadataImage
from broker.metadata_image import TopicPartition
from broker.partition import Partition
from broker.read_path import ReadPath
from broker.replica_transitions import ReplicaTransitions
from broker.storage.errors import LogDirFailureError
from broker.storage.errors import StorageError
from broker.storage.log import LogConfig
from broker.storage.log_manager import LogManager
from runtime.tasks import cancel_and_wait

# ---------------------------------------------------------------------- delayed ops


# ---------------------------------------------------------------------- the manager


class ReplicaManager(ReplicaTransitions, AppendPath, ReadPath, IsrMaintenance, BackgroundJobs):
    def __init__(
        self,
        config: BrokerConfig,
        log_manager: LogManager,
        image: MetadataImage,
        *,
        base_log_config: LogConfig,
        checkpointed_high_watermarks: dict[TopicPartition, int] | None = None,
        fetcher_client_factory: ClientFactory | None = None,
        send_alter_partition: SendAlterPartition | None = None,
    ) -> None:
        """`fetcher_client_factory` and `send_alter_partition` replace the network
        (tests): connections to leaders, and AlterPartition to the controller."""
        self.config = config
        self.node_id = config.node_id
        self.log_manager = log_manager
        self.image = image
        self.base_log_config = base_log_config
        self.partitions: dict[TopicPartition, Partition] = {}
        self.fetch_purgatory = Purgatory("fetch", max_size=config.max_delayed_operations)
        self.produce_purgatory = Purgatory("produce", max_size=config.max_delayed_operations)
        self.fetch_sessions = FetchSessionCache(
            max_slots=config.max_incremental_fetch_session_cache_slots,
            eviction_ms=config.min_incremental_fetch_session_eviction_ms,
            still_caught_up=self._follower_still_caught_up,
        )
        self._checkpointed_hws = dict(checkpointed_high_watermarks or {})
        self._flush_locks: dict[TopicPartition, asyncio.Lock] = {}
        self._timed_flush: set[TopicPartition] = set()  # partitions with flush.ms set
        self._checkpoint_lock = asyncio.Lock()
        # fsync and checkpoint writes; a few threads so one slow disk op does not
        # hold up the others.
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="broker-io")
        # Leader-epoch checkpoints written off the loop (a new leader's epochs, a
        # follower's first batches of a new epoch): apart, so that none waits behind a
        # segment's fsync, which can take far longer than a checkpoint's.
        self._epoch_writer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="epoch-ckpt")
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # built outside a loop (tests): start_background sets it
            self._loop = None
        self._controller: ControllerChannel | None = None
        self._own_channel: ControllerChannel | None = None  # until one is attached
        # How long an ISR change refused for stale state waits for the metadata log.
        self._refused_isr_timeout_ms = config.request_timeout_ms
        # After INELIGIBLE_REPLICA, the partition waits this long before proposing again.
        self._isr_retry_ms = max(
            config.replica_fetch_backoff_ms, min(1000, config.replica_lag_time_max_ms // 2)
        )
        self._isr_retry_after: dict[TopicPartition, int] = {}
        # Replicas whose log could not be created or opened: (retry at, backoff) in ms.
        self._failed_replicas: dict[TopicPartition, tuple[int, int]] = {}
        self.fetchers = FetcherManager(
            config,
            image,
            broker_epoch=self.broker_epoch,
            notify=self._notify,
            after_append=self._after_follower_append,
            client_factory=fetcher_client_factory,
            epoch_writer=self._epoch_writer,
        )
        self.alter_partitions = AlterPartitionManager(
            node_id=self.node_id,
            broker_epoch=self.broker_epoch,
            send=send_alter_partition or self._send_alter_partition,
        )
        # The data directory's failure once it went offline (log_dir_failure.py): from
        # then on no replica here is served, replicated, checkpointed or deleted.
        self.log_dir_failure: LogDirFailureError | None = None
        log_manager.dir_failure.add_listener(self._log_dir_failed)
        # Called after each leadership change of a partition here (became leader, or
        # stopped leading: follower, offline, deleted) with (partition, is_leader); the
        # offsets coordinator loads / drops its cache on them. Must not raise.
        self.leadership_listeners: list[Callable[[Partition, bool], None]] = []

    # ------------------------------------------------------------------ wiring

    def attach_controller(
        self, controller: ControllerChannel, *, faults: Faults = NO_FAULTS
    ) -> None:
        """Use the server's controller channel for our broker epoch and AlterPartition,
        and its test faults for the connections to leaders. Call it before the first
        metadata is published."""
        self._controller = controller
        self.fetchers.set_faults(faults)

    def broker_epoch(self) -> int:
        """Our broker epoch: the controller channel's, else the metadata image's record
        of our registration (the broker publishes only once it has seen it)."""
        if self._controller is not None:
            return self._controller.broker_epoch
        me = self.image.brokers.get(self.node_id)
        return me.broker_epoch if me is not None else -1

    # ------------------------------------------------------------------ log dir failure

    # ------------------------------------------------------------------ metadata

    def _follower_still_caught_up(self, replica_id: int, tp: TopicPartition, ms: int) -> None:
        p = self.partitions.get(tp)
        if p is not None:
            p.follower_still_caught_up(replica_id, ms)

    def _notify(self, tp: TopicPartition, *, wake_sessions: bool = True) -> None:
        """Something about `tp` changed: waiting produces and fetches look again (the
        follower sessions' waiting fetches only when `wake_sessions`: see `touch`)."""
        self.fetch_purgatory.notify(tp)
        self.produce_purgatory.notify(tp)
        self.fetch_sessions.touch(tp, wake=wake_sessions)

    # ------------------------------------------------------------------ lookups

    # ------------------------------------------------------------------ produce

    # ------------------------------------------------------------------ fetch

    # ------------------------------------------------------------------ ISR

    # ------------------------------------------------------------------ offsets

    # ------------------------------------------------------------------ background

    async def shutdown(self) -> None:
        """Release waiting requests, stop background jobs, write the checkpoints."""
        if self._closed:
            return
        self._closed = True
        # Replication stops first, so no fetched batch lands during the checkpoints.
        await self.fetchers.shutdown()
        await self.alter_partitions.close()
        if self._own_channel is not None:
            await self._own_channel.close()
        self.fetch_purgatory.close()
        self.produce_purgatory.close()
        self.fetch_sessions.clear()
        await cancel_and_wait(self._tasks)
        for lock in list(self._flush_locks.values()):
            async with lock:
                pass
        if self.log_dir_failure is None:
            try:
                await self.checkpoint()
            except (StorageError, OSError) as exc:
                log.error("final checkpoint failed: %s", exc)
        self._executor.shutdown(wait=True)
        self._epoch_writer.shutdown(wait=True)
