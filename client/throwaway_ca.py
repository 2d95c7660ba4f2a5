"""A throwaway certificate authority (issue 18): a CA and the certificates it signs,
as PEM files, for a cluster on one machine (`minibroker dev --secure`) and the tests.
Not a way to run a CA: keys are written unencrypted, with mode 0600.

    ca = ThrowawayCA.create(directory)            # ca.pem, ca-key.pem
    ca = ThrowawayCA.load(directory)              # the one made there before (None: none)
    server = ca.issue("broker-1", hosts=["127.0.0.1", "localhost"])
    client = ca.issue("alice")                    # a client certificate: CN=alice
    server.certfile, server.keyfile, ca.cafile
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.oid import NameOID

VALID_DAYS = 30


@dataclass(frozen=True)
class Issued:
    certfile: Path
    keyfile: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


class ThrowawayCA:
    def __init__(self, directory: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate):
        self.directory = directory
        self._key = key
        self._cert = cert

    @property
    def cafile(self) -> Path:
        return self.directory / "ca.pem"

    @classmethod
    def create(cls, directory: Path, name: str = "minibroker throwaway CA") -> ThrowawayCA:
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        ca = cls(directory, key, cert)
        ca.cafile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(directory / "ca-key.pem", key)
        return ca

    @classmethod
    def load(cls, directory: Path) -> ThrowawayCA | None:
        """The CA made in `directory` before (None when its files are missing). Raises
        ValueError when they are there but are not a CA's PEM certificate and key."""
        try:
            cert_pem = (directory / "ca.pem").read_bytes()
            key_pem = (directory / "ca-key.pem").read_bytes()
        except FileNotFoundError:
            return None
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise ValueError(f"{directory / 'ca-key.pem'} is not the key of {directory / 'ca.pem'}")
        return cls(directory, key, cert)

    @property
    def certificate(self) -> x509.Certificate:
        return self._cert

    def issue(
        self,
        name: str,
        *,
        hosts: tuple[str, ...] | list[str] = (),
        days: int = VALID_DAYS,
        not_before: datetime.datetime | None = None,
    ) -> Issued:
        """A certificate for CN=`name`, good for TLS servers on `hosts` (IP addresses or
        DNS names) and as a client certificate; `<name>.pem` and `<name>-key.pem`."""
        key = ec.generate_private_key(ec.SECP256R1())
        start = not_before or datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        issued = Issued(self.directory / f"{name}.pem", self.directory / f"{name}-key.pem")
        issued.certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(issued.keyfile, key)
        return issued
