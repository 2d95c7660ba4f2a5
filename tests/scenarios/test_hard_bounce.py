"""Hard bounces under load, in the manner of Jepsen and Kafka's
ReplicationTest ("hard_bounce"): acknowledged writes survive the leader being killed.

Staging, on real processes (controller + brokers 1, 2, 3; one partition, fixed replicas
[1, 2, 3], min.insync.replicas=2):

- three producers write unique values with acks=all in bounded loops, one value per
  request, to the leader it finds in Metadata (with that leader's epoch). It retries
  retriable errors against the current leader; a send whose outcome is unknown (no
  answer, a timeout, an error that may come after the append) is recorded as
  indeterminate, since a retry without idempotence may then duplicate the value;
- meanwhile the current leader is killed with SIGKILL and restarted, 5 times (each time
  the test waits for the new leader and for the full ISR before the next kill).

Invariants checked at the end (the Jepsen-style checker):
- every acknowledged value is on every replica, at the offset it was acknowledged at;
- replicas hold identical batches below the high watermark;
- offsets read back strictly increase (from every replica);
- nothing appears that was never sent, and a value appears twice only if one of its
  sends was indeterminate.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from pathlib import Path

import pytest

from protocol.errors import ErrorCode
from tests.scenarios.scenario_cluster import BROKER_FLAGS
from tests.scenarios.scenario_cluster import NODES
from tests.scenarios.scenario_cluster import SESSION_MS
from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import committed_batches
from tests.scenarios.scenario_cluster import scenario_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(150)]

TOPIC = "bounced"
BOUNCES = 5
MAX_VALUES = 3000  # per worker
WORKERS = 3

# Refused before anything is appended: a retry cannot duplicate.
NOT_APPENDED = {
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.NOT_ENOUGH_REPLICAS,
}


class Producer:
    def __init__(self, c: ScenarioCluster) -> None:
        self.c = c
        self.acked: dict[bytes, int] = {}  # value -> acknowledged offset
        self.sent: set[bytes] = set()
        self.indeterminate: set[bytes] = set()
        self.errors: Counter[str] = Counter()
        self.stop = asyncio.Event()
        self.leader: tuple[int, int] | None = None  # (node, epoch)

    async def refresh(self) -> None:
        self.leader = None
        try:
            p = await self.c.partition(TOPIC)
        except (ConnectionError, OSError, TimeoutError, AssertionError):
            return
        if p.leader_id >= 0:
            self.leader = (p.leader_id, p.leader_epoch)
        else:
            await asyncio.sleep(0.05)

    async def send(self, value: bytes) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.leader is None:
                await asyncio.sleep(0.05)
                await self.refresh()
                continue
            node, epoch = self.leader
            self.sent.add(value)
            try:
                resp = await self.c.produce(
                    node, TOPIC, [value], current_leader_epoch=epoch, timeout_ms=3000
                )
            except ConnectionRefusedError:
                # Nothing was sent (the leader in Metadata is dead and not yet fenced).
                self.errors["ConnectionRefusedError"] += 1
                await asyncio.sleep(0.05)
                await self.refresh()
                continue
            except (ConnectionError, OSError, TimeoutError) as exc:
                # The request may have reached the log before the connection broke.
                self.errors[type(exc).__name__] += 1
                self.indeterminate.add(value)
                await self.refresh()
                continue
            code = ErrorCode(resp.error_code)
            if code == ErrorCode.NONE:
                assert resp.base_offset >= 0
                self.acked[value] = resp.base_offset
                return
            self.errors[code.name] += 1
            assert code.retriable, f"non-retriable produce error {code.name}"
            if code not in NOT_APPENDED:
                # NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND:
                # a delayed produce answered after the append, the value may be in the log.
                self.indeterminate.add(value)
            await self.refresh()
        raise AssertionError(f"{value!r} was never acknowledged within 30 s")

    async def run(self, worker: int) -> None:
        await self.refresh()
        for i in range(MAX_VALUES):
            if self.stop.is_set():
                return
            await self.send(f"w{worker}-value-{i:05d}".encode())


async def read_log(c: ScenarioCluster, node: int) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of broker `node`'s replica, read as a debugging
    replica (past the HW), offsets as the broker reports them."""
    async with c.client(node) as client:
        return await client.read_partition(TOPIC, replica=True)


