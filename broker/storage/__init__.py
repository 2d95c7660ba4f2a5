"""The storage engine: partition logs on local disk (DESIGN section 6).

Modules, one job each (the owner of an on-disk format documents it at its top):

- segment.py          a segment: `.log` file of record batches
- offset_index.py     its `.index` (offset -> position)
- time_index.py       its `.timeindex` (timestamp -> offset)
- file_handles.py     the bounded cache of open segment files (descriptors)
- epoch_cache.py      `leader-epoch-checkpoint` and the leader epoch cache (KIP-101;
                      its rules: runtime/epoch_lineage.py)
- log_loader.py       loading and crash recovery of a partition directory
- log.py              the log of one partition replica: append, read, truncate, retention
- checkpoints.py      broker-wide offset checkpoint files
- meta_properties.py  the broker's claim on `meta.properties` (format: runtime/)
- partition_metadata.py  `partition.metadata`, the topic id of a partition directory
- log_manager.py      every log of a data directory, clean-shutdown marker
- errors.py           the exceptions

The durable write primitives (write_all, fsync_directory, atomic_write, the
directory lock) are runtime/fileio.py, shared with the controller.

The broker never decodes a record: storage reads and writes whole batches and looks
only at their headers.
"""

from broker.storage.epoch_cache import EpochEntry
from broker.storage.epoch_cache import LeaderEpochFileCache
from broker.storage.errors import CorruptCheckpointError
from broker.storage.errors import InvalidAppendError
from broker.storage.errors import OffsetOutOfRangeError
from broker.storage.errors import RecordTooLargeError
from broker.storage.errors import StorageError
from broker.storage.log import AppendInfo
from broker.storage.log import Log
from broker.storage.log import LogConfig
from broker.storage.log_manager import LogManager
from broker.storage.segment import LogSegment

__all__ = [
    "AppendInfo",
    "CorruptCheckpointError",
    "EpochEntry",
    "InvalidAppendError",
    "LeaderEpochFileCache",
    "Log",
    "LogConfig",
    "LogManager",
    "LogSegment",
    "OffsetOutOfRangeError",
    "RecordTooLargeError",
    "StorageError",
]
