"""LogManager: every partition log in one broker data directory.

Data directory layout::

    meta.properties                     node and cluster identity (meta_properties.py)
    .lock                               flock()ed while a broker process uses the dir
    .clean-shutdown                     present only after a clean shutdown
    replication-offset-checkpoint       high watermarks      } checkpoints.py
    recovery-point-offset-checkpoint    recovery points      }
    log-start-offset-checkpoint         log start offsets    }
    <topic>-<partition>/                one log per partition replica (log.py)
    <topic>-<partition>.<uuid hex>-delete/   a log being deleted
    <topic>-<partition>.<uuid hex>-stray/    a replica set aside: never opened or deleted

The clean-shutdown marker is written last by `shutdown()`, after every log is flushed
and every checkpoint written, and is deleted at `startup()`: a crash therefore never
leaves one, and the next startup recovers every log past its recovery point.

Deleting a log renames its directory to `<dir>.<uuid hex>-delete` (one atomic step,
fsynced) and then removes the tree; a crash in between is finished at the next
startup. Other files in the data directory belong to other parts of the broker and
are left alone.

A replica that the cluster metadata does not know (its topic id is not there, or not
assigned to this broker) is never deleted on that inference: `set_aside_as_stray`
renames its directory to `<dir>.<uuid hex>-stray` (Kafka's name for it), and startup
leaves such directories alone, with a WARNING each. Only the operator deletes them.
Both renamed forms keep the whole name within 255 bytes by shortening the topic part,
as Kafka does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from broker.storage.checkpoints import LOG_START_OFFSET_CHECKPOINT
from broker.storage.checkpoints import RECOVERY_POINT_CHECKPOINT
from broker.storage.checkpoints import REPLICATION_OFFSET_CHECKPOINT
from broker.storage.checkpoints import OffsetCheckpointFile
from broker.storage.errors import StorageError
from broker.storage.file_handles import DEFAULT_MAX_OPEN_SEGMENT_FILES
from broker.storage.file_handles import FileHandleCache
from broker.storage.log import Log
from broker.storage.log import LogConfig
from broker.storage.log import TopicPartition
from broker.storage.log_dir_failure import LogDirFailureChannel
from broker.storage.log_loader import DeferredSync
from broker.storage.partition_metadata import read_topic_id
from runtime.fileio import LOCK_FILE
from runtime.fileio import TMP_SUFFIX
from runtime.fileio import DataDirLock
from runtime.fileio import SerialWriter
from runtime.fileio import atomic_write
from runtime.fileio import can_sync_file_system
from runtime.fileio import fsync_directory
from runtime.meta_properties import META_PROPERTIES

logger = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
# What an operator does about a stray replica (one place: startup and set-aside say it).
STRAY_ADVICE = (
    "the cluster metadata does not assign this replica to this broker, so it is out of "
    "service; it is never deleted automatically: check its data (it may be the only "
    "copy of records of a lost or re-created topic), then delete the directory; or, once "
    "the metadata assigns it here again (e.g. the controller's data was restored), stop "
    "the broker and rename it back to <topic>-<partition>"
)
DELETE_DIR_SUFFIX = "-delete"
STRAY_DIR_SUFFIX = "-stray"
_MAX_DIR_NAME = 255

_PARTITION_DIR = re.compile(r"^(?P<topic>[A-Za-z0-9._-]+)-(?P<partition>0|[1-9][0-9]*)$")
_DELETE_DIR = re.compile(r"^.+\.[0-9a-f]{32}" + re.escape(DELETE_DIR_SUFFIX) + "$")
_STRAY_DIR = re.compile(
    r"^(?P<topic>[A-Za-z0-9._-]*)-(?P<partition>0|[1-9][0-9]*)\.[0-9a-f]{32}"
    + re.escape(STRAY_DIR_SUFFIX)
    + "$"
)
_LEGAL_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def aside_dir_name(tp: TopicPartition, suffix: str) -> str:
    """`<topic>-<partition>.<uuid hex><suffix>`, the topic shortened so the name fits
    in 255 bytes (Kafka's logDirNameWithSuffixCappedLength)."""
    topic, partition = tp
    tail = f"-{partition}.{uuid.uuid4().hex}{suffix}"
    return topic[: _MAX_DIR_NAME - len(tail)] + tail


class StrayLog(NamedTuple):
    """A replica directory set aside as stray: what it held, for the operator."""

    path: Path
    topic: str  # as in the directory name (shortened when the name was too long)
    partition: int
    topic_id: str | None  # from its partition.metadata; None if absent or unreadable

    def size_bytes(self) -> int:
        """Bytes of the files in the directory (0 once it is gone)."""
        total = 0
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.path):
                with contextlib.suppress(OSError):
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
        return total


