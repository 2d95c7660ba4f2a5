"""The run configurations the pytest chaos tests use.

- `today`: what must hold before replication (issue 3) and the idempotent producer
  (issue 4) land: RF=1 topics (acks=all is then the leader's append), faults that a
  single replica survives without losing acknowledged data (pause, SIGKILL of brokers
  and the controller: the page cache keeps what was written; network partitions on
  docker). No wipe: with one replica a wiped disk loses data by definition. Retry
  duplicates of the non-idempotent producer are expected, reported apart.
- `full`: the issue's acceptance campaign: RF=3, min.insync.replicas=2, acks=all,
  every fault, idempotent producers when the client has them; a strict verdict.
"""

from __future__ import annotations

from .backends import ClusterSettings
from .runner import RunConfig
from .workload import WorkloadConfig, producer_supports_idempotence

TODAY_FAULTS = {
    "process": ["pause", "kill", "kill-leader", "kill-controller"],
    "docker": ["pause", "kill", "kill-leader", "kill-controller", "partition"],
}


def today(backend: str, seed: int, *, time_limit: float = 30.0) -> RunConfig:
    return RunConfig(
        seed=seed,
        backend=backend,
        faults=TODAY_FAULTS[backend],
        max_faults=5,
        fault_interval=(1.0, 3.0),
        fault_duration=(1.0, 4.0),
        workload=WorkloadConfig(
            partitions=3,
            replication_factor=1,
            min_insync_replicas=1,
            acks="all",
            idempotent=False,
            producers=2,
            consumers=2,
            time_limit=time_limit,
            send_interval=0.01,
        ),
        cluster=ClusterSettings(),
    )


def full(backend: str, seed: int, *, time_limit: float = 60.0) -> RunConfig:
    return RunConfig(
        seed=seed,
        backend=backend,
        faults=["kill", "kill-leader", "kill-controller", "pause", "partition", "wipe"],
        max_faults=8,
        fault_interval=(2.0, 5.0),
        fault_duration=(2.0, 6.0),
        workload=WorkloadConfig(
            partitions=3,
            replication_factor=3,
            min_insync_replicas=2,
            acks="all",
            idempotent=producer_supports_idempotence(),
            producers=2,
            consumers=2,
            time_limit=time_limit,
            send_interval=0.01,
        ),
        cluster=ClusterSettings(),
    )


def known_loss(backend: str, seed: int, *, time_limit: float = 20.0) -> RunConfig:
    """RF=1 with wiped disks: acknowledged writes ARE lost (one replica, its disk gone),
    so the checker must say so. The end-to-end proof that a run can fail."""
    cfg = today(backend, seed, time_limit=time_limit)
    cfg.faults = ["wipe"]
    cfg.max_faults = 2
    cfg.fault_interval = (3.0, 5.0)
    return cfg
