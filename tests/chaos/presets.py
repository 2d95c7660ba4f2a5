"""The run configurations the pytest chaos tests use.

- `compound`: the default slice: RF=3, min.insync.replicas=2, acks=all, idempotent
  producers with many records in flight and short timeouts (so indeterminate sends
  occur), and overlapping faults (up to 3 at once): SIGKILL of brokers, of partition
  leaders and of the controller, broker pauses, controller stalls (pause-controller:
  it found the controller-stall data loss of issue 13), guarded wiped disks, and
  network partitions on docker. Nothing acknowledged may be lost, nothing may be
  written twice. On docker the cluster has the compose file's three controllers, and
  the faults take the active one and partition controllers too.
- `quorum`: `compound` with a quorum of three controllers (issue 17) and faults aimed
  at it: SIGKILL of the active controller and of any voter, stalls of voters (a paused
  leader is a zombie to fence), with broker kills and pauses around them; the
  metadata check (no split brain, no committed metadata lost, voters' logs agree).
- `unclean_divergence`: RF=3, min.insync.replicas=1, unclean election on, the
  `diverge` fault: a leader left alone takes writes, dies, and an out-of-sync follower
  leads a new lineage. Acknowledged writes are lost by design (expected); every
  consumer that read the lost records must be told at the right offset.
- `known_loss`: RF=1 with unguarded wiped disks and producers without idempotence:
  acknowledged writes ARE lost, so the checker must say so (the end-to-end proof that
  a run can fail), and the producers must really be non-idempotent.
- `librdkafka`: `compound` with confluent-kafka's producers and consumers through the
  brokers' Kafka listeners: the same checker, the same guarantees.
- `tls`: `compound` with every listener on TLS, TLS between the servers (replication,
  the controller) and from the clients (issue 18).
- `secure`: `compound` with SASL_SSL (SCRAM) on every listener and between the servers,
  the authorizer on, and the workload a user allowed only its topics and group by ACLs
  (issue 18).
- `full`: the acceptance campaign: every fault, longer.
"""

from __future__ import annotations

from .backends import ClusterSettings
from .nemesis import FAULTS
from .runner import RunConfig
from .workload import WorkloadConfig

COMPOUND_FAULTS = {
    "process": ["pause", "pause-controller", "kill", "kill-leader", "kill-controller", "wipe"],
    "docker": [
        "pause",
        "pause-controller",
        "kill",
        "kill-leader",
        "kill-controller",
        "kill-active-controller",
        "wipe",
        "partition",
        "partition-controller",
    ],
}
QUORUM_FAULTS = [
    "kill-active-controller",
    "kill-controller",
    "pause-controller",
    "kill",
    "kill-leader",
    "pause",
]


def compound(backend: str, seed: int, *, time_limit: float = 20.0) -> RunConfig:
    return RunConfig(
        seed=seed,
        backend=backend,
        faults=COMPOUND_FAULTS[backend],
        max_faults=8,
        fault_interval=(0.5, 2.0),
        fault_duration=(2.0, 5.0),
        max_concurrent_faults=3,
        workload=WorkloadConfig(
            partitions=3,
            replication_factor=3,
            min_insync_replicas=2,
            acks="all",
            idempotent=True,
            producers=2,
            in_flight=16,
            consumers=2,
            time_limit=time_limit,
        ),
        cluster=ClusterSettings(controllers=3 if backend == "docker" else 1),
    )


def quorum(backend: str, seed: int, *, time_limit: float = 20.0) -> RunConfig:
    cfg = compound(backend, seed, time_limit=time_limit)
    cfg.cluster.controllers = 3
    cfg.faults = QUORUM_FAULTS + (["partition-controller"] if backend == "docker" else [])
    return cfg


def librdkafka(backend: str, seed: int, *, time_limit: float = 15.0) -> RunConfig:
    """`compound` with librdkafka's producers and consumers (confluent-kafka) through
    the brokers' Kafka listeners (issue 15)."""
    cfg = compound(backend, seed, time_limit=time_limit)
    cfg.workload.client = "confluent"
    return cfg


def tls(backend: str, seed: int, *, time_limit: float = 20.0) -> RunConfig:
    cfg = compound(backend, seed, time_limit=time_limit)
    cfg.cluster.tls = True
    return cfg


def secure(backend: str, seed: int, *, time_limit: float = 20.0) -> RunConfig:
    cfg = compound(backend, seed, time_limit=time_limit)
    cfg.cluster.secure = True
    return cfg


def group(backend: str, seed: int, *, time_limit: float = 20.0) -> RunConfig:
    """`compound` with the consumers as members of one consumer group (issue 16): three
    members share three partitions while brokers (coordinators among them) are paused
    and killed; on top of everything else, no partition is delivered to two members
    of one generation."""
    cfg = compound(backend, seed, time_limit=time_limit)
    cfg.workload.group = True
    cfg.workload.consumers = 3
    # Each generation forms as soon as its members joined: in a 20 s run with faults
    # every second or two, a 3 s initial delay would leave few generations to check.
    cfg.cluster.broker_env["MINIBROKER_GROUP_INITIAL_REBALANCE_DELAY_MS"] = "0"
    # Faults a little sparser than `compound`: a JoinGroup sent to a paused coordinator
    # waits out its rebalance timeout, and a group must form now and then to be checked.
    cfg.fault_interval = (1.5, 3.0)
    return cfg


def unclean_divergence(backend: str, seed: int, *, time_limit: float = 22.0) -> RunConfig:
    cfg = compound(backend, seed, time_limit=time_limit)
    cfg.faults = ["diverge"]
    cfg.max_faults = 1
    cfg.fault_interval = (2.0, 3.0)
    cfg.fault_duration = (2.0, 3.0)
    cfg.workload.min_insync_replicas = 1
    cfg.workload.unclean = True
    return cfg


def known_loss(backend: str, seed: int, *, time_limit: float = 12.0) -> RunConfig:
    cfg = compound(backend, seed, time_limit=time_limit)
    cfg.faults = ["wipe"]
    cfg.guard_wipes = False
    cfg.max_faults = 2
    cfg.max_concurrent_faults = 1
    cfg.fault_interval = (3.0, 5.0)
    cfg.workload.replication_factor = 1
    cfg.workload.min_insync_replicas = 1
    cfg.workload.idempotent = False
    return cfg


def full(backend: str, seed: int, *, time_limit: float = 60.0) -> RunConfig:
    cfg = compound(backend, seed, time_limit=time_limit)
    cfg.faults = list(FAULTS)
    cfg.max_faults = 16
    cfg.fault_interval = (1.0, 4.0)
    cfg.fault_duration = (2.0, 6.0)
    return cfg
