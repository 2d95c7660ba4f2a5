"""The broker's test-only fault controls: the shared runtime (runtime/faults.py, the
rules in protocol/fault_plan.py) plus what only a broker does.

`--unsafe-skip-fsync` is carried out here (`NoFsyncLogManager`): Log.flush does
nothing, so no log data is fsynced and the recovery point does not advance; the
recovery-point checkpoint then shows what a power loss could take.
"""

from __future__ import annotations

import logging
from pathlib import Path

from broker.storage.log import Log
from broker.storage.log import LogConfig
from broker.storage.log import TopicPartition
from broker.storage.log_manager import LogManager
from runtime.faults import DROP
from runtime.faults import DROP_RESPONSE
from runtime.faults import PROCEED
from runtime.faults import Faults
from runtime.faults import InjectedDrop
from runtime.faults import TestFaults

# The broker's modules import the runtime's names from here with NO_FAULTS.
__all__ = [
    "DROP",
    "DROP_RESPONSE",
    "NO_FAULTS",
    "PROCEED",
    "Faults",
    "InjectedDrop",
    "NoFsyncLogManager",
    "TestFaults",
]

log = logging.getLogger(__name__)

NO_FAULTS = Faults("broker")


class NoFsyncLogManager(LogManager):
    """--unsafe-skip-fsync: every log's `flush` is a no-op (no fsync, the recovery
    point stays where it is). Everything else, including checkpoints, is unchanged."""

    def __init__(self, data_dir: Path, default_config: LogConfig, **sizing: int) -> None:
        super().__init__(data_dir, default_config, **sizing)
        self._warned: set[TopicPartition] = set()

    def startup(self) -> set[TopicPartition]:
        found = super().startup()
        for log_ in self.all_logs():
            self._disarm(log_)
        return found

    def get_or_create_log(self, tp: TopicPartition, config: LogConfig | None = None) -> Log:
        log_ = super().get_or_create_log(tp, config)
        self._disarm(log_)
        return log_

    def _disarm(self, log_: Log) -> None:
        if getattr(log_, "_fsync_skipped", False):
            return
        tp = log_.topic_partition
        warned = self._warned

        def flush(up_to: int | None = None, *, now_ms: int | None = None) -> None:
            if tp not in warned:
                warned.add(tp)
                log.warning(
                    "UNSAFE --unsafe-skip-fsync: not flushing %s-%d (nor any later flush of it)",
                    *tp,
                )

        log_.flush = flush  # type: ignore[method-assign]
        log_._fsync_skipped = True  # type: ignore[attr-defined]
