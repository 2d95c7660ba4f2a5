"""runtime/faults.py: one fault runtime; each process names itself in logs and refusals."""

from __future__ import annotations

import logging

import pytest

import broker.faults
import controller.faults
from protocol.api import ApiKey
from protocol.api import api_name
from protocol.errors import ErrorCode
from protocol.messages import AlterPartitionRequest
from protocol.messages import FaultControlRequest
from protocol.messages import FaultRule
from runtime.faults import DROP
from runtime.faults import PROCEED


def drop_rule() -> FaultRule:
    return FaultRule(
        direction="in", api_key=int(ApiKey.ALTER_PARTITION), action="drop", remaining=1
    )


def test_disabled_faults_name_their_process() -> None:
    for faults, name in (
        (broker.faults.NO_FAULTS, "broker"),
        (controller.faults.NO_FAULTS, "controller"),
    ):
        answer = faults.control(FaultControlRequest())
        assert answer.error_code == ErrorCode.INVALID_REQUEST
        assert f"start the {name} with --enable-test-faults" in (answer.error_message or "")


async def test_controller_faults_log_as_controller(caplog: pytest.LogCaptureFixture) -> None:
    faults = controller.faults.TestFaults(node_id=0)
    faults.control(FaultControlRequest(add_rules=[drop_rule()]))
    body = AlterPartitionRequest(broker_id=2, broker_epoch=1, topics=[])
    with caplog.at_level(logging.WARNING):
        assert (
            await faults.before_answer(
                controller.faults.LISTENER, int(ApiKey.ALTER_PARTITION), body
            )
            == DROP
        )
        assert (
            await faults.before_answer(
                controller.faults.LISTENER, int(ApiKey.ALTER_PARTITION), body
            )
            is PROCEED
        )
    assert "TEST FAULT at controller 0: drop" in caplog.text
    assert faults.injected == 1


def test_api_name_names_unknown_keys_too() -> None:
    assert api_name(int(ApiKey.FETCH)) == "FETCH"
    assert api_name(4242) == "api 4242"
