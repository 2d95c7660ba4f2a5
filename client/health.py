"""Cluster health, in the manner of `rpk cluster health`: a pure evaluation over a
cluster description and topic descriptions, and its text and JSON renderings.

`evaluate_health` does no I/O (AsyncAdmin.cluster_health gathers the inputs): it
says which brokers are down (fenced by the controller, or registered and unfenced
but not answering a probe), which partitions have no leader (leader -1) and which
are under-replicated (ISR smaller than the replica set), and turns each finding into
an unhealthy reason. The cluster is healthy when there is no reason.

It also lists the stray replicas the probed brokers hold (DescribeLogDirs): replica
directories a broker set aside as `<topic>-<partition>.<uuid>-stray` because the
metadata does not assign them (never deleted automatically). They are reported, not
a reason, as rpk reports what it sees without making a leftover fatal: a stray is
data out of service, not a cluster that serves its partitions less well, and
failing health on it would keep `--exit-when-healthy` (start-up gates, container
health checks) failing until someone deletes files by hand.

A broker whose data directory failed (a full or failing disk) reports it in its
DescribeLogDirs answer (KAFKA_STORAGE_ERROR and why); such a broker has asked the
controller to fence it, so it is also among the brokers down. Fenced brokers are
probed too, to learn this; one that does not answer is simply down.

With --controller, the controller quorum (issue 17) is checked as
`kafka-metadata-quorum describe --status` shows it: every voter is asked
DescribeQuorum (client/quorum_admin.py gathers it into a QuorumHealth), and a voter
is down when it does not answer, or when the active controller has not heard a fetch
from it for STALE_FETCH_MS. A quorum of one (a single controller) is the same check.

Reasons (stable names, scripts match on them):

    no_broker_reachable          no bootstrap broker answered
    controller_unreachable       --controller was given and none of them answered
    no_active_controller         the controllers answer, but none is the quorum leader
    controller_voters_down       a voter does not answer, or does not fetch from the leader
    no_controller                the metadata names no controller (-1)
    no_live_brokers              every registered broker is fenced, or none registered
    brokers_down                 some broker is fenced or does not answer
    offline_log_dirs             some broker reports its log directory offline
    leaderless_partitions        some partition has no leader
    under_replicated_partitions  some partition's ISR is smaller than its replicas
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

from client.descriptions import ClusterDescription
from client.descriptions import TopicDescription

NO_BROKER_REACHABLE = "no_broker_reachable"
CONTROLLER_UNREACHABLE = "controller_unreachable"
NO_ACTIVE_CONTROLLER = "no_active_controller"
CONTROLLER_VOTERS_DOWN = "controller_voters_down"
NO_CONTROLLER = "no_controller"
NO_LIVE_BROKERS = "no_live_brokers"
BROKERS_DOWN = "brokers_down"
OFFLINE_LOG_DIRS = "offline_log_dirs"
LEADERLESS_PARTITIONS = "leaderless_partitions"
UNDER_REPLICATED_PARTITIONS = "under_replicated_partitions"

# The order reasons are reported in: the most fundamental first.
REASONS = (
    NO_BROKER_REACHABLE,
    CONTROLLER_UNREACHABLE,
    NO_ACTIVE_CONTROLLER,
    CONTROLLER_VOTERS_DOWN,
    NO_CONTROLLER,
    NO_LIVE_BROKERS,
    BROKERS_DOWN,
    OFFLINE_LOG_DIRS,
    LEADERLESS_PARTITIONS,
    UNDER_REPLICATED_PARTITIONS,
)

SOURCE_CONTROLLER = "controller"
SOURCE_BROKER = "broker"
SOURCE_NONE = "none"

# A follower the active controller has not heard a fetch from for this long is down.
# A live follower fetches without a pause (the leader holds each long poll 0.4 s at
# most), and after the quorum fetch timeout (--quorum-fetch-timeout-ms, 1 s by
# default) without the leader it stands for election itself: three times that is far
# past the gap of a healthy follower (a slow fsync, a busy event loop) and still shows
# a stuck one within seconds. The leader steps down (check-quorum) only when a
# majority is silent, so a minority can stay stuck unnoticed but for this.
STALE_FETCH_MS = 3 * 1_000


def _plain(value: Any) -> Any:
    """JSON-ready: named tuples as dicts, tuples as lists (the report's --json form)."""
    if hasattr(value, "_asdict"):
        return {name: _plain(field) for name, field in value._asdict().items()}
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


class PartitionHealth(NamedTuple):
    """A partition named in a health report, with the state that put it there."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    to_dict = _plain  # the --json form


class StrayReplicaHealth(NamedTuple):
    """A replica directory a broker set aside as stray."""

    broker: int
    dir_name: str
    topic: str
    partition: int
    topic_id: str | None
    size_bytes: int

    def __str__(self) -> str:
        return f"{self.broker}:{self.dir_name}"

    to_dict = _plain  # the --json form


class OfflineLogDirHealth(NamedTuple):
    """A broker's log directory that failed, with the broker's account of why."""

    broker: int
    log_dir: str
    error: str

    def __str__(self) -> str:
        return f"{self.broker}:{self.log_dir}"

    to_dict = _plain  # the --json form


class VoterHealth(NamedTuple):
    """One controller of the quorum: its own answer, and the active controller's
    account of its progress (-1 where there is none)."""

    node_id: int
    address: str  # where it was asked; "-" when it is listed at a wildcard address only
    answered: bool  # it answered DescribeQuorum itself
    role: str  # what it says it is (leader, follower, candidate...); "" when silent
    log_end_offset: int  # as the active controller last heard
    lag: int  # entries behind the active controller's log end
    last_fetch_ms_ago: int  # -1: not in this epoch (or there is no active controller)
    down: bool  # see voter_is_down

    def __str__(self) -> str:
        return str(self.node_id)

    to_dict = _plain  # the --json form


class QuorumHealth(NamedTuple):
    """The controller quorum, as its active controller (if any) describes it."""

    leader_id: int  # the active controller; -1: none
    leader_epoch: int
    high_watermark: int
    voters: tuple[VoterHealth, ...]
    down_voters: tuple[int, ...]

    to_dict = _plain  # the --json form


def voter_is_down(
    *, answered: bool, is_leader: bool, leader_known: bool, last_fetch_ms_ago: int
) -> bool:
    """Silent to DescribeQuorum, or (with an active controller to say) a follower it
    has not heard from in this epoch or for longer than STALE_FETCH_MS."""
    if not answered:
        return True
    if is_leader or not leader_known:
        return False
    return last_fetch_ms_ago < 0 or last_fetch_ms_ago > STALE_FETCH_MS


def quorum_health(
    leader_id: int, leader_epoch: int, high_watermark: int, voters: Iterable[VoterHealth]
) -> QuorumHealth:
    ordered = tuple(sorted(voters))
    return QuorumHealth(
        leader_id,
        leader_epoch,
        high_watermark,
        ordered,
        tuple(v.node_id for v in ordered if v.down),
    )


class ClusterHealth(NamedTuple):
    """The verdict and what it is based on.

    `source` says whose metadata was evaluated: the controller's (authoritative, when
    --controller answered), a broker's image (may lag the controller by a moment), or
    none (nothing answered). `controller_reachable` is None when the controller was
    not asked: a broker's answer cannot tell whether the controller is up. `quorum`
    is None when it was not asked, or none of its controllers answered."""

    healthy: bool
    unhealthy_reasons: tuple[str, ...]
    source: str
    cluster_id: str
    controller_id: int
    controller_address: str | None
    controller_reachable: bool | None
    metadata_offset: int
    brokers: tuple[int, ...]  # every registered broker
    live_brokers: tuple[int, ...]  # unfenced and answering
    fenced_brokers: tuple[int, ...]
    unreachable_brokers: tuple[int, ...]  # unfenced, but did not answer the probe
    topic_count: int
    partition_count: int
    leaderless_partitions: tuple[PartitionHealth, ...]
    under_replicated_partitions: tuple[PartitionHealth, ...]
    errors: tuple[str, ...] = ()  # why an answer is missing, one line each
    # Replica directories the probed brokers set aside as stray (not a reason).
    stray_replicas: tuple[StrayReplicaHealth, ...] = ()
    offline_log_dirs: tuple[OfflineLogDirHealth, ...] = ()
    quorum: QuorumHealth | None = None

    @property
    def down_brokers(self) -> tuple[int, ...]:
        return tuple(sorted({*self.fenced_brokers, *self.unreachable_brokers}))

    def to_dict(self) -> dict[str, Any]:
        return {**_plain(self), "down_brokers": list(self.down_brokers)}

    def state_key(self) -> tuple[Any, ...]:
        """What `--watch` compares to decide the state changed (the metadata offset
        alone moving is not a change worth printing)."""
        d = self.to_dict()
        d.pop("metadata_offset")
        d.pop("errors")  # their wording carries timings and addresses
        # Of the quorum, who leads and who is down: its offsets and fetch times move
        # with every check.
        quorum = d.pop("quorum")
        if quorum is not None:
            d["quorum"] = (quorum["leader_id"], quorum["down_voters"])
        return tuple(sorted((k, repr(v)) for k, v in d.items()))


def is_under_replicated(replicas: Sequence[int], isr: Sequence[int]) -> bool:
    """Kafka's definition: fewer in-sync replicas than replicas."""
    return len(isr) < len(replicas)


