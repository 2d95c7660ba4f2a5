"""Replica assignment for new topics: Kafka's rack-unaware round robin.

With brokers sorted by id, partition p's first replica is broker
`(p + start) % n`; the followers are spread by a shift that grows by one every n
partitions, so leaders and followers both spread evenly. `start` and the initial shift
are random (Kafka's choice: topics created one after another do not all put partition
0 on the same broker).
"""

from __future__ import annotations

import random


class PlacementError(ValueError):
    """The replication factor cannot be met with the available brokers."""


def _replica_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def assign_replicas(
    num_partitions: int,
    replication_factor: int,
    broker_ids: list[int],
    *,
    rng: random.Random | None = None,
    start_index: int | None = None,
    first_shift: int | None = None,
) -> list[list[int]]:
    """One replica list per partition (leader first)."""
    if num_partitions < 1:
        raise PlacementError(f"number of partitions must be >= 1, not {num_partitions}")
    if replication_factor < 1:
        raise PlacementError(f"replication factor must be >= 1, not {replication_factor}")
    brokers = sorted(set(broker_ids))
    n = len(brokers)
    if replication_factor > n:
        raise PlacementError(
            f"replication factor {replication_factor} is larger than the {n} available "
            f"(registered, unfenced, live) brokers {brokers}"
        )
    rng = rng or random.Random()
    start = rng.randrange(n) if start_index is None else start_index
    shift = rng.randrange(n) if first_shift is None else first_shift
    out: list[list[int]] = []
    for p in range(num_partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        replicas = [brokers[first]]
        replicas.extend(
            brokers[_replica_index(first, shift, j, n)] for j in range(replication_factor - 1)
        )
        out.append(replicas)
    return out
