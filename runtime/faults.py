"""Test-only fault controls, consulted before a process answers or sends an RPC; one
runtime for the broker and the controller.

Off by default: a `Faults` does nothing and the FaultControl API is not served. A
process started with `--enable-test-faults` (MINIBROKER_ENABLE_TEST_FAULTS=1) uses a
`TestFaults`, driven over the FaultControl API by scenario tests, which carries out
the decisions of protocol/fault_plan.py (matching rules, peer ids, CONTROLLER_PEER_ID):

incoming requests (the server, `before_answer`):
- delay: sleep delay_ms, then serve;
- drop: never serve; the connection is closed (the sender sees a lost request);
- drop_response: serve (side effects happen: a metadata change is committed), then
  close the connection instead of answering (the sender sees a lost answer);
- hold: park until a FaultControl with `release_held` or `clear`, then serve; a
  request held for HOLD_TIMEOUT_S, or beyond MAX_HELD parked requests, is dropped.
  The key use (KIP-903): hold broker A's AlterPartition at the controller while
  broker B is wiped and re-registers, then release it and watch it refused.
outgoing requests (runtime/peer_rpc.py, `before_send`; the wait counts against the
request timeout; a controller sends only to the other quorum voters, so "out" rules
match there only for quorum requests):
- delay: sleep, then send;
- drop: not sent; the caller gets a connection error (InjectedDrop -> RpcConnectionError);
- drop_response: sent, the answer is discarded and the connection closed;
- hold: parked as above, then sent (or failed as a connection error).

Every injected fault is logged at WARNING. Responses on one connection leave in
request order, so a held or delayed request also holds up the answers behind it on
that connection, as a slow request does in Kafka.
"""

from __future__ import annotations

import asyncio
import logging

from protocol.api import api_name
from protocol.errors import ErrorCode
from protocol.fault_plan import FaultPlan
from protocol.fault_plan import describe_rule
from protocol.fault_plan import peer_id_of
from protocol.messages import FaultControlRequest
from protocol.messages import FaultControlResponse
from protocol.messages import Message

log = logging.getLogger(__name__)

MAX_HELD = 1000
HOLD_TIMEOUT_S = 120.0

# What the request path does after `before_answer` / `before_send`.
PROCEED: str | None = None
DROP = "drop"
DROP_RESPONSE = "drop_response"


class InjectedDrop(ConnectionError):
    """An outgoing request lost to a test fault (peer_rpc.py turns it into RpcConnectionError)."""


class Faults:
    """No faults: what a production process runs with. `process` names it in the
    refusal of FaultControl ("broker", "controller")."""

    enabled = False
    protections_off: tuple[str, ...] = ()

    def __init__(self, process: str = "process") -> None:
        self.process = process

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
            error_message=(
                f"test faults are off; start the {self.process} with --enable-test-faults"
            ),
        )


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
    """Faults driven by FaultControl; see the module docstring for the actions. `role`
    names the process in the log lines ("TEST FAULT at node 3", "at controller 0")."""

    __test__ = False  # not a pytest test class
    enabled = True

    def __init__(
        self,
        *,
        node_id: int,
        protections_off: tuple[str, ...] = (),
        max_held: int = MAX_HELD,
        hold_timeout_s: float = HOLD_TIMEOUT_S,
        role: str = "node",
    ) -> None:
        super().__init__(role)
        self.node_id = node_id
        self.role = role
        self.protections_off = tuple(protections_off)
        self.plan = FaultPlan()
        self.held = HeldRequests(max_held=max_held, timeout_s=hold_timeout_s)
        self.injected = 0  # faults carried out so far (tests read it)

    async def before_answer(self, listener: str, api_key: int, body: Message) -> str | None:
        peer_id = peer_id_of(body)
        what = f"incoming {api_name(api_key)} from peer {peer_id} on {listener}"
        action, _ = await self._carry_out("in", api_key, peer_id, what)
        return action

    async def before_send(self, peer_id: int, api_key: int, peer: str) -> str | None:
        what = f"outgoing {api_name(api_key)} to peer {peer_id} ({peer})"
        action, problem = await self._carry_out("out", api_key, peer_id, what)
        if action == DROP:
            raise InjectedDrop(f"test fault: {problem}")
        return action

    async def _carry_out(
        self, direction: str, api_key: int, peer_id: int, what: str
    ) -> tuple[str | None, str]:
        """Sleep or park as the matching rule says, then (PROCEED, DROP or
        DROP_RESPONSE, what happened): a hold that fails (full, timed out) drops."""
        decision = self.plan.decide(direction, api_key, peer_id)
        if decision is None:
            return PROCEED, ""
        self.injected += 1
        log.warning(
            "TEST FAULT at %s %d: %s %s", self.role, self.node_id, decision.describe(), what
        )
        if decision.action == "delay":
            await asyncio.sleep(decision.delay_ms / 1000)
        elif decision.action == "hold":
            failed = await self.held.park()
            if failed is not None:
                log.warning("TEST FAULT: held %s dropped: %s", what, failed)
                return DROP, f"held {what} failed: {failed}"
            log.warning("TEST FAULT: held %s released", what)
        elif decision.action == "drop":
            return DROP, f"{what} dropped"
        else:
            return DROP_RESPONSE, ""
        return PROCEED, ""

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
            log.warning(
                "TEST FAULT rule added at %s %d: %s", self.role, self.node_id, describe_rule(rule)
            )
        if request.clear or released:
            log.warning(
                "TEST FAULTS at %s %d:%s released %d held request(s); %d rule(s) in force",
                self.role,
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
