"""The rule engine of the test-only fault controls (FaultControl API), sans-I/O.

A process started with `--enable-test-faults` keeps one `FaultPlan`. Its request paths
ask `decide(direction, api_key, peer_id)` before serving an incoming request
(direction "in") or sending an outgoing one ("out"); the answer is the first matching
rule's action, and the asyncio glue (runtime/faults.py) carries it out: sleep,
drop, drop the response, or park.

Matching, in rule order (the first match wins):
- `direction` equal;
- `api_key` equal, or the rule's api_key is ANY_API (-1: every API but FaultControl);
- the rule's `peer_id` is ANY_PEER (-1) or equals the request's peer id.

Peer ids:
- incoming: the sender's node id when the request body names it (`replica_id` of
  Fetch / ListOffsets / OffsetsForLeaderEpoch, `broker_id` of AlterPartition /
  BrokerRegistration / BrokerHeartbeat / FetchMetadata), else -1 (clients; a
  consumer's Fetch has replica_id -1 too);
- outgoing: the destination's node id; the controller is CONTROLLER_PEER_ID (-1000),
  whatever its --node-id, because a broker only knows the controller's address.

A rule with `remaining` > 0 is consumed by each match and dropped when it reaches 0;
-1 applies until cleared. FaultControl itself is never subject to a rule, so a test
can always clear what it set.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from protocol.api import ApiKey
from protocol.api import api_name
from protocol.messages import FaultControlRequest
from protocol.messages import FaultRule
from protocol.messages import Message

ACTIONS = ("delay", "drop", "drop_response", "hold")
DIRECTIONS = ("in", "out")
MAX_RULES = 100
MAX_DELAY_MS = 60_000
ANY_API = -1
ANY_PEER = -1
UNLIMITED = -1
# Peer id of the controller in outgoing rules of a broker.
CONTROLLER_PEER_ID = -1000
# Peer id of an incoming request whose body does not name its sender.
UNKNOWN_PEER_ID = -1

# Fields of a request body that name the sending node, in the order they are tried.
_PEER_FIELDS = ("replica_id", "broker_id")


class FaultDecision(NamedTuple):
    """What to do with one request: `action` is one of ACTIONS."""

    action: str
    delay_ms: int
    rule: FaultRule  # a copy of the rule as it matched (remaining before this use)

    def describe(self) -> str:
        text = self.action if self.action != "delay" else f"delay {self.delay_ms} ms"
        left = self.rule.remaining
        return text if left == UNLIMITED else f"{text} (rule had {left} use(s) left)"


def peer_id_of(body: Message) -> int:
    """The node id an incoming request names as its sender, else UNKNOWN_PEER_ID."""
    for name in _PEER_FIELDS:
        value = getattr(body, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return UNKNOWN_PEER_ID


def describe_rule(rule: FaultRule) -> str:
    peer = "any peer" if rule.peer_id == ANY_PEER else f"peer {rule.peer_id}"
    action = rule.action if rule.action != "delay" else f"delay {rule.delay_ms} ms"
    times = "until cleared" if rule.remaining == UNLIMITED else f"{rule.remaining} time(s)"
    api = "ANY_API" if rule.api_key == ANY_API else api_name(rule.api_key)
    return f"{action} {rule.direction} {api} {peer} {times}"


def validate_rule(rule: FaultRule) -> None:
    """Raise ValueError naming what is wrong with `rule`."""
    if rule.action not in ACTIONS:
        raise ValueError(f"unknown fault action {rule.action!r}; use one of {', '.join(ACTIONS)}")
    if rule.direction not in DIRECTIONS:
        raise ValueError(f"unknown fault direction {rule.direction!r}; use 'in' or 'out'")
    if rule.api_key == ApiKey.FAULT_CONTROL:
        raise ValueError("FaultControl itself cannot be faulted (a test could not undo it)")
    if rule.api_key != ANY_API:
        try:
            ApiKey(rule.api_key)
        except ValueError:
            raise ValueError(
                f"unknown api_key {rule.api_key}; use an ApiKey value or -1 for every API"
            ) from None
    if not 0 <= rule.delay_ms <= MAX_DELAY_MS:
        raise ValueError(f"delay_ms {rule.delay_ms} is outside 0..{MAX_DELAY_MS}")
    if rule.remaining != UNLIMITED and rule.remaining < 1:
        raise ValueError(f"remaining {rule.remaining} must be >= 1, or -1 for until cleared")


class FaultPlan:
    """The rules in force at one node. Not thread-safe (one event loop)."""

    def __init__(self, rules: list[FaultRule] | None = None) -> None:
        self._rules: list[FaultRule] = []
        if rules:
            self.add(rules)

    def __len__(self) -> int:
        return len(self._rules)

    def snapshot(self) -> list[FaultRule]:
        """Copies of the rules in force, in match order."""
        return [msgspec.structs.replace(rule) for rule in self._rules]

    def clear(self) -> None:
        self._rules.clear()

    def add(self, rules: list[FaultRule]) -> None:
        """Validate every rule first: either all are added or none (ValueError)."""
        for index, rule in enumerate(rules):
            try:
                validate_rule(rule)
            except ValueError as exc:
                raise ValueError(f"rule {index}: {exc}") from None
        if len(self._rules) + len(rules) > MAX_RULES:
            raise ValueError(
                f"too many fault rules: {len(self._rules)} in force + {len(rules)} new > "
                f"{MAX_RULES}; clear some first"
            )
        self._rules.extend(msgspec.structs.replace(rule) for rule in rules)

    def apply(self, request: FaultControlRequest) -> None:
        """`clear` then `add_rules`, atomically: a ValueError changes nothing.
        (`release_held` and releasing on `clear` are the I/O layer's part.)"""
        kept = [] if request.clear else self._rules
        trial = FaultPlan()
        trial._rules = list(kept)
        trial.add(request.add_rules)
        self._rules = trial._rules

    def decide(self, direction: str, api_key: int, peer_id: int) -> FaultDecision | None:
        """The first matching rule's decision (consuming one use of it), or None."""
        if api_key == ApiKey.FAULT_CONTROL:
            return None
        for index, rule in enumerate(self._rules):
            if rule.direction != direction:
                continue
            if rule.api_key != ANY_API and rule.api_key != api_key:
                continue
            if rule.peer_id != ANY_PEER and rule.peer_id != peer_id:
                continue
            decision = FaultDecision(rule.action, rule.delay_ms, msgspec.structs.replace(rule))
            if rule.remaining != UNLIMITED:
                rule.remaining -= 1
                if rule.remaining <= 0:
                    del self._rules[index]
            return decision
        return None
