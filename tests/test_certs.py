"""Site CA and site certificates: files, permissions, contents, chain, refusal to overwrite."""

from __future__ import annotations

import datetime
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from wangate.certs import (
    create_ca,
    is_valid_name,
    issue_site_certificate,
    load_ca,
    load_ca_certificates,
    site_name_of,
    verify_site_certificate,
)
from wangate.errors import AuthenticationError, WangateError


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _issue_custom(
    ca_dir: Path,
    *,
    common_name: str = "bj",
    dns_names: tuple[str, ...] = ("bj",),
    usages: tuple[x509.ObjectIdentifier, ...] = (
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.CLIENT_AUTH,
    ),
    is_ca: bool = False,
) -> x509.Certificate:
    """A leaf signed by the CA in ``ca_dir`` with chosen names and usages."""
    ca_cert, ca_key = load_ca(ca_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if dns_names:
        san = x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names])
        builder = builder.add_extension(san, critical=False)
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def test_create_ca_writes_a_self_signed_p256_ca(tmp_path: Path) -> None:
    cert_path, key_path = create_ca(tmp_path / "pki", name="test CA", days=30)

    assert (cert_path, key_path) == (tmp_path / "pki" / "ca.pem", tmp_path / "pki" / "ca.key")
    assert _mode(key_path) == 0o600
    assert _mode(cert_path) == 0o644
    assert sorted(p.name for p in (tmp_path / "pki").iterdir()) == ["ca.key", "ca.pem"]
    cert, key = _cert(cert_path), _key(key_path)
    assert isinstance(key.curve, ec.SECP256R1)
    assert cert.public_key() == key.public_key()
    assert cert.subject.rfc4514_string() == "CN=test CA"
    assert cert.issuer == cert.subject
    cert.verify_directly_issued_by(cert)
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and not usage.digital_signature
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime == datetime.timedelta(days=30, minutes=5)
    assert load_ca_certificates(cert_path) == [cert]


def test_site_certificate_names_the_site_and_serves_both_roles(tmp_path: Path) -> None:
    ca_path, _ = create_ca(tmp_path)
    cert_path, key_path = issue_site_certificate(tmp_path, "bj-1.dc_2")

    assert (cert_path, key_path) == (tmp_path / "bj-1.dc_2.pem", tmp_path / "bj-1.dc_2.key")
    assert _mode(key_path) == 0o600
    cert, key, ca = _cert(cert_path), _key(key_path), _cert(ca_path)
    assert isinstance(key.curve, ec.SECP256R1)
    assert cert.public_key() == key.public_key()
    cert.verify_directly_issued_by(ca)
    assert cert.subject.rfc4514_string() == "CN=bj-1.dc_2"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["bj-1.dc_2"]
    assert list(san) == [x509.DNSName("bj-1.dc_2")]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert site_name_of(cert) == "bj-1.dc_2"
    assert verify_site_certificate(cert, [], [ca]) == "bj-1.dc_2"


def test_site_certificate_lifetime_is_capped_by_the_ca(tmp_path: Path) -> None:
    ca_path, _ = create_ca(tmp_path, days=10)
    cert_path, _ = issue_site_certificate(tmp_path, "sh", days=825)
    assert _cert(cert_path).not_valid_after_utc == _cert(ca_path).not_valid_after_utc


def test_keys_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    old_umask = os.umask(0)
    try:
        _, ca_key = create_ca(tmp_path)
        _, site_key = issue_site_certificate(tmp_path, "bj")
    finally:
        os.umask(old_umask)
    assert (_mode(ca_key), _mode(site_key)) == (0o600, 0o600)


def test_create_ca_refuses_to_overwrite(tmp_path: Path) -> None:
    cert_path, key_path = create_ca(tmp_path)
    before = (cert_path.read_bytes(), key_path.read_bytes())

    with pytest.raises(WangateError, match=r"refusing to overwrite .*ca\.pem"):
        create_ca(tmp_path)
    assert (cert_path.read_bytes(), key_path.read_bytes()) == before

    key_path.unlink()  # one file left is enough to refuse
    with pytest.raises(WangateError, match="refusing to overwrite"):
        create_ca(tmp_path)
    assert not key_path.exists()

    create_ca(tmp_path, force=True)
    assert cert_path.read_bytes() != before[0]
    assert _mode(key_path) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.key", "ca.pem"]  # no temp files


