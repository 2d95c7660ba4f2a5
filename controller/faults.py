"""Test-only fault controls of the controller: the FaultControl API and what it does
to incoming requests. Off by default (`NO_FAULTS`, FaultControl not served); on with
`--enable-test-faults` (MINIBROKER_ENABLE_TEST_FAULTS=1).

The rules and their matching are protocol/fault_plan.py's (peer id of an incoming
request: the `broker_id` / `replica_id` in its body, else -1). The controller only
answers, so only "in" rules ever match here:
- delay: sleep delay_ms, then serve;
- drop: never serve; the connection is closed (the broker sees a lost request);
- drop_response: serve (the metadata change is committed), then close the connection
  instead of answering;
- hold: park until a FaultControl with `release_held` or `clear`, then serve. The
  key use (KIP-903, seed scenario 8): hold broker A's AlterPartition while broker B is
  wiped and re-registers, then release it and watch the controller refuse it. At most
  MAX_HELD requests are parked and each for at most HOLD_TIMEOUT_S; past either the
  request is dropped. A held request is not inside the metadata writer, so the rest
  of the cluster goes on; answers behind it on the same connection wait for it.

Every injected fault is logged at WARNING.
"""

from __future__ import annotations

import asyncio
import logging

from protocol.errors import ErrorCode
from protocol.fault_plan import FaultPlan, api_name, describe_rule, peer_id_of
from protocol.messages import FaultControlRequest, FaultControlResponse, Message

log = logging.getLogger(__name__)

MAX_HELD = 1000
HOLD_TIMEOUT_S = 120.0

PROCEED: str | None = None
DROP = "drop"
DROP_RESPONSE = "drop_response"


class Faults:
    """No faults: what a production controller runs with."""

    enabled = False
    protections_off: tuple[str, ...] = ()

    async def before_answer(self, api_key: int, body: Message) -> str | None:
        return PROCEED

    def control(self, request: FaultControlRequest) -> FaultControlResponse:
        return FaultControlResponse(
            error_code=int(ErrorCode.INVALID_REQUEST),
            error_message="test faults are off; start the controller with --enable-test-faults",
        )


NO_FAULTS = Faults()


class TestFaults(Faults):
    """Faults driven by FaultControl; see the module docstring."""

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
        self.max_held = max_held
        self.hold_timeout_s = hold_timeout_s
        self._held: set[asyncio.Future[None]] = set()
        self.injected = 0

    @property
    def held(self) -> int:
        return len(self._held)

    async def before_answer(self, api_key: int, body: Message) -> str | None:
        peer_id = peer_id_of(body)
        decision = self.plan.decide("in", api_key, peer_id)
        if decision is None:
            return PROCEED
        self.injected += 1
        what = f"incoming {api_name(api_key)} from peer {peer_id}"
        log.warning("TEST FAULT at controller %d: %s %s", self.node_id, decision.describe(), what)
        if decision.action == "delay":
            await asyncio.sleep(decision.delay_ms / 1000)
            return PROCEED
        if decision.action == "hold":
            failed = await self._park()
            if failed is not None:
                log.warning("TEST FAULT: held %s dropped: %s", what, failed)
                return DROP
            log.warning("TEST FAULT: held %s released", what)
            return PROCEED
        return DROP if decision.action == "drop" else DROP_RESPONSE

    async def _park(self) -> str | None:
        if len(self._held) >= self.max_held:
            return f"{self.max_held} requests are held already"
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._held.add(fut)
        try:
            async with asyncio.timeout(self.hold_timeout_s):
                await fut
        except TimeoutError:
            return f"not released within {self.hold_timeout_s:g}s"
        finally:
            self._held.discard(fut)  # also when the connection went away
        return None

    def _release_all(self) -> int:
        held, self._held = self._held, set()
        for fut in held:
            if not fut.done():
                fut.set_result(None)
        return len(held)

    def control(self, request: FaultControlRequest) -> FaultControlResponse:
        try:
            self.plan.apply(request)
        except ValueError as exc:
            log.warning("FaultControl refused: %s", exc)
            return self._state(ErrorCode.INVALID_REQUEST, str(exc))
        released = self._release_all() if request.clear or request.release_held else 0
        for rule in request.add_rules:
            log.warning(
                "TEST FAULT rule added at controller %d: %s", self.node_id, describe_rule(rule)
            )
        if request.clear or released:
            log.warning(
                "TEST FAULTS at controller %d:%s released %d held request(s); %d rule(s) in force",
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
            held=self.held,
            protections_off=list(self.protections_off),
        )