def _in_use(lock: Path) -> StorageError:
    return StorageError(
        f"data directory {lock.parent} is in use by another broker process "
        f"({lock} is locked); stop it or use another directory"
    )


class LogManager:
    """Opens, creates, checkpoints and deletes the logs of one data directory."""

    def __init__(
        self,
        data_dir: Path,
        default_config: LogConfig,
        *,
        max_open_segment_files: int = DEFAULT_MAX_OPEN_SEGMENT_FILES,
    ) -> None:
        self.data_dir = Path(data_dir)
        # Every segment file of every log here is opened through it (file_handles.py).
        self.file_handles = FileHandleCache(max_open_segment_files)
        self.default_config = default_config
        self._logs: dict[TopicPartition, Log] = {}
        # Logs created whose directory entry is not fsynced yet (prepare_new_log).
        self._unsynced: set[TopicPartition] = set()
        self._strays: dict[str, StrayLog] = {}  # by directory name
        self._had_clean_shutdown = False
        self._is_new = False
        self._lock = DataDirLock(self.data_dir, _in_use)
        self._started = False
        # Producer snapshots of segment rolls are written here, off the event loop.
        self._writer: SerialWriter | None = None
        self._hw_checkpoint = OffsetCheckpointFile(self.data_dir / REPLICATION_OFFSET_CHECKPOINT)
        self._recovery_checkpoint = OffsetCheckpointFile(self.data_dir / RECOVERY_POINT_CHECKPOINT)
        self._log_start_checkpoint = OffsetCheckpointFile(
            self.data_dir / LOG_START_OFFSET_CHECKPOINT
        )
        # Offline after the first failed file operation (log_dir_failure.py).
        self.dir_failure = LogDirFailureChannel(self.data_dir)

    @property
    def had_clean_shutdown(self) -> bool:
        """Whether the previous process stopped through `shutdown()`."""
        return self._had_clean_shutdown

    @property
    def shutdown_description(self) -> str:
        """How the previous process ended, for the startup log lines."""
        if self._is_new:
            return "(a new, empty data directory)"
        return f"after a{' clean' if self._had_clean_shutdown else 'n unclean'} shutdown"

    @property
    def is_new(self) -> bool:
        """Whether the directory held no logs nor checkpoints at startup (a first start:
        no shutdown to call clean or unclean)."""
        return self._is_new

    def startup(self) -> set[TopicPartition]:
        """Lock the directory, consume the clean-shutdown marker, finish interrupted
        deletions and open (recovering if needed) every log. Returns the partitions found.
        CorruptCheckpointError if a checkpoint file does not parse."""
        assert not self._started, "startup() called twice"
        # meta.properties is written before the logs are loaded; the lock is ours.
        self._is_new = not self.data_dir.exists() or all(
            name in (META_PROPERTIES, LOCK_FILE) for name in os.listdir(self.data_dir)
        )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        self._writer = SerialWriter(f"storage-writer {self.data_dir.name}")
        try:
            return self._load_logs()
        except BaseException:
            self.close()
            raise

    def _load_logs(self) -> set[TopicPartition]:
        marker = self.data_dir / CLEAN_SHUTDOWN_FILE
        self._had_clean_shutdown = marker.exists()
        if self._had_clean_shutdown:
            # Gone before anything else happens: a crash from now on is unclean.
            marker.unlink()
            fsync_directory(self.data_dir)
        recovery_points = self._recovery_checkpoint.read()
        log_starts = self._log_start_checkpoint.read()
        self._hw_checkpoint.read()  # refuse a corrupt one now rather than later
        logger.info(
            "Loading logs from %s %s",
            self.data_dir,
            self.shutdown_description,
        )
        found: set[TopicPartition] = set()
        # What recovery changes is made durable by one syncfs after the last log, not
        # by a fsync per file (4 per recovered log), where syncfs reports disk errors.
        deferred = DeferredSync(self.data_dir) if can_sync_file_system() else None
        for entry in sorted(os.scandir(self.data_dir), key=lambda e: e.name):
            if entry.is_file() and entry.name.endswith(TMP_SUFFIX):
                os.unlink(entry.path)  # an interrupted atomic_write
                continue
            if not entry.is_dir():
                continue
            if _DELETE_DIR.match(entry.name):
                logger.info("Finishing the interrupted deletion of %s", entry.path)
                shutil.rmtree(entry.path)
                continue
            stray = _STRAY_DIR.match(entry.name)
            if stray is not None:
                found_stray = self._remember_stray(
                    Path(entry.path), (stray["topic"], int(stray["partition"]))
                )
                logger.warning(
                    "Stray replica %s (topic id %s) is kept aside, not loaded: %s",
                    entry.path,
                    found_stray.topic_id or "unknown",
                    STRAY_ADVICE,
                )
                continue
            match = _PARTITION_DIR.match(entry.name)
            if match is None:
                logger.warning("Ignoring directory %s: not <topic>-<partition>", entry.path)
                continue
            tp = (match["topic"], int(match["partition"]))
            self._logs[tp] = Log.open(
                Path(entry.path),
                self.default_config,
                recovery_point=recovery_points.get(tp, 0),
                log_start_offset=log_starts.get(tp, 0),
                had_clean_shutdown=self._had_clean_shutdown,
                writer=self._writer,
                dir_failure=self.dir_failure,
                handles=self.file_handles,
                deferred_sync=deferred,
            )
            found.add(tp)
        if deferred is not None:
            deferred.run()  # before any recovery point past it is checkpointed
        self._started = True
        # Recovery moved recovery points forward; record them before anything else.
        self.checkpoint_recovery_points_and_log_starts()
        return found

    # ------------------------------------------------------------------ logs

    def get_log(self, tp: TopicPartition) -> Log | None:
        return self._logs.get(tp)

    def prepare_new_log(self, tp: TopicPartition, config: LogConfig) -> bool:
        """Create the log of `tp` if it has no directory yet, leaving the fsync of its
        directory entry to `sync_new_logs`, which must run before the log is used: a
        metadata delta of 10,000 new replicas makes them durable with one fsync of the
        data directory, not one each. True if created; a log that cannot be created is
        left for `get_or_create_log`, which says why."""
        if tp in self._logs or (self.data_dir / f"{tp[0]}-{tp[1]}").exists():
            return False
        try:
            self._create_log(tp, config)
        except (StorageError, OSError, ValueError):
            return False
        return True

    def sync_new_logs(self) -> None:
        """Make the directory entries of the logs `prepare_new_log` created durable.
        If it fails, `get_or_create_log` tries again for each before handing it out."""
        if not self._unsynced:
            return
        with self.dir_failure.guard("making new log directories durable"):
            fsync_directory(self.data_dir)
        self._unsynced.clear()

    def get_or_create_log(self, tp: TopicPartition, config: LogConfig | None = None) -> Log:
        """The log of `tp`, created empty if absent; `config` replaces its settings.
        The directory entry of a log it hands out is durable."""
        self._check_started()
        log = self._logs.get(tp)
        if log is None:
            log = self._create_log(tp, config)
        elif config is not None:
            log.update_config(config)
        if tp in self._unsynced:
            with self.dir_failure.guard(f"creating the log of {tp[0]}-{tp[1]}"):
                fsync_directory(self.data_dir)  # the new directory entry survives a crash
            self._unsynced.discard(tp)
        return log

    def _create_log(self, tp: TopicPartition, config: LogConfig | None) -> Log:
        """Open a log of `tp` not known yet (new, or a directory that appeared since
        startup) and register it, its directory entry not yet fsynced (`_unsynced`)."""
        topic, partition = tp
        if not _LEGAL_TOPIC.match(topic) or topic in (".", ".."):
            raise ValueError(
                f"illegal topic name {topic!r}: use 1 to 249 of [A-Za-z0-9._-], not '.' or '..'"
            )
        if partition < 0:
            raise ValueError(f"illegal partition {partition} for topic {topic!r}")
        dir = self.data_dir / f"{topic}-{partition}"
        with self.dir_failure.guard(f"creating the log of {topic}-{partition}"):
            # A directory that appeared since startup was never recovered: unclean.
            log = Log.open(
                dir,
                config or self.default_config,
                had_clean_shutdown=not dir.exists(),
                writer=self._writer,
                dir_failure=self.dir_failure,
                handles=self.file_handles,
            )
        self._logs[tp] = log
        self._unsynced.add(tp)
        logger.info("Created log for partition %s-%d in %s", topic, partition, dir)
        return log

    def all_logs(self) -> list[Log]:
        return list(self._logs.values())

    def stray_logs(self) -> list[StrayLog]:
        """Replica directories set aside as stray (at startup or since), by name."""
        return [self._strays[name] for name in sorted(self._strays)]

    def set_aside_as_stray(self, tp: TopicPartition) -> StrayLog | None:
        """Flush and close the log of `tp` and rename its directory to
        `<dir>.<uuid hex>-stray`: out of service, its data kept. None if no log."""
        self._check_started()
        log = self._logs.get(tp)
        if log is None:
            return None
        log.flush()
        log.close()
        del self._logs[tp]
        self._unsynced.discard(tp)
        aside = log.dir.with_name(aside_dir_name(tp, STRAY_DIR_SUFFIX))
        with self.dir_failure.guard(f"setting aside the log of {tp[0]}-{tp[1]}"):
            os.rename(log.dir, aside)
            fsync_directory(self.data_dir)
        # A partition created again under the same name must not inherit these offsets.
        self.checkpoint_recovery_points_and_log_starts()
        return self._remember_stray(aside, tp)

    def _remember_stray(self, path: Path, tp: TopicPartition) -> StrayLog:
        try:
            topic_id = read_topic_id(path)
        except StorageError:
            topic_id = None
        stray = StrayLog(path=path, topic=tp[0], partition=tp[1], topic_id=topic_id)
        self._strays[path.name] = stray
        return stray

    def delete_log(self, tp: TopicPartition) -> bool:
        """Remove the log of `tp` from disk; returns whether there was one."""
        self._check_started()
        self.dir_failure.check()
        log = self._logs.pop(tp, None)
        self._unsynced.discard(tp)
        if log is None:
            return False
        log.close(snapshot=False)
        doomed = log.dir.with_name(aside_dir_name(tp, DELETE_DIR_SUFFIX))
        with self.dir_failure.guard(f"deleting the log of {tp[0]}-{tp[1]}"):
            os.rename(log.dir, doomed)
            fsync_directory(self.data_dir)
        # A partition created again under the same name must not inherit these offsets.
        self.checkpoint_recovery_points_and_log_starts()
        if self._writer is not None:
            # Removing the files can take long (a big log): the writer thread does it.
            # Safe to leave unfinished: startup finishes any renamed `.delete` directory.
            self._writer.submit(shutil.rmtree, doomed, True)
        else:
            shutil.rmtree(doomed)
        logger.info("Deleted log for partition %s-%d", *tp)
        return True

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_high_watermarks(self, high_watermarks: Mapping[TopicPartition, int]) -> None:
        """Write exactly these high watermarks to `replication-offset-checkpoint`."""
        with self.dir_failure.guard("the high-watermark checkpoint"):
            self._hw_checkpoint.write(high_watermarks)

    def read_high_watermarks(self) -> dict[TopicPartition, int]:
        return self._hw_checkpoint.read()

    def checkpoint_recovery_points_and_log_starts(self) -> None:
        logs = list(self._logs.items())
        with self.dir_failure.guard("the recovery-point checkpoint"):
            self._recovery_checkpoint.write({tp: log.recovery_point for tp, log in logs})
        with self.dir_failure.guard("the log-start-offset checkpoint"):
            self._log_start_checkpoint.write({tp: log.log_start_offset for tp, log in logs})

    # ------------------------------------------------------------------ lifecycle

    def shutdown(self) -> None:
        """Flush every log, write the checkpoints, close, and only then write the
        clean-shutdown marker. Checkpoint high watermarks before calling this.

        With the directory offline nothing is written: the logs are closed as after a
        crash, so the next start recovers them from their recovery points."""
        self._check_started()
        if self.dir_failure.failure is not None:
            logger.warning(
                "Log directory %s is offline: closing its %d log(s) without flushing, "
                "checkpoints or the clean-shutdown marker (the next start recovers them)",
                self.data_dir,
                len(self._logs),
            )
            self.close()
            return
        for log in self._logs.values():
            log.flush()
        self.checkpoint_recovery_points_and_log_starts()
        for log in self._logs.values():
            log.close()
        self._close_writer()
        atomic_write(self.data_dir / CLEAN_SHUTDOWN_FILE, b"")  # fsyncs the directory
        logger.info("Shut down %d log(s) in %s cleanly", len(self._logs), self.data_dir)
        self._logs.clear()
        self._started = False
        self._lock.release()

    def close(self) -> None:
        """Close every log and release the directory WITHOUT flushing, checkpointing or
        marking the shutdown clean (a fatal error; tests use it to simulate a crash)."""
        for log in self._logs.values():
            log.close(snapshot=False)
        self._close_writer()
        self._logs.clear()
        self._started = False
        self._lock.release()

    def wait_for_background_writes(self) -> None:
        """Block until the snapshots and directory removals queued so far are done."""
        if self._writer is not None:
            self._writer.drain()

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _check_started(self) -> None:
        if not self._started:
            raise StorageError(f"log manager for {self.data_dir} is not started")