def test_issue_refuses_to_overwrite(tmp_path: Path) -> None:
    create_ca(tmp_path)
    cert_path, key_path = issue_site_certificate(tmp_path, "bj")
    before = (cert_path.read_bytes(), key_path.read_bytes())
    with pytest.raises(WangateError, match="refusing to overwrite"):
        issue_site_certificate(tmp_path, "bj")
    assert (cert_path.read_bytes(), key_path.read_bytes()) == before

    issue_site_certificate(tmp_path, "bj", force=True)
    assert cert_path.read_bytes() != before[0]
    assert key_path.read_bytes() != before[1]


def test_issue_needs_a_ca(tmp_path: Path) -> None:
    with pytest.raises(WangateError, match="cannot read the CA"):
        issue_site_certificate(tmp_path, "bj")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("site", ["", "-bj", ".bj", "b j", "bj/x", "a" * 64, "ca", "bjé"])
def test_issue_rejects_bad_site_names(tmp_path: Path, site: str) -> None:
    create_ca(tmp_path)
    with pytest.raises(WangateError):
        issue_site_certificate(tmp_path, site)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.key", "ca.pem"]


def test_name_rule() -> None:
    assert is_valid_name("a")
    assert is_valid_name("A9._-" + "x" * 58)
    assert not is_valid_name("A9._-" + "x" * 59)
    assert not is_valid_name("_a")
    assert is_valid_name("10.0.0")
    assert not is_valid_name("10.0.0.1")  # would be checked against IP SANs
    assert not is_valid_name("::1")


def test_verify_rejects_another_ca(tmp_path: Path) -> None:
    create_ca(tmp_path / "ours")
    create_ca(tmp_path / "theirs")
    cert_path, _ = issue_site_certificate(tmp_path / "theirs", "bj")
    ours = load_ca_certificates(tmp_path / "ours" / "ca.pem")
    with pytest.raises(AuthenticationError, match="does not verify against our CA"):
        verify_site_certificate(_cert(cert_path), [], ours)


def test_verify_rejects_expired_and_not_yet_valid(tmp_path: Path) -> None:
    ca_path, _ = create_ca(tmp_path)
    cert_path, _ = issue_site_certificate(tmp_path, "bj", days=2)
    cert, cas = _cert(cert_path), load_ca_certificates(ca_path)
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3)
    earlier = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    assert verify_site_certificate(cert, [], cas, now=later - datetime.timedelta(days=2)) == "bj"
    for when in (later, earlier):
        with pytest.raises(AuthenticationError, match="not valid at validation time"):
            verify_site_certificate(cert, [], cas, now=when)


def test_verify_rejects_a_ca_certificate_as_a_site(tmp_path: Path) -> None:
    ca_path, _ = create_ca(tmp_path)
    ca = _cert(ca_path)
    with pytest.raises(AuthenticationError, match="does not allow serverAuth"):
        verify_site_certificate(ca, [], [ca])
    sub_ca = _issue_custom(tmp_path, is_ca=True)  # has both usages, but is a CA
    with pytest.raises(AuthenticationError, match="cA must not be asserted"):
        verify_site_certificate(sub_ca, [], [ca])


@pytest.mark.parametrize(
    ("usages", "missing"),
    [
        ((ExtendedKeyUsageOID.SERVER_AUTH,), "clientAuth"),
        ((ExtendedKeyUsageOID.CLIENT_AUTH,), "serverAuth"),
    ],
)
def test_verify_requires_both_usages(
    tmp_path: Path, usages: tuple[x509.ObjectIdentifier, ...], missing: str
) -> None:
    ca_path, _ = create_ca(tmp_path)
    cert = _issue_custom(tmp_path, usages=usages)
    with pytest.raises(AuthenticationError, match=missing):
        verify_site_certificate(cert, [], load_ca_certificates(ca_path))


def test_site_name_falls_back_to_common_name(tmp_path: Path) -> None:
    create_ca(tmp_path)
    assert site_name_of(_issue_custom(tmp_path, common_name="gz", dns_names=())) == "gz"
    assert site_name_of(_issue_custom(tmp_path, common_name="gz", dns_names=("sh",))) == "sh"


def test_site_name_refuses_two_names(tmp_path: Path) -> None:
    create_ca(tmp_path)
    with pytest.raises(AuthenticationError, match="names 2 sites"):
        site_name_of(_issue_custom(tmp_path, dns_names=("bj", "sh")))


def test_load_ca_certificates_rejects_a_leaf(tmp_path: Path) -> None:
    create_ca(tmp_path)
    cert_path, _ = issue_site_certificate(tmp_path, "bj")
    with pytest.raises(WangateError, match="CN=bj is not a CA"):
        load_ca_certificates(cert_path)
    (tmp_path / "junk.pem").write_text("hello\n")
    with pytest.raises(WangateError, match="no PEM certificate"):
        load_ca_certificates(tmp_path / "junk.pem")
