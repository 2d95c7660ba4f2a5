"""The servers' own SASL settings (runtime/sasl_settings.py, broker/config.py,
controller/config.py): where a server's password comes from (a file's first line, else
an environment variable, never the command line) and that no error message or repr
holds it; the configurations that cannot work are refused at start, saying what to set.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig
from controller.config import ControllerConfig
from runtime.sasl_settings import BOOTSTRAP_PASSWORD_ENV
from runtime.sasl_settings import SERVER_PASSWORD_ENV
from runtime.sasl_settings import read_password
from runtime.sasl_settings import server_credentials
from runtime.settings import ConfigError
from runtime.settings import settings_of

SASL_FIRST_LISTENER = {"listener_security_protocol_map": {"PLAINTEXT": "SASL_PLAINTEXT"}}


def test_the_password_is_the_files_first_line_else_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "pw"
    path.write_text("from-the-file\nignored\n")
    monkeypatch.setenv(SERVER_PASSWORD_ENV, "from-the-env")
    assert read_password(path, SERVER_PASSWORD_ENV, option="--x") == "from-the-file"
    assert read_password(None, SERVER_PASSWORD_ENV, option="--x") == "from-the-env"
    monkeypatch.delenv(SERVER_PASSWORD_ENV)
    with pytest.raises(ConfigError, match=f"give --x FILE, or set .*{SERVER_PASSWORD_ENV}"):
        read_password(None, SERVER_PASSWORD_ENV, option="--x")
    path.write_text("\n")
    with pytest.raises(ConfigError, match="first line is empty"):
        read_password(path, SERVER_PASSWORD_ENV, option="--x")
    with pytest.raises(ConfigError, match="cannot read it"):
        read_password(tmp_path / "missing", SERVER_PASSWORD_ENV, option="--x")


def test_the_password_is_in_no_repr(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text("hunter2-secret\n")
    credentials = server_credentials("broker", path, "SCRAM-SHA-256")
    assert credentials.password == "hunter2-secret"
    assert "hunter2-secret" not in repr(credentials)


def test_no_password_setting_is_a_flag_value() -> None:
    """Only files hold passwords: no declared setting of either server takes one."""
    for config in (BrokerConfig, ControllerConfig):
        names = [d.flag for d in settings_of(config) if "password" in d.flag]
        assert names and all(name.endswith("-password-file") for name in names), names


def test_a_broker_on_sasl_between_servers_needs_its_user() -> None:
    with pytest.raises(ConfigError, match="--sasl-server-username"):
        BrokerConfig(node_id=1, **SASL_FIRST_LISTENER)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--sasl-server-username"):
        BrokerConfig(node_id=1, controller_security_protocol="SASL_PLAINTEXT")
    config = BrokerConfig(node_id=1, sasl_server_username="broker", **SASL_FIRST_LISTENER)  # type: ignore[arg-type]
    assert config.controller_sasl() is None  # the controllers are PLAINTEXT here


def test_the_inter_broker_mechanism_must_be_one_the_brokers_offer() -> None:
    with pytest.raises(ConfigError, match="not among --sasl-enabled-mechanisms"):
        BrokerConfig(
            node_id=1,
            sasl_server_username="broker",
            sasl_enabled_mechanisms=("SCRAM-SHA-256",),
            sasl_mechanism_inter_broker_protocol="SCRAM-SHA-512",
            **SASL_FIRST_LISTENER,  # type: ignore[arg-type]
        )


def test_a_broker_reads_its_password_for_each_sasl_peer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SERVER_PASSWORD_ENV, "env-secret")
    config = BrokerConfig(
        node_id=1,
        sasl_server_username="broker",
        controller_security_protocol="SASL_PLAINTEXT",
        sasl_mechanism_controller_protocol="PLAIN",
        **SASL_FIRST_LISTENER,  # type: ignore[arg-type]
    )
    inter_broker, controller = config.inter_broker_sasl(), config.controller_sasl()
    assert inter_broker is not None and controller is not None
    assert (inter_broker.mechanism, inter_broker.username) == ("SCRAM-SHA-512", "broker")
    assert (controller.mechanism, controller.password) == ("PLAIN", "env-secret")


def test_a_sasl_quorum_must_prove_its_voters_by_certificate(tmp_path: Path) -> None:
    pem = tmp_path / "c.pem"
    pem.write_text("not read by the config check")
    voters = {0: ("127.0.0.1", 9093), 1: ("127.0.0.1", 9094), 2: ("127.0.0.1", 9095)}
    tls = {"ssl_certfile": pem, "ssl_cafile": pem}
    with pytest.raises(ConfigError, match="prove themselves by TLS certificate"):
        ControllerConfig(security_protocol="SASL_PLAINTEXT", quorum_voters=voters)
    with pytest.raises(ConfigError, match="--ssl-client-auth requested or required"):
        ControllerConfig(security_protocol="SASL_SSL", quorum_voters=voters, **tls)  # type: ignore[arg-type]
    ControllerConfig(
        security_protocol="SASL_SSL", quorum_voters=voters, ssl_client_auth="REQUESTED", **tls
    )  # type: ignore[arg-type]
    ControllerConfig(security_protocol="SASL_PLAINTEXT")  # one controller: no peers


def test_the_bootstrap_password_is_read_only_with_a_bootstrap_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(BOOTSTRAP_PASSWORD_ENV, raising=False)
    assert ControllerConfig().bootstrap_password() is None
    config = ControllerConfig(sasl_bootstrap_username="broker")
    with pytest.raises(ConfigError, match=BOOTSTRAP_PASSWORD_ENV):
        config.bootstrap_password()
    monkeypatch.setenv(BOOTSTRAP_PASSWORD_ENV, "boot")
    assert config.bootstrap_password() == "boot"
