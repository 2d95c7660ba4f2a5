"""A deterministic, seeded simulation of the controller quorum (controller/quorum/), in
the manner of Kafka's RaftEventSimulationTest and TigerBeetle's VOPR.

The voters are the real `QuorumReplica` objects; only their surroundings are
simulated: a clock, a network that delays, drops, reorders and partitions messages,
disks whose writes become durable when a flush completes, and a nemesis that kills
voters (SIGKILL: what was written survives, what was only in memory does not), cuts
their power (only what was flushed survives), wipes their disks (a lost volume: the
voter comes back with nothing) and empties their logs (the quorum state survives). A
voter that may not vote at its start (controller/quorum/voting_rights.py) asks the
others as the driver does, and votes once they say the quorum is new or once it has
caught up. One seed
decides everything, so a failing seed replays exactly:

    python -m tests.unit.controller.quorum_simulation --seed 1234 --verbose

Checked after every event (Raft's safety properties):
- election safety: at most one leader per epoch;
- committed entries never change: every entry below any voter's high watermark is
  the same entry (offset, epoch, record) everywhere, for the whole run, and a high
  watermark never goes back while its voter is up;
- leader completeness: a new leader's log holds every committed entry;
- log matching: two logs with an entry of the same epoch at the same offset agree
  on every entry up to it (checked at the end).
At the end the network heals and every voter restarts: a leader is elected, every
voter reaches the same high watermark, and every append the leader acknowledged is
in every log.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import logging
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from controller.quorum.quorum_log import QuorumLog
from controller.quorum.quorum_log import Snapshot
from controller.quorum.replica import QuorumReplica
from controller.quorum.replica import QuorumSettings
from controller.quorum.replica import QuorumState
from controller.quorum.replica import Role
from controller.quorum.voting_rights import may_vote_at_start
from controller.quorum.voting_rights import start_verdict
from protocol.messages.client_apis import Message
from protocol.messages.quorum_apis import MetadataEntry
from protocol.messages.quorum_apis import VoteResponse

SETTINGS = QuorumSettings(
    fetch_timeout_ms=300,
    election_timeout_ms=150,
    election_backoff_max_ms=150,
    idle_fetch_backoff_ms=20,
    begin_epoch_resend_ms=100,
    fetch_max_entries=20,
)
TICK_MS = 10.0
REQUEST_TIMEOUT_MS = 200.0
CLUSTER = "sim-cluster"


class SimulationFailure(AssertionError):
    def __init__(self, seed: int, message: str) -> None:
        super().__init__(
            f"seed {seed}: {message}\nreplay: python -m tests.unit.controller.quorum_simulation "
            f"--seed {seed} --verbose"
        )


@dataclass
class Disk:
    """What survives a crash: the quorum state (written durably at once), the log as
    last written (survives SIGKILL) and as last flushed (survives a power cut)."""

    state: QuorumState | None = None  # None: no quorum-state file
    written: tuple[Snapshot, tuple[MetadataEntry, ...]] = (Snapshot(), ())
    flushed: tuple[Snapshot, tuple[MetadataEntry, ...]] = (Snapshot(), ())


@dataclass
class Node:
    node_id: int
    disk: Disk = field(default_factory=Disk)
    replica: QuorumReplica | None = None
    incarnation: int = 0
    flushing: bool = False
    last_hw: int = 0
    applied_snapshot_at: int = 0


@dataclass(frozen=True)
class Options:
    voters: int = 3
    chaos_ms: float = 6_000
    quiet_ms: float = 4_000
    drop: float = 0.05
    max_delay_ms: float = 25.0
    fault_every_ms: float = 400.0
    max_flush_ms: float = 15.0
    power_cut_share: float = 0.35  # of crashes; the rest are kills (a tenth wipes)
    snapshot_every: int = 15
    bounce_after_vote: float = 0.2  # share of granted votes followed by a quick kill
    cut_during_flush: float = 0.01  # share of flushes the power cut interrupts

    @classmethod
    def swarm(cls, seed: int) -> Options:
        """Options drawn from the seed (swarm testing): each seed runs its own mix of
        loss, delay, fault rate and disk speed, so that rare interleavings (a power
        cut between an append and its flush, a crash right after a vote) come up in
        some of them."""
        rng = random.Random(seed ^ 0x5EED)
        return cls(
            voters=rng.choice((3, 3, 5)),
            drop=rng.choice((0.0, 0.02, 0.1, 0.25)),
            max_delay_ms=rng.choice((5.0, 25.0, 80.0)),
            fault_every_ms=rng.choice((100.0, 250.0, 600.0)),
            max_flush_ms=rng.choice((2.0, 15.0, 60.0)),
            power_cut_share=rng.choice((0.2, 0.5, 0.8)),
            snapshot_every=rng.choice((5, 15, 50)),
            bounce_after_vote=rng.choice((0.0, 0.2, 0.6)),
            cut_during_flush=rng.choice((0.0, 0.01, 0.05)),
        )


class Simulation:
    def __init__(self, seed: int, options: Options = Options(), *, verbose: bool = False) -> None:
        self.seed = seed
        self.o = options
        self.rng = random.Random(seed)
        self.verbose = verbose
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.nodes = {i: Node(i) for i in range(1, options.voters + 1)}
        self.cut: set[frozenset[int]] = set()  # links that drop everything
        self.leaders: dict[int, int] = {}  # epoch -> leader id
        self._announced: dict[int, tuple[int, int]] = {}  # node -> (incarnation, epoch led)
        self.committed: dict[int, tuple[int, Any]] = {}  # offset -> (epoch, record)
        self.acked: dict[int, tuple[int, Any]] = {}  # appends the leader acknowledged
        self._pending: list[tuple[int, int, int, Any]] = []  # (leader, epoch, offset, rec)
        self._next_record = 0
        self.stats: dict[str, int] = {
            "elections": 0,
            "kills": 0,
            "power_cuts": 0,
            "wipes": 0,
            "lost_logs": 0,
        }

    # ------------------------------------------------------------------ plumbing

    def fail(self, message: str) -> None:
        raise SimulationFailure(self.seed, message)

    def trace(self, message: str) -> None:
        if self.verbose:
            print(f"{self.now:9.1f} {message}")

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._seq), action))

    def up(self, node: Node) -> QuorumReplica | None:
        return node.replica

    def start(self, node: Node, *, may_vote: bool = True) -> None:
        snapshot, entries = node.disk.written
        node.disk.flushed = node.disk.written  # recovery fsyncs what it read back
        node.incarnation += 1
        node.replica = QuorumReplica(
            node.node_id,
            tuple(self.nodes),
            cluster_id=CLUSTER,
            log=QuorumLog(snapshot, list(entries)),
            state=node.disk.state or QuorumState(),
            save_state=lambda s, n=node: self._save_state(n, s),
            settings=SETTINGS,
            rng=random.Random(self.rng.random()),
            now=self.now,
            may_vote=may_vote,
        )
        node.flushing = False
        node.last_hw = node.replica.high_watermark
        node.applied_snapshot_at = snapshot.end_offset
        incarnation = node.incarnation
        self.at(self.now + self.rng.random() * TICK_MS, lambda: self._tick(node, incarnation))
        self.trace(f"node {node.node_id} starts (log end {node.replica.log.end_offset})")

    def _save_state(self, node: Node, state: QuorumState) -> None:
        node.disk.state = state

    def _tick(self, node: Node, incarnation: int) -> None:
        if node.replica is None or node.incarnation != incarnation:
            return
        node.replica.tick(self.now)
        self._after(node)
        self.at(self.now + TICK_MS, lambda: self._tick(node, incarnation))

    # ------------------------------------------------------------------ network

    def _reachable(self, a: int, b: int) -> bool:
        return frozenset((a, b)) not in self.cut

    def _deliver_later(self, src: int, dst: int, action: Callable[[], None]) -> bool:
        drop = self.o.drop if self.now < self.o.chaos_ms else 0.0  # healed: no loss
        if not self._reachable(src, dst) or self.rng.random() < drop:
            return False
        self.at(self.now + 1 + self.rng.random() * self.o.max_delay_ms, action)
        return True

    def _send(self, node: Node, dst: int, request: Message) -> None:
        incarnation = node.incarnation
        answered = [False]

        def on_response(response: Message) -> None:
            if node.replica is None or node.incarnation != incarnation or answered[0]:
                return
            answered[0] = True
            node.replica.handle_response(dst, request, response, self.now)
            self._after(node)

        def on_request() -> None:
            target = self.nodes[dst]
            if target.replica is None:
                return
            response = target.replica.handle_request(node.node_id, request, self.now)
            self._after(target)
            self._deliver_later(dst, node.node_id, lambda: on_response(response))
            if isinstance(response, VoteResponse) and response.vote_granted:
                self._maybe_bounce(target)

        def on_timeout() -> None:
            if node.replica is None or node.incarnation != incarnation or answered[0]:
                return
            answered[0] = True
            node.replica.request_failed(dst, request, self.now)
            self._after(node)

        self._deliver_later(node.node_id, dst, on_request)
        self.at(self.now + REQUEST_TIMEOUT_MS, on_timeout)

    # ------------------------------------------------------------------ after each event

    def _after(self, node: Node) -> None:
        replica = node.replica
        assert replica is not None
        outbox, replica.outbox = replica.outbox, []
        for dst, request in outbox:
            self._send(node, dst, request)
        self._maybe_flush(node)
        self._check(node)
        self._apply_and_snapshot(node)

    def _maybe_flush(self, node: Node) -> None:
        replica = node.replica
        assert replica is not None
        log = replica.log
        if node.flushing or log.flushed_end >= log.end_offset:
            return
        node.flushing = True
        log.journal.clear()  # the simulated disk takes whole images, not the journal
        point = log.flush_point()
        image = (log.snapshot, tuple(log.entries))
        node.disk.written = image  # written to the page cache now
        incarnation = node.incarnation

        def done() -> None:
            if node.replica is None or node.incarnation != incarnation:
                return
            node.flushing = False
            node.disk.flushed = image
            node.replica.flushed(point, self.now)
            self._after(node)

        flush_ms = 1 + self.rng.random() * self.o.max_flush_ms
        self.at(self.now + flush_ms, done)
        if self.now < self.o.chaos_ms and self.rng.random() < self.o.cut_during_flush:
            # The power goes while the write is on its way to the disk.
            self.at(self.now + self.rng.random() * flush_ms, lambda: self._cut(node, incarnation))

    def _cut(self, node: Node, incarnation: int) -> None:
        if node.replica is not None and node.incarnation == incarnation:
            self._crash(node, "power", downtime_ms=1 + self.rng.random() * 50)

    def _apply_and_snapshot(self, node: Node) -> None:
        """The application: a snapshot of everything committed, now and then."""
        replica = node.replica
        assert replica is not None
        hw = replica.high_watermark
        if hw - node.applied_snapshot_at < self.o.snapshot_every or hw <= replica.log.start_offset:
            return
        records = tuple((o, *self.entry_of(replica, o)) for o in range(hw))
        replica.compact(Snapshot(hw, replica.log.epoch_at(hw - 1), records))
        node.applied_snapshot_at = hw
        self.trace(f"node {node.node_id} snapshot at {hw}")

    # ------------------------------------------------------------------ invariants

    def entry_of(self, replica: QuorumReplica, offset: int) -> tuple[int, Any]:
        log = replica.log
        if offset < log.start_offset:
            o, epoch, record = log.snapshot.records[offset]
            if o != offset:
                self.fail(f"snapshot of node {replica.node_id} holds offset {o} at {offset}")
            return epoch, record
        e = log.entry(offset)
        return e.epoch, e.record

    def _check(self, node: Node) -> None:
        replica = node.replica
        assert replica is not None
        if replica.role is Role.LEADER:
            known = self.leaders.setdefault(replica.epoch, node.node_id)
            if known != node.node_id:
                self.fail(f"two leaders in epoch {replica.epoch}: {known} and {node.node_id}")
            if self._announced.get(node.node_id) != (node.incarnation, replica.epoch):
                self._announced[node.node_id] = (node.incarnation, replica.epoch)
                self.stats["elections"] += 1
                self.trace(f"node {node.node_id} leads epoch {replica.epoch}")
                self._check_leader_completeness(replica)
        hw = replica.high_watermark
        if hw < node.last_hw:
            self.fail(f"node {node.node_id}: high watermark went back {node.last_hw} -> {hw}")
        for offset in range(node.last_hw, hw):
            entry = self.entry_of(replica, offset)
            known_entry = self.committed.setdefault(offset, entry)
            if known_entry != entry:
                self.fail(
                    f"committed offset {offset} is {known_entry} but node {node.node_id} "
                    f"committed {entry}"
                )
        node.last_hw = hw
        # KIP-868: a change (one append's records) is committed whole: the high
        # watermark never ends inside one. (A diverging uncommitted suffix may be cut
        # anywhere on the way to a snapshot install; only the committed part counts.)
        log = replica.log
        if hw > log.start_offset and log.entry(hw - 1).change_continues:
            self.fail(f"node {node.node_id}: its high watermark {hw} is inside a change")
        self._acknowledge()

    def _check_leader_completeness(self, leader: QuorumReplica) -> None:
        for offset, entry in self.committed.items():
            if offset >= leader.log.end_offset:
                self.fail(
                    f"leader {leader.node_id} of epoch {leader.epoch} lacks committed offset "
                    f"{offset} (log end {leader.log.end_offset})"
                )
            if self.entry_of(leader, offset) != entry:
                self.fail(f"leader {leader.node_id} has another entry at committed {offset}")

    def _acknowledge(self) -> None:
        still: list[tuple[int, int, int, Any]] = []
        for leader_id, epoch, offset, record in self._pending:
            r = self.nodes[leader_id].replica
            if r is None or r.epoch != epoch or not r.is_leader:
                continue  # unknown outcome: never acknowledged
            if r.high_watermark > offset:
                self.acked[offset] = (epoch, record)
            else:
                still.append((leader_id, epoch, offset, record))
        self._pending = still

    def check_log_matching(self) -> None:
        up = [n.replica for n in self.nodes.values() if n.replica is not None]
        for a, b in itertools.combinations(up, 2):
            lo = max(a.log.start_offset, b.log.start_offset)
            hi = min(a.log.end_offset, b.log.end_offset)
            same = [o for o in range(lo, hi) if a.log.entry(o).epoch == b.log.entry(o).epoch]
            if not same:
                continue
            for o in range(lo, max(same) + 1):
                if a.log.entry(o) != b.log.entry(o):
                    self.fail(
                        f"logs of {a.node_id} and {b.node_id} share epoch at {max(same)} but "
                        f"differ at {o}"
                    )

    # ------------------------------------------------------------------ workload and faults

    def _client(self) -> None:
        if self.now >= self.o.chaos_ms + self.o.quiet_ms / 2:
            return  # the second half of the quiet period lets every voter catch up
        for node in self.nodes.values():
            r = node.replica
            if r is not None and r.is_leader:
                records = [f"r{self._next_record + i}" for i in range(self.rng.randint(1, 3))]
                self._next_record += len(records)
                end = r.append(records, self.now)
                for i, rec in enumerate(records):
                    self._pending.append((node.node_id, r.epoch, end - len(records) + i, rec))
                self._after(node)
        self.at(self.now + 10 + self.rng.random() * 30, self._client)

    def _nemesis(self) -> None:
        if self.now >= self.o.chaos_ms:
            return
        choice = self.rng.random()
        nodes = list(self.nodes.values())
        down = [n for n in nodes if n.replica is None]
        leaders = [n for n in nodes if n.replica is not None and n.replica.is_leader]
        # Half the faults hit the leader: most of what can go wrong happens there.
        victim = self.rng.choice(leaders if leaders and self.rng.random() < 0.5 else nodes)
        if choice < 0.3:
            self._partition()
        elif choice < 0.4:
            self.cut.clear()
            self.trace("network healed")
        elif victim.replica is not None and len(down) < (len(nodes) - 1) // 2 + 1:
            # Kill, power cut or disk loss (only one voter without its disk at a time).
            kind = self.rng.random()
            if kind < 0.1 and not any(self._without_vote(n) for n in nodes):
                self._crash(victim, "wipe" if self.rng.random() < 0.5 else "lose-log")
            elif kind < 0.1 + 0.9 * self.o.power_cut_share:
                self._crash(victim, "power")
            else:
                self._crash(victim, "kill")
        self.at(self.now + self.rng.random() * 2 * self.o.fault_every_ms, self._nemesis)

    @staticmethod
    def _without_vote(node: Node) -> bool:
        """A voter that would start without the right to vote, or has not won it back
        (no quorum state, a lost log, still catching up): one at a time, as a quorum of
        three cannot elect anyone with two of them (voting_rights.py). A voter that
        restarts before its first state change counts: it cannot tell itself from a
        voter that lost its disk."""
        state = node.disk.state
        snapshot, entries = node.disk.written
        log_empty = not entries and snapshot.end_offset == 0
        return state is None or state.catching_up or (state.held_entries and log_empty)

    def _partition(self) -> None:
        ids = list(self.nodes)
        self.rng.shuffle(ids)
        k = self.rng.randint(1, len(ids) - 1)
        side = set(ids[:k])
        self.cut = {frozenset((a, b)) for a in ids for b in ids if (a in side) != (b in side)}
        self.trace(f"partition {sorted(side)} | {sorted(set(ids) - side)}")

    def _maybe_bounce(self, node: Node) -> None:
        """A voter that just granted a vote is killed and back within milliseconds,
        now and then: the crash a vote must survive (it was persisted first)."""
        if self.now < self.o.chaos_ms and self.rng.random() < self.o.bounce_after_vote:
            self._crash(node, "kill", downtime_ms=1 + self.rng.random() * 20)

    def _crash(self, node: Node, how: str, *, downtime_ms: float | None = None) -> None:
        node.replica = None
        if how == "power":
            node.disk.written = node.disk.flushed
            self.stats["power_cuts"] += 1
        elif how == "wipe":
            node.disk = Disk()
            self.stats["wipes"] += 1
        elif how == "lose-log":
            node.disk = Disk(state=node.disk.state)
            self.stats["lost_logs"] += 1
        else:
            self.stats["kills"] += 1
        node.last_hw = 0
        self.trace(f"node {node.node_id} crashes ({how})")
        if downtime_ms is None:
            downtime_ms = 50 + self.rng.random() * 1_000
        self.at(self.now + downtime_ms, lambda: self._restart(node))

    def _restart(self, node: Node) -> None:
        if node.replica is not None:
            return
        snapshot, entries = node.disk.written
        state = node.disk.state
        may_vote = may_vote_at_start(
            single_voter=len(self.nodes) == 1,
            state=state,
            log_empty=not entries and snapshot.end_offset == 0,
        )
        self.start(node, may_vote=may_vote)
        if not may_vote:
            replica = node.replica
            assert replica is not None
            self._probe(node, node.incarnation)

    def _probe(self, node: Node, incarnation: int) -> None:
        """The driver's question to the other voters at start (driver.py
        `_first_start_or_lost_disk`), answered with their epochs and log ends as they
        are now."""
        replica = node.replica
        if replica is None or node.incarnation != incarnation:
            return
        if replica.may_vote or replica.log.end_offset > 0:
            return
        answers = [
            (other.replica.epoch, other.replica.log.end_offset)
            for other in self.nodes.values()
            if other is not node
            and other.replica is not None
            and self._reachable(node.node_id, other.node_id)
        ]
        verdict = start_verdict(answers, replica.majority)
        if isinstance(verdict, int):
            self.trace(f"node {node.node_id} finds every log empty: voting above {verdict}")
            replica.allow_voting(verdict, self.now)
            self._after(node)
        elif verdict is None:
            self.at(self.now + 200, lambda: self._probe(node, incarnation))

    # ------------------------------------------------------------------ run

    def run(self) -> Simulation:
        for node in self.nodes.values():
            # A new quorum: each voter's first start found every other empty and wrote
            # its state (driver.py `_first_start_or_lost_disk`, `allow_voting`).
            node.disk.state = QuorumState()
            self.start(node)
        self.at(0.0, self._client)
        self.at(self.o.fault_every_ms, self._nemesis)
        end = self.o.chaos_ms + self.o.quiet_ms
        self.at(self.o.chaos_ms, self._heal)
        while self._events:
            when, _, action = heapq.heappop(self._events)
            if when > end:
                break
            self.now = when
            action()
        self._final_checks()
        return self

    def _heal(self) -> None:
        self.cut.clear()
        self.trace("chaos over: network healed, every voter restarted")
        for node in self.nodes.values():
            if node.replica is None:
                self._restart(node)

    def _final_checks(self) -> None:
        self.check_log_matching()
        replicas = [n.replica for n in self.nodes.values()]
        if any(r is None for r in replicas):
            self.fail("a voter is still down after the quiet period")
        leaders = [r for r in replicas if r is not None and r.is_leader]
        if len(leaders) != 1:
            self.fail(f"{len(leaders)} leaders after the quiet period")
        hws = {r.high_watermark for r in replicas if r is not None}
        if len(hws) != 1:
            self.fail(f"the voters' high watermarks differ after the quiet period: {hws}")
        for offset, entry in self.acked.items():
            for r in replicas:
                assert r is not None
                if offset >= r.log.end_offset or self.entry_of(r, offset) != entry:
                    self.fail(f"acknowledged offset {offset} {entry} missing on {r.node_id}")
        if not self.acked:
            self.fail("nothing was acknowledged in the whole run")


def run_seed(seed: int, options: Options | None = None, *, verbose: bool = False) -> Simulation:
    logging.getLogger("controller.quorum").setLevel(logging.INFO if verbose else logging.ERROR)
    return Simulation(seed, options or Options.swarm(seed), verbose=verbose).run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.verbose:
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    sim = run_seed(args.seed, verbose=args.verbose)
    print(f"seed {args.seed}: ok, {len(sim.acked)} acknowledged, {sim.stats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
