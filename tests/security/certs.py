"""Throwaway PKI for the TLS tests: a CA, and certificates it signs, written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=1)
_BOTH_ENDS = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]


@dataclass(frozen=True)
class Authority:
    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    cert_path: Path


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _subject(name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_ca(folder: Path, name: str) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_subject(name))
        .issuer_name(_subject(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _VALID)
        .not_valid_after(now + _VALID)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Authority(name, key, cert, path)


def issue(
    ca: Authority,
    folder: Path,
    name: str,
    hosts: tuple[str, ...] = (),
    common_name: str | None = None,
    alt_names: bool = True,
) -> Issued:
    """A certificate for `name` (its CN and a DNS SAN) plus `hosts` (DNS names or IPs), good
    both as a server's and as a client's. `common_name` puts another name in the CN than in the
    SANs; `alt_names=False` leaves the SAN extension out (a CN-only certificate)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [x509.DNSName(name)]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    builder = (
        x509.CertificateBuilder()
        .subject_name(_subject(common_name or name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _VALID)
        .not_valid_after(now + _VALID)
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.add_extension(
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
        critical=False,
    ).sign(ca.key, hashes.SHA256())
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_pem_key(key))
    return Issued(cert_path, key_path)
