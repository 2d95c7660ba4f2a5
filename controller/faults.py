"""The controller's test-only fault controls: the shared runtime (runtime/faults.py,
the rules in protocol/fault_plan.py). A controller answers brokers and clients ("in"
rules) and sends only to the other quorum voters ("out" rules, on the quorum's
requests); a held request is not inside the metadata writer, so the rest of the
cluster goes on while it waits.
"""

from __future__ import annotations

from runtime import faults
from runtime.faults import DROP
from runtime.faults import DROP_RESPONSE
from runtime.faults import PROCEED

__all__ = [
    "DROP",
    "DROP_RESPONSE",
    "NO_FAULTS",
    "PROCEED",
    "Faults",
    "TestFaults",
    "faults_for",
]

LISTENER = "controller"


class Faults(faults.Faults):
    """No faults: what a production controller runs with."""

    def __init__(self) -> None:
        super().__init__("controller")


class TestFaults(Faults, faults.TestFaults):
    """Faults driven by FaultControl; log lines say "TEST FAULT at controller <id>"."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        *,
        node_id: int,
        protections_off: tuple[str, ...] = (),
        max_held: int = faults.MAX_HELD,
        hold_timeout_s: float = faults.HOLD_TIMEOUT_S,
    ) -> None:
        faults.TestFaults.__init__(
            self,
            node_id=node_id,
            protections_off=protections_off,
            max_held=max_held,
            hold_timeout_s=hold_timeout_s,
            role="controller",
        )


NO_FAULTS = Faults()


def faults_for(node_id: int, *, enabled: bool, protections_off: tuple[str, ...]) -> Faults:
    """The controller's faults: test faults only with --enable-test-faults."""
    if enabled:
        return TestFaults(node_id=node_id, protections_off=protections_off)
    return NO_FAULTS
