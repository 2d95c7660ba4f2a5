"""`minibroker dev --secure` as a user runs it (issue 18): SASL_SSL with SCRAM on every
listener and between the servers, ACLs on, an admin user, and the client settings it
prints, pasted as printed:

- minibroker's CLI with the printed `export` line creates a topic, produces and
  consumes; kafka-python and confluent-kafka with the printed lines produce and read
  over SASL_SSL on the Kafka listeners; kcat (Debian's, librdkafka 2.0) with its line
  lists the topic;
- a client without credentials, with a plaintext connection or a wrong password is
  refused; a user without ACLs is refused the topic (the authorizer is on);
- the image's healthcheck probes the SASL_SSL controller and broker over TLS (without
  the fix it spoke plaintext to a SASL_SSL controller, so the secure compose cluster
  never got healthy);
- a restart reuses the certificates and both passwords byte for byte, keeps the
  admin's credentials, and the records are there;
- with `--controllers 3` the quorum (voters by certificate, brokers by SASL) forms and
  serves the admin.
"""

from __future__ import annotations

import ast
import asyncio
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster import CLI
from cluster import CLI_ENV
from cluster import run_command
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from dev_process import DevProcess
from dev_process import pids_mentioning
from kafka import KafkaConsumer
from kafka import KafkaProducer
from kafka import TopicPartition as KTopicPartition

from client import create_ssl_context
from client.connection import BrokerConnection
from protocol.messages import DescribeQuorumRequest
from protocol.messages import DescribeQuorumResponse
from runtime.sasl import SaslCredentials

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

MB = shlex.join(CLI)


def settings_of(dev: DevProcess) -> dict[str, str]:
    """Every line `dev` printed, by what it is: `key: value` lines by key, the pasteable
    line under each `client:` header by the client's name."""
    dev.wait_for_bootstrap("Press Ctrl-C")
    lines = "".join(dev.stdout).splitlines()
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        if line.endswith(":") and i + 1 < len(lines) and lines[i + 1].startswith("  "):
            out[line[:-1]] = lines[i + 1].strip()
        elif ": " in line and not line.startswith(" "):
            key, _, value = line.partition(": ")
            out.setdefault(key, value)
    return out


def with_printed_env(settings: dict[str, str], script: str) -> subprocess.CompletedProcess[str]:
    """`script` in bash after the printed `export` line, as a user pastes it."""
    return run_command(
        ["bash", "-c", f"{settings['minibroker CLI (bash)']}\n{script}"], timeout=90, env=CLI_ENV
    )


def kafka_python_settings(settings: dict[str, str]) -> dict[str, object]:
    """The printed KafkaProducer(...) line's keyword arguments, as Python reads them."""
    line = settings["kafka-python"]
    ast.parse(line, mode="eval")
    return eval(line, {"KafkaProducer": lambda **kw: kw, "open": open})


def confluent_settings(settings: dict[str, str]) -> dict[str, str]:
    line = settings["confluent-kafka"]
    ast.parse(line, mode="eval")
    return eval(line, {"Producer": lambda conf: conf, "open": open})


def secure_snapshot(data_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((data_dir / "secure").iterdir())}