def is_leaderless(leader: int) -> bool:
    return leader < 0


def evaluate_health(
    cluster: ClusterDescription | None,
    topics: Iterable[TopicDescription],
    *,
    source: str = SOURCE_BROKER,
    brokers_reachable: bool = True,
    controller_address: str | None = None,
    controller_reachable: bool | None = None,
    unreachable_brokers: Iterable[int] = (),
    errors: Iterable[str] = (),
    stray_replicas: Iterable[StrayReplicaHealth] = (),
    offline_log_dirs: Iterable[OfflineLogDirHealth] = (),
    quorum: QuorumHealth | None = None,
) -> ClusterHealth:
    """The health verdict over one view of the cluster.

    `cluster` None: nothing answered (no broker, no controller). `brokers_reachable`
    False: no bootstrap broker answered (the view may still be the controller's).
    `unreachable_brokers`: unfenced brokers that did not answer a probe. `quorum`:
    the controller quorum, when a controller of it answered."""
    reasons: set[str] = set()
    if not brokers_reachable:
        reasons.add(NO_BROKER_REACHABLE)
    if controller_reachable is False:
        reasons.add(CONTROLLER_UNREACHABLE)
    if quorum is not None:
        if quorum.leader_id < 0:
            reasons.add(NO_ACTIVE_CONTROLLER)
        if quorum.down_voters:
            reasons.add(CONTROLLER_VOTERS_DOWN)
    all_ids: tuple[int, ...] = ()
    fenced: tuple[int, ...] = ()
    unreachable: tuple[int, ...] = ()
    live: tuple[int, ...] = ()
    if cluster is not None:
        all_ids = tuple(sorted(b.node_id for b in cluster.brokers))
        fenced = tuple(sorted(b.node_id for b in cluster.brokers if b.is_fenced))
        unfenced = set(all_ids) - set(fenced)
        unreachable = tuple(sorted(set(unreachable_brokers) & unfenced))
        live = tuple(sorted(unfenced - set(unreachable)))
        if cluster.controller_id < 0:
            reasons.add(NO_CONTROLLER)
        if not live:
            reasons.add(NO_LIVE_BROKERS)
        if fenced or unreachable:
            reasons.add(BROKERS_DOWN)
    leaderless: list[PartitionHealth] = []
    under: list[PartitionHealth] = []
    topic_count = partition_count = 0
    for t in sorted(topics, key=lambda t: t.name):
        topic_count += 1
        for p in sorted(t.partitions, key=lambda p: p.partition):
            partition_count += 1
            entry = PartitionHealth(
                t.name, p.partition, p.leader, p.leader_epoch, tuple(p.replicas), tuple(p.isr)
            )
            if is_leaderless(p.leader):
                leaderless.append(entry)
            if is_under_replicated(p.replicas, p.isr):
                under.append(entry)
    offline = tuple(sorted(offline_log_dirs))
    if offline:
        reasons.add(OFFLINE_LOG_DIRS)
    if leaderless:
        reasons.add(LEADERLESS_PARTITIONS)
    if under:
        reasons.add(UNDER_REPLICATED_PARTITIONS)
    ordered = tuple(r for r in REASONS if r in reasons)
    return ClusterHealth(
        healthy=not ordered,
        unhealthy_reasons=ordered,
        source=source if cluster is not None else SOURCE_NONE,
        cluster_id=cluster.cluster_id if cluster is not None else "",
        controller_id=cluster.controller_id if cluster is not None else -1,
        controller_address=controller_address,
        controller_reachable=controller_reachable,
        metadata_offset=cluster.metadata_offset if cluster is not None else -1,
        brokers=all_ids,
        live_brokers=live,
        fenced_brokers=fenced,
        unreachable_brokers=unreachable,
        topic_count=topic_count,
        partition_count=partition_count,
        leaderless_partitions=tuple(leaderless),
        under_replicated_partitions=tuple(under),
        errors=tuple(errors),
        stray_replicas=tuple(sorted(stray_replicas)),
        offline_log_dirs=offline,
        quorum=quorum,
    )


