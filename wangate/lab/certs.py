"""A throwaway CA and one certificate per site, for gateway runs in the lab."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def self_signed(common_name: str) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a self-signed certificate for ``common_name``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(common_name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def write_site_certificates(
    directory: Path, sites: list[str]
) -> tuple[Path, dict[str, tuple[Path, Path]]]:
    """``ca.pem``/``ca.key`` and ``<site>.pem``/``<site>.key`` signed by that CA.

    Made by wangate's own certificate tool (``wangate certs``), so they carry exactly
    what the gateway's configuration check requires (key usages, SAN, key ids)."""
    from wangate.certs import create_ca, issue_site_certificate

    directory.mkdir(parents=True, exist_ok=True)
    ca_pem, _ = create_ca(directory, name="wangate lab CA", days=2)
    result = {site: issue_site_certificate(directory, site, days=2) for site in sites}
    return ca_pem, result
