"""Test-only fault controls of the controller: the switches, FaultControl served only
with --enable-test-faults, what each action does to a real connection, the KIP-903
staging (hold an AlterPartition while a broker re-registers), and
--unsafe-keep-restarted-replicas-in-isr."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from wire_client import Client

from controller.__main__ import main
from controller.app import ControllerProcess
from controller.config import TEST_FAULTS_ENV
from controller.config import ControllerConfig
from controller.faults import NO_FAULTS
from controller.faults import TestFaults
from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import AlterPartitionPartition
from protocol.messages import AlterPartitionRequest
from protocol.messages import AlterPartitionResponse
from protocol.messages import AlterPartitionTopic
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import BrokerHeartbeatRequest
from protocol.messages import BrokerRegistrationRequest
from protocol.messages import BrokerState
from protocol.messages import CreatableReplicaAssignment
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import FaultControlRequest
from protocol.messages import FaultControlResponse
from protocol.messages import FaultRule
from protocol.messages import Listener
from protocol.messages import Message

ALTER = int(ApiKey.ALTER_PARTITION)


@pytest.fixture(autouse=True)
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEST_FAULTS_ENV, raising=False)


# ------------------------------------------------------------------ switches


def test_config_switches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert ControllerConfig().enable_test_faults is False
    with pytest.raises(ValueError, match="--enable-test-faults"):
        ControllerConfig(unsafe_keep_restarted_replicas_in_isr=True)
    with pytest.raises(ValueError, match=TEST_FAULTS_ENV):
        ControllerConfig(unsafe_ignore_broker_epochs=True)
    config = ControllerConfig(
        enable_test_faults=True,
        unsafe_keep_restarted_replicas_in_isr=True,
        unsafe_ignore_broker_epochs=True,
    )
    assert config.protections_off == (
        "unsafe-ignore-broker-epochs",
        "unsafe-keep-restarted-replicas-in-isr",
    )
    monkeypatch.setenv(TEST_FAULTS_ENV, "1")
    assert ControllerConfig().enable_test_faults is True


def test_cli_switches(captured: list[ControllerConfig]) -> None:
    runner = CliRunner()
    refused = runner.invoke(main, ["--unsafe-keep-restarted-replicas-in-isr"])
    assert refused.exit_code == 2 and "--enable-test-faults" in refused.output
    assert captured == []
    ok = runner.invoke(main, ["--enable-test-faults", "--unsafe-keep-restarted-replicas-in-isr"])
    assert ok.exit_code == 0, ok.output
    by_env = runner.invoke(main, ["--unsafe-ignore-broker-epochs"], env={TEST_FAULTS_ENV: "1"})
    assert by_env.exit_code == 0, by_env.output
    first, second = captured
    assert first.enable_test_faults and first.unsafe_keep_restarted_replicas_in_isr
    assert second.enable_test_faults and second.unsafe_ignore_broker_epochs
    help_text = runner.invoke(main, ["--help"], terminal_width=200).output
    assert "--enable-test-faults" in help_text
    assert "--unsafe-keep-restarted-replicas-in-isr" in help_text


async def test_fault_control_only_with_test_faults(make_harness, tmp_path: Path) -> None:
    plain = await make_harness(tmp_path / "plain")
    assert plain.handlers.faults is NO_FAULTS
    assert ALTER in plain.handlers.handlers
    assert int(ApiKey.FAULT_CONTROL) not in plain.handlers.handlers
    on = await make_harness(tmp_path / "on", enable_test_faults=True)
    assert isinstance(on.handlers.faults, TestFaults)
    assert int(ApiKey.FAULT_CONTROL) in on.handlers.handlers
    versions = await on.handlers.api_versions(ApiVersionsRequest())
    assert int(ApiKey.FAULT_CONTROL) in {k.api_key for k in versions.api_keys}
    resp = await on.handlers.fault_control(
        FaultControlRequest(add_rules=[FaultRule(api_key=ALTER, action="hold")])
    )
    assert resp.error_code == 0 and [r.action for r in resp.rules] == ["hold"]
    bad = await on.handlers.fault_control(
        FaultControlRequest(add_rules=[FaultRule(api_key=ALTER, action="hold", delay_ms=10**6)])
    )
    assert bad.error_code == ErrorCode.INVALID_REQUEST and "delay_ms" in (bad.error_message or "")


# ------------------------------------------------------------------ keep restarted in ISR


async def _rf3_topic(h) -> None:
    for b in (1, 2, 3):
        await h.start_broker(b)
    await h.create_assigned("t", [[1, 2, 3]])


async def test_restarted_replica_leaves_the_isr_by_default(harness) -> None:
    await _rf3_topic(harness)
    await harness.register(2)
    state = harness.partition("t")
    assert state.isr == [1, 3] and state.leader == 1


async def test_keep_restarted_replicas_in_isr(make_harness, tmp_path: Path, caplog) -> None:
    h = await make_harness(
        tmp_path / "c", enable_test_faults=True, unsafe_keep_restarted_replicas_in_isr=True
    )
    assert "UNSAFE TEST SWITCH --unsafe-keep-restarted-replicas-in-isr is ON" in caplog.text
    await _rf3_topic(h)
    before = h.partition("t")
    reg = await h.register(2)  # a follower restarts: stays in the ISR, nothing changes
    assert h.partition("t") == before
    assert not (await h.heartbeat(2, reg.broker_epoch)).is_fenced
    await h.register(1)  # the leader restarts: leadership moves, the ISR stays whole
    after = h.partition("t")
    assert after.leader == 2 and after.isr == [1, 2, 3]
    assert after.leader_epoch == before.leader_epoch + 1
    assert "registers again and stays in its ISRs" in caplog.text


# ------------------------------------------------------------------ over a real connection


@pytest.fixture
async def process(tmp_path: Path):
    proc = ControllerProcess(
        ControllerConfig(data_dir=tmp_path / "c", listen_port=0, enable_test_faults=True)
    )
    await proc.start()
    try:
        yield proc
    finally:
        await proc.stop()


async def register(proc: ControllerProcess, broker_id: int) -> int:
    """Register a new incarnation and unfence it; the broker epoch."""
    handlers = proc.handlers
    assert handlers is not None
    reg = await handlers.broker_registration(
        BrokerRegistrationRequest(
            broker_id=broker_id,
            incarnation_id=uuid.uuid4().hex,
            listeners=[Listener(name="PLAINTEXT", host="127.0.0.1", port=9100 + broker_id)],
        )
    )
    assert reg.error_code == 0
    beat = await handlers.broker_heartbeat(
        BrokerHeartbeatRequest(
            broker_id=broker_id,
            broker_epoch=reg.broker_epoch,
            current_metadata_offset=handlers.image.last_offset,
        )
    )
    assert not beat.is_fenced
    return reg.broker_epoch


def add_to_isr(proc: ControllerProcess, epochs: dict[int, int], isr: list[int]) -> Message:
    assert proc.handlers is not None
    topic = proc.handlers.image.topic_by_name("t")
    assert topic is not None
    state = topic.partitions[0]
    return AlterPartitionRequest(
        broker_id=state.leader,
        broker_epoch=epochs[state.leader],
        topics=[
            AlterPartitionTopic(
                topic_name="t",
                partitions=[
                    AlterPartitionPartition(
                        partition_index=0,
                        leader_epoch=state.leader_epoch,
                        partition_epoch=state.partition_epoch,
                        new_isr_with_epochs=[
                            BrokerState(broker_id=b, broker_epoch=epochs[b]) for b in isr
                        ],
                    )
                ],
            )
        ],
    )


async def test_held_alter_partition_refused_after_a_wipe(process: ControllerProcess) -> None:
    """KIP-903 staged: A's AlterPartition adding B is held while B re-registers with a new
    broker epoch; released, the controller refuses it."""
    assert process.server is not None and process.handlers is not None
    port = process.server.address[1]
    epochs = {1: await register(process, 1), 2: await register(process, 2)}
    created = await process.handlers.create_topics(
        CreateTopicsRequest(
            topics=[
                CreatableTopic(
                    name="t",
                    assignments=[CreatableReplicaAssignment(partition_index=0, broker_ids=[1, 2])],
                )
            ]
        )
    )
    assert created.topics[0].error_code == 0
    epochs[2] = await register(process, 2)  # B restarts once: out of the ISR
    assert process.handlers.image.topic_by_name("t").partitions[0].isr == [1]  # type: ignore[union-attr]

    admin = await Client.connect(port)
    state = await admin.call(
        FaultControlRequest(add_rules=[FaultRule(api_key=ALTER, action="hold", peer_id=1)])
    )
    assert isinstance(state, FaultControlResponse) and len(state.rules) == 1

    leader = await Client.connect(port)
    held = leader.send(add_to_isr(process, epochs, [1, 2]))
    await asyncio.sleep(0.1)
    state = await admin.call(FaultControlRequest())
    assert state.held == 1
    # Meanwhile B is wiped and registers again: a new broker epoch. The controller is
    # not blocked by the held request.
    new_epoch = await register(process, 2)
    assert new_epoch > epochs[2]
    state = await admin.call(FaultControlRequest(clear=True))
    assert state.held == 0 and state.rules == []
    response = await leader.receive(held)
    assert isinstance(response.body, AlterPartitionResponse)
    result = response.body.topics[0].partitions[0]
    assert result.error_code == ErrorCode.INELIGIBLE_REPLICA
    assert process.handlers.image.topic_by_name("t").partitions[0].isr == [1]  # type: ignore[union-attr]
    await admin.close()
    await leader.close()


async def test_drop_drop_response_and_delay(process: ControllerProcess) -> None:
    assert process.server is not None and process.handlers is not None
    port = process.server.address[1]
    admin = await Client.connect(port)
    create = int(ApiKey.CREATE_TOPICS)
    await admin.call(
        FaultControlRequest(
            add_rules=[
                FaultRule(api_key=create, action="drop", remaining=1),
                FaultRule(api_key=create, action="drop_response", remaining=1),
                FaultRule(api_key=int(ApiKey.API_VERSIONS), action="delay", delay_ms=150),
            ]
        )
    )
    await register(process, 1)
    request = CreateTopicsRequest(topics=[CreatableTopic(name="x")])

    dropped = await Client.connect(port)
    with pytest.raises(ConnectionError):
        await dropped.receive(dropped.send(request))
    assert process.handlers.image.topic_by_name("x") is None  # never served

    lost_answer = await Client.connect(port)
    with pytest.raises(ConnectionError):
        await lost_answer.receive(lost_answer.send(request))
    assert process.handlers.image.topic_by_name("x") is not None  # served, answer lost

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    versions = await admin.call(ApiVersionsRequest())
    assert loop.time() - t0 >= 0.14
    assert isinstance(versions, ApiVersionsResponse)
    state = await admin.call(FaultControlRequest())
    assert [r.action for r in state.rules] == ["delay"]  # the others are used up
    for client in (admin, dropped, lost_answer):
        await client.close()


async def test_held_request_of_a_closed_connection_is_forgotten(
    process: ControllerProcess,
) -> None:
    assert process.server is not None
    port = process.server.address[1]
    admin = await Client.connect(port)
    await admin.call(FaultControlRequest(add_rules=[FaultRule(api_key=ALTER, action="hold")]))
    gone = await Client.connect(port)
    gone.send(AlterPartitionRequest(broker_id=1, broker_epoch=1, topics=[]))
    await asyncio.sleep(0.1)
    assert (await admin.call(FaultControlRequest())).held == 1
    await gone.close()
    for _ in range(50):
        if (await admin.call(FaultControlRequest())).held == 0:
            break
        await asyncio.sleep(0.02)
    assert (await admin.call(FaultControlRequest())).held == 0
    await admin.close()