# ------------------------------------------------------------------ rendering


def _ids(ids: Iterable[object]) -> str:
    return "[" + " ".join(map(str, ids)) + "]"


def _known(n: int, unit: str = "") -> str:
    return f"{n}{unit}" if n >= 0 else "-"  # -1 stands for unknown


def _voter_line(v: VoterHealth) -> str:
    """`Voter 1 at 127.0.0.1:9093: follower, log end 57, lag 0, last fetch 12 ms ago`."""
    state = v.role if v.answered else "no answer"
    return (
        f"Voter {v.node_id} at {v.address}: {state}{', DOWN' if v.down else ''}, "
        f"log end {_known(v.log_end_offset)}, lag {_known(v.lag)}, "
        f"last fetch {_known(v.last_fetch_ms_ago, ' ms ago')}"
    )


def _quorum_rows(health: ClusterHealth) -> list[tuple[str, str]]:
    """The quorum in three rows (none when --controller was not given)."""
    quorum = health.quorum
    if quorum is None:
        if health.controller_reachable is False:
            return [("Quorum leader:", "unknown (no controller answered)")]
        return []
    if quorum.leader_id >= 0:
        leader = (
            f"{quorum.leader_id} (epoch {quorum.leader_epoch}, "
            f"high watermark {quorum.high_watermark})"
        )
    else:
        leader = f"none (epoch {quorum.leader_epoch}: no majority, or an election under way)"
    return [
        ("Quorum leader:", leader),
        ("Quorum voters:", _ids(quorum.voters)),
        ("Quorum voters down:", _ids(quorum.down_voters)),
    ]


