"""invariant(): kept under `python -O`, lazy messages."""

from __future__ import annotations

import subprocess
import sys

import pytest

from protocol.invariants import InvariantError
from protocol.invariants import invariant


def test_a_broken_invariant_raises_with_its_message() -> None:
    invariant(True, "never seen")
    with pytest.raises(InvariantError, match="high watermark went back 7 -> 5"):
        invariant(False, "high watermark went back 7 -> 5")
    assert issubclass(InvariantError, AssertionError)


def test_a_callable_message_is_built_only_on_failure() -> None:
    built: list[int] = []

    def message() -> str:
        built.append(1)
        return "epoch went back"

    invariant(1 < 2, message)
    assert built == []
    with pytest.raises(InvariantError, match="epoch went back"):
        invariant(2 < 1, message)
    assert built == [1]


def test_python_dash_o_keeps_the_check() -> None:
    """What `assert` cannot do: under -O the check still raises."""
    code = (
        "from protocol.invariants import InvariantError, invariant\n"
        "assert False, 'asserts are gone under -O'\n"
        "try:\n"
        "    invariant(False, 'kept')\n"
        "except InvariantError as exc:\n"
        "    print('raised', exc)\n"
    )
    done = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "raised kept"