async def test_acknowledged_writes_survive_five_leader_hard_bounces(tmp_path: Path) -> None:
    with scenario_cluster(tmp_path) as c:
        c.start_three_brokers(*BROKER_FLAGS, session_timeout_ms=SESSION_MS, controller_faults=False)
        await c.create_on_three(TOPIC, min_insync=2)
        p = await c.wait_leader(TOPIC)

        producer = Producer(c)
        # Several sends in flight at once, so a kill catches some of them mid-way.
        task = asyncio.gather(*(producer.run(w) for w in range(WORKERS)))
        try:

            async def progress(more: int, timeout: float = 30.0) -> None:
                target = len(producer.acked) + more
                deadline = time.monotonic() + timeout
                while len(producer.acked) < target:
                    assert not task.done(), task.exception()
                    assert time.monotonic() < deadline, f"producer stuck at {len(producer.acked)}"
                    await asyncio.sleep(0.05)

            for _ in range(BOUNCES):
                await progress(30)
                p = await c.wait_leader(TOPIC)
                victim, epoch = p.leader_id, p.leader_epoch
                c.brokers[victim].kill()  # SIGKILL, mid-stream
                p = await c.wait_partition(
                    TOPIC,
                    lambda q, v=victim, e=epoch: q.leader_id not in (-1, v) and q.leader_epoch > e,
                    what=f"a new leader after killing {victim}",
                )
                await progress(10)  # the new leader takes writes with the victim down
                c.start_broker(victim, *BROKER_FLAGS)
                await c.wait_isr(TOPIC, set(NODES))
            await progress(30)
        finally:
            producer.stop.set()
            await asyncio.wait_for(task, 60)

        acked = producer.acked
        print(  # the run's shape, shown with pytest -s
            f"acked {len(acked)}, sent {len(producer.sent)}, "
            f"indeterminate {len(producer.indeterminate)}, errors {dict(producer.errors)}"
        )
        assert len(acked) >= BOUNCES * 40
        # Every bounce cost the producer at least one failed attempt.
        assert sum(producer.errors.values()) >= BOUNCES, producer.errors

        # Converge: full ISR, and every replica's LEO and HW equal.
        await c.wait_isr(TOPIC, set(NODES))
        deadline = time.monotonic() + 30
        while True:
            logs = {n: await c.replica_log(n, TOPIC) for n in NODES}
            ends = {(lg.log_end_offset, lg.high_watermark) for lg in logs.values()}
            if len(ends) == 1 and all(leo == hw for leo, hw in ends):
                break
            assert time.monotonic() < deadline, f"replicas never converged: {ends}"
            await asyncio.sleep(0.1)
        hw = logs[NODES[0]].high_watermark

        # Identical batches below the HW.
        epochs = [b[2] for b in committed_batches(logs, hw)]
        assert epochs == sorted(epochs), "batch epochs go backwards"

        for n in NODES:
            records = await read_log(c, n)
            offsets = [o for o, _ in records]
            assert all(a < b for a, b in itertools.pairwise(offsets)), f"broker {n}"
            assert len(records) == hw, f"broker {n} holds {len(records)} records, HW {hw}"
            at = dict(records)
            lost = [v for v, o in acked.items() if at.get(o) != v]
            assert not lost, f"broker {n} lost acknowledged values {lost[:5]} ({len(lost)})"
            counts = Counter(v for _, v in records)
            unknown = [v for v in counts if v not in producer.sent]
            assert not unknown, f"broker {n} holds values never sent: {unknown[:5]}"
            dups = {v for v, k in counts.items() if k > 1}
            assert dups <= producer.indeterminate, (
                f"broker {n} duplicates values whose sends were all determinate: "
                f"{sorted(dups - producer.indeterminate)[:5]}"
            )
        assert await c.read_values(p.leader_id, TOPIC, replica=False) == [v for _, v in records]