def render_text(health: ClusterHealth) -> str:
    """The `rpk cluster health` layout: one `Label: value` line per finding."""
    if health.controller_reachable is None:
        reachable = "unknown (pass --controller HOST:PORT to check)"
    elif health.controller_reachable:
        reachable = f"true ({health.controller_address})"
    else:
        reachable = f"false ({health.controller_address})"
    if health.source == SOURCE_CONTROLLER:
        source = f"controller (metadata offset {health.metadata_offset})"
    elif health.source == SOURCE_BROKER:
        source = f"a broker's image (metadata offset {health.metadata_offset})"
    else:
        source = "none: nothing answered"
    leaderless = health.leaderless_partitions
    under = health.under_replicated_partitions
    strays = health.stray_replicas
    quorum = health.quorum
    rows = [
        ("Healthy:", str(health.healthy).lower()),
        ("Unhealthy reasons:", _ids(health.unhealthy_reasons)),
        ("Cluster ID:", health.cluster_id or "-"),
        ("Controller ID:", str(health.controller_id)),
        ("Controller reachable:", reachable),
        *_quorum_rows(health),
        ("Metadata from:", source),
        ("All brokers:", _ids(health.brokers)),
        ("Live brokers:", _ids(health.live_brokers)),
        ("Brokers down:", _ids(health.down_brokers)),
        ("Fenced brokers:", _ids(health.fenced_brokers)),
        ("Unreachable brokers:", _ids(health.unreachable_brokers)),
        ("Topics / partitions:", f"{health.topic_count} / {health.partition_count}"),
        (f"Leaderless partitions ({len(leaderless)}):", _ids(leaderless)),
        (f"Under-replicated partitions ({len(under)}):", _ids(under)),
        (f"Offline log dirs ({len(health.offline_log_dirs)}):", _ids(health.offline_log_dirs)),
        (f"Stray replicas ({len(strays)}):", _ids(strays)),
    ]
    width = max(len(label) for label, _ in rows) + 2
    lines = ["CLUSTER HEALTH OVERVIEW", "======================="]
    lines += [label.ljust(width) + value for label, value in rows]
    lines += [_voter_line(v) for v in (quorum.voters if quorum is not None else ())]
    lines += [f"Offline log dir {d}: {d.error}" for d in health.offline_log_dirs]
    lines += [f"Error: {e}" for e in health.errors]
    return "\n".join(lines)
