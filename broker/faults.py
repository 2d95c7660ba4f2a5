"""Test-only fault controls, consulted before the broker answers or sends an RPC.

Off by default: `NO_FAULTS` does nothing and the FaultControl API is not served. A
broker started with `--enable-test-faults` (MINIBROKER_ENABLE_TEST_FAULTS=1) uses a
`TestFaults`, driven over the FaultControl API by scenario tests, which carries out
the decisions of protocol/fault_plan.py (matching rules, peer ids, CONTROLLER_PEER_ID):

incoming requests (network.py, `before_answer`):
- delay: sleep delay_ms, then serve;
- drop: never serve; the connection is closed (the sender sees a lost request);
- drop_response: serve (side effects happen), then close the connection instead of
  answering (the sender sees a lost answer);
- hold: park until a FaultControl with `release_held` or `clear`, then serve; a
  request held for HOLD_TIMEOUT_S, or beyond MAX_HELD parked requests, is dropped.
outgoing requests (rpc.py, `before_send`; the wait counts against the request timeout):
- delay: sleep, then send;
- drop: not sent; the caller gets a connection error (InjectedDrop -> RpcConnectionError);
- drop_response: sent, the answer is discarded and the connection closed;
- hold: parked as above, then sent (or failed as a connection error).

Every injected fault is logged at WARNING. Responses on one connection leave in
request order, so a held or delayed request also holds up the answers behind it on
that connection, as a slow request does in Kafka.

`--unsafe-skip-fsync` is carried out here too (`NoFsyncLogManager`): Log.flush does
nothing, so no log data is fsynced and the recovery point does not advance; the
recovery-point checkpoint then shows what a power loss could take.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from broker.storage.log import Log, LogConfig, TopicPartition
from broker.storage.log_manager import LogManager
from protocol.errors import ErrorCode
from protocol.fault_plan import (
    FaultDecision,
    FaultPlan,
    api_name,
    describe_rule,
    peer_id_of,
)
from protocol.messages import FaultControlRequest, FaultControlResponse, Message

log = logging.getLogger(__name__)

MAX_HELD = 1000
HOLD_TIMEOUT_S = 120.0

# What the request path does after `before_answer` / `before_send`.
PROCEED: str | None = None
DROP = "drop"
DROP_RESPONSE = "drop_response"


class InjectedDrop(ConnectionError):
    """An outgoing request lost to a test fault (rpc.py turns it into RpcConnectionError)."""


class Faults:
    """No faults: what a production broker runs with."""

    enabled = False
    protections_off: tuple[str, ...] = ()

    async def before_answer(self, listener: str, api_key: int, body: Message) -> str | None:
        """Before a handler runs for an incoming request: PROCEED, DROP or DROP_RESPONSE
        (after sleeping or parking as the rule says)."""
        return PROCEED

    async def before_send(self, peer_id: int, api_key: int, peer: str) -> str | None:
        """Before an outgoing request is written: PROCEED or DROP_RESPONSE (after
        sleeping or parking); raises InjectedDrop for a dropped request."""
        return PROCEED

    def control(self, request: FaultControlRequest) -> FaultControlResponse:
        return FaultControlResponse(
            error_code=int(ErrorCode.INVALID_REQUEST),
            error_message="test faults are off; start the broker with --enable-test-faults",
        )


NO_FAULTS = Faults()


class HeldRequests:
    """Requests parked by "hold" rules: bounded in number and in time."""

    def __init__(self, *, max_held: int = MAX_HELD, timeout_s: float = HOLD_TIMEOUT_S) -> None:
        self.max_held = max_held
        self.timeout_s = timeout_s
        self._waiting: set[asyncio.Future[None]] = set()

    def __len__(self) -> int:
        return len(self._waiting)

    async def park(self) -> str | None:
        """Wait for `release_all`. None when released, else why it failed (full, timeout)."""
        if len(self._waiting) >= self.max_held:
            return f"{self.max_held} requests are held already"
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.add(fut)
        try:
            async with asyncio.timeout(self.timeout_s):
                await fut
        except TimeoutError:
            return f"not released within {self.timeout_s:g}s"
        finally:
            # Also on cancellation (the connection went away): nothing to release.
            self._waiting.discard(fut)
        return None

    def release_all(self) -> int:
        waiting, self._waiting = self._waiting, set()
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)
        return len(waiting)


class TestFaults(Faults):
    """Faults driven by FaultControl; see the module docstring for the actions."""

    __test__ = False  # not a pytest test class
    enabled = True

    def __init__(
        self,
        *,
        node_id: int,
        protections_off: tuple[str, ...] = (),
        max_held: int = MAX_HELD,
        hold_timeout_s: float = HOLD_TIMEOUT_S,
    ) -> None:
        self.node_id = node_id
        self.protections_off = tuple(protections_off)
        self.plan = FaultPlan()
        self.held = HeldRequests(max_held=max_held, timeout_s=hold_timeout_s)
        self.injected = 0  # faults carried out so far (tests read it)

    def _log(self, decision: FaultDecision, what: str) -> None:
        self.injected += 1
        log.warning("TEST FAULT at node %d: %s %s", self.node_id, decision.describe(), what)

    async def before_answer(self, listener: str, api_key: int, body: Message) -> str | None:
        peer_id = peer_id_of(body)
        decision = self.plan.decide("in", api_key, peer_id)
        if decision is None:
            return PROCEED
        what = f"incoming {api_name(api_key)} from peer {peer_id} on {listener}"
        self._log(decision, what)
        if decision.action == "delay":
            await asyncio.sleep(decision.delay_ms / 1000)
            return PROCEED
        if decision.action == "hold":
            failed = await self.held.park()
            if failed is not None:
                log.warning("TEST FAULT: held %s dropped: %s", what, failed)
                return DROP
            log.warning("TEST FAULT: held %s released", what)
            return PROCEED
        return DROP if decision.action == "drop" else DROP_RESPONSE

    async def before_send(self, peer_id: int, api_key: int, peer: str) -> str | None:
        decision = self.plan.decide("out", api_key, peer_id)
        if decision is None:
            return PROCEED
        what = f"outgoing {api_name(api_key)} to peer {peer_id} ({peer})"
        self._log(decision, what)
        if decision.action == "delay":
            await asyncio.sleep(decision.delay_ms / 1000)
            return PROCEED
        if decision.action == "hold":
            failed = await self.held.park()
            if failed is not None:
                raise InjectedDrop(f"test fault: held {what} failed: {failed}")
            log.warning("TEST FAULT: held %s released", what)
            return PROCEED
        if decision.action == "drop":
            raise InjectedDrop(f"test fault: {what} dropped")
        return DROP_RESPONSE

    def control(self, request: FaultControlRequest) -> FaultControlResponse:
        """Apply a FaultControl: clear (releasing held requests), add rules, release."""
        try:
            self.plan.apply(request)
        except ValueError as exc:
            log.warning("FaultControl refused: %s", exc)
            return self._state(ErrorCode.INVALID_REQUEST, str(exc))
        released = 0
        if request.clear or request.release_held:
            released = self.held.release_all()
        for rule in request.add_rules:
            log.warning("TEST FAULT rule added at node %d: %s", self.node_id, describe_rule(rule))
        if request.clear or released:
            log.warning(
                "TEST FAULTS at node %d:%s released %d held request(s); %d rule(s) in force",
                self.node_id,
                " rules cleared," if request.clear else "",
                released,
                len(self.plan),
            )
        return self._state(ErrorCode.NONE, None)

    def _state(self, code: ErrorCode, message: str | None) -> FaultControlResponse:
        return FaultControlResponse(
            error_code=int(code),
            error_message=message,
            rules=self.plan.snapshot(),
            held=len(self.held),
            protections_off=list(self.protections_off),
        )


# ---------------------------------------------------------------------- skip fsync


class NoFsyncLogManager(LogManager):
    """--unsafe-skip-fsync: every log's `flush` is a no-op (no fsync, the recovery
    point stays where it is). Everything else, including checkpoints, is unchanged."""

    def __init__(self, data_dir: Path, default_config: LogConfig) -> None:
        super().__init__(data_dir, default_config)
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