def stop_and_sweep(dev: DevProcess) -> int:
    code = dev.stop(signal.SIGINT)
    deadline = time.monotonic() + 10
    while pids_mentioning(str(dev.data_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids_mentioning(str(dev.data_dir)):
        os.kill(pid, signal.SIGKILL)
    return code


def read_values(settings: dict[str, str], topic: str, count: int) -> list[str]:
    consumer = KafkaConsumer(
        **kafka_python_settings(settings), auto_offset_reset="earliest", consumer_timeout_ms=20_000
    )
    try:
        consumer.assign([KTopicPartition(topic, p) for p in range(2)])
        got = []
        for message in consumer:
            got.append(message.value.decode())
            if len(got) == count:
                break
        return got
    finally:
        consumer.close()


def check_kcat(settings: dict[str, str], topic: str) -> None:
    """kcat with the printed line lists the topic. kcat 1.7 on librdkafka 2.0 starts
    SASL only if ApiVersions offers SaslHandshake v0, which the Kafka listener serves."""
    if shutil.which("kcat") is None:
        pytest.fail("KCAT IS MISSING: run tests/install_tools.sh (apt-get install kcat)")
    run = run_command(["bash", "-c", settings["kcat"] + " -m 20"], timeout=60, env=CLI_ENV)
    assert run.returncode == 0, run.stderr
    assert f'topic "{topic}"' in run.stdout, run.stdout


def check_healthcheck_probes(dev: DevProcess) -> None:
    """The image's probe, on the same servers: the controller is SASL_SSL too."""
    sys.path.insert(0, str(REPO / "docker"))
    try:
        import healthcheck
    finally:
        sys.path.pop(0)
    for role, where in (("controller", "controller"), ("broker", "broker-1")):
        (pid,) = pids_mentioning(str(dev.data_dir / where) + " ")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        args = argv[argv.index(role) + 1 :]
        server = healthcheck.Server(pid, role, [a for a in args if a], {}, REPO)
        secure = healthcheck.ssl_listener_names(server)
        assert secure == ({"CONTROLLER"} if role == "controller" else {"NATIVE", "KAFKA"})
        targets = healthcheck.probe_addresses(
            role,
            healthcheck.listen_setting(server),
            healthcheck.kafka_listener_names(server),
            (secure, healthcheck.probe_tls(server)),
        )
        deadline = time.monotonic() + 20
        assert all(healthcheck.probe(t, deadline) > 0 for t in targets), role


def test_dev_secure_prints_settings_that_work_refuses_strangers_and_restarts_the_same(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    dev = DevProcess(data, 2, "--secure")
    try:
        settings = settings_of(dev)
        assert "user admin created" in dev.output()
        assert settings["security protocol"].startswith("SASL_SSL")
        assert settings["user"].startswith("admin")
        ca, password_file = Path(settings["ca file"]), Path(settings["password file"])
        assert ca == data.absolute() / "secure" / "ca.pem"
        assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
        assert stat.S_IMODE((data / "secure").stat().st_mode) == 0o700
        password = password_file.read_text().strip()
        assert password not in dev.output()  # read from its file by each line, never shown

        # minibroker's CLI, as pasted.
        cli = with_printed_env(
            settings,
            f"{MB} topic create t -p 2 -r 2 && seq 1 100 | {MB} produce t --acks all && "
            f"{MB} consume t --from-beginning -n 100 --timeout-ms 30000",
        )
        assert cli.returncode == 0, cli.stderr
        assert "created topic t" in cli.stdout
        assert sorted(cli.stdout.splitlines()[1:], key=int) == [str(i) for i in range(1, 101)]

        # kafka-python and confluent-kafka on the Kafka listeners, as printed.
        producer = KafkaProducer(**kafka_python_settings(settings))
        try:
            producer.send("t", b"kafka-python", partition=0).get(timeout=30)
        finally:
            producer.close()
        conf = confluent_settings(settings)
        confluent = ConfluentProducer(conf)
        confluent.produce("t", b"confluent-kafka", partition=1)
        assert confluent.flush(30) == 0
        del confluent  # librdkafka's threads go with it, not when the cluster is gone
        got = read_values(settings, "t", 102)
        assert sorted(got) == sorted(
            [str(i) for i in range(1, 101)] + ["kafka-python", "confluent-kafka"]
        )
        consumer = ConfluentConsumer(
            {**conf, "group.id": "g", "auto.offset.reset": "earliest", "enable.auto.commit": False}
        )
        try:
            consumer.subscribe(["t"])
            message = None
            deadline = time.monotonic() + 30
            while message is None and time.monotonic() < deadline:
                message = consumer.poll(1.0)
                if message is not None and message.error() is not None:
                    message = None
            assert message is not None, "confluent-kafka read nothing as admin"
        finally:
            consumer.close()
        check_kcat(settings, "t")

        # Strangers: no SASL, no TLS, a wrong password; a user without ACLs.
        bootstrap = settings["bootstrap"]
        refused = [
            ("--security-protocol", "SSL", "--ssl-cafile", str(ca)),
            ("--security-protocol", "PLAINTEXT"),
        ]
        for flags in refused:
            run = run_command(
                [*CLI, "-b", bootstrap, *flags, "topic", "list"], timeout=60, env=CLI_ENV
            )
            assert run.returncode == 1 and "t" not in run.stdout.split(), (flags, run.stdout)
        wrong = with_printed_env(settings, f"MINIBROKER_CLIENT_SASL_PASSWORD=wrong {MB} topic list")
        assert wrong.returncode == 1 and "SASL" in wrong.stderr, wrong.stderr
        bob = with_printed_env(
            settings,
            f"echo bob-secret | {MB} user create bob --password-stdin && "
            "export MINIBROKER_CLIENT_SASL_USERNAME=bob MINIBROKER_CLIENT_SASL_PASSWORD=bob-secret"
            f" && echo x | {MB} produce t",
        )
        assert bob.returncode == 1, bob.stderr
        # Refused by the authorizer (an idempotent producer first asks for a producer id).
        assert "AUTHORIZATION_FAILED" in bob.stderr and "User:bob" in bob.stderr, bob.stderr

        # The control commands under --secure: a broker restarted is checked over
        # SASL_SSL and serves the admin again.
        for command in ("kill", "restart"):
            control = run_command(
                [*CLI, "dev", command, "2", "--data-dir", str(data)], timeout=90, env=CLI_ENV
            )
            assert control.returncode == 0, control.stderr
        again = with_printed_env(
            settings, f"{MB} consume t --from-beginning -n 100 --timeout-ms 30000"
        )
        assert again.returncode == 0, again.stderr

        check_healthcheck_probes(dev)
    finally:
        first_stop = stop_and_sweep(dev)
    assert first_stop == 0, dev.output()

    before = secure_snapshot(data)
    again = DevProcess(data, 2, "--secure")
    try:
        settings = settings_of(again)
        assert "user admin exists" in again.output()
        assert "made a new one" not in again.output()
        assert secure_snapshot(data) == before  # certificates and passwords reused
        cli = with_printed_env(
            settings, f"{MB} consume t --from-beginning -n 102 --timeout-ms 30000"
        )
        assert cli.returncode == 0, cli.stderr
        assert len(cli.stdout.splitlines()) == 102
    finally:
        second_stop = stop_and_sweep(again)
    assert second_stop == 0, again.output()


async def describe_quorum_as_admin(
    settings: dict[str, str], ports: list[int]
) -> list[DescribeQuorumResponse]:
    """Each controller's DescribeQuorum, over SASL_SSL as the printed user."""
    tls = create_ssl_context(cafile=settings["ca file"])
    password = Path(settings["password file"]).read_text().strip()
    sasl = SaslCredentials("SCRAM-SHA-256", "admin", password)
    answers = []
    for port in ports:
        conn = BrokerConnection("127.0.0.1", port, tls=tls, sasl=sasl)
        await conn.connect()
        try:
            answer = await conn.send(DescribeQuorumRequest())
        finally:
            await conn.close()
        assert isinstance(answer, DescribeQuorumResponse) and answer.error_code == 0, answer
        answers.append(answer)
    return answers


def test_dev_secure_with_a_quorum_of_three_controllers(tmp_path: Path) -> None:
    dev = DevProcess(tmp_path / "quorum", 2, "--secure", "--controllers", "3")
    try:
        settings = settings_of(dev)
        ports = [dev.base_port + 1 + 2 * i for i in range(3)]
        assert f"controllers {','.join(f'127.0.0.1:{p}' for p in ports)}" in dev.output()
        answers = asyncio.run(describe_quorum_as_admin(settings, ports))
        # Every voter answers the admin, all name one leader and the voter set 0, 1, 2.
        assert len({a.leader_id for a in answers}) == 1 and answers[0].leader_id >= 0, answers
        assert all(sorted(v.replica_id for v in a.voters) == [0, 1, 2] for a in answers)
        cli = with_printed_env(
            settings,
            f"{MB} topic create q -p 2 -r 2 && printf 'a\\nb\\n' | {MB} produce q --acks all && "
            f"{MB} consume q --from-beginning -n 2 --timeout-ms 30000",
        )
        assert cli.returncode == 0, cli.stderr
        assert sorted(cli.stdout.splitlines()[1:]) == ["a", "b"]
        # The quorum tools reach secure controllers with the same printed settings.
        controllers = ",".join(f"127.0.0.1:{p}" for p in ports)
        quorum = with_printed_env(
            settings,
            f"{MB} metadata-quorum describe --controller {controllers} && "
            f"{MB} cluster health --controller {controllers}",
        )
        assert quorum.returncode == 0, quorum.stderr + quorum.stdout
        assert f"LeaderId:       {answers[0].leader_id}" in quorum.stdout
        assert "CurrentVoters:  [0,1,2]" in quorum.stdout
    finally:
        code = stop_and_sweep(dev)
    assert code == 0, dev.output()
