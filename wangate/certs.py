"""Site certificates: one private CA per deployment, one certificate per site.

Every gateway presents its site certificate both as a QUIC server and as a QUIC client
(mutual TLS), so a site certificate carries both ``serverAuth`` and ``clientAuth``. The
site's name is the certificate's only SAN DNS name; the peer's configured name is checked
against it. Keys are EC P-256: the cheapest signature for the handshake that TLS 1.3
offers everywhere.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from wangate.errors import AuthenticationError, WangateError

# Site, peer and path names: short, ASCII, usable as a DNS-style SAN and in file names.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")

CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"

# Backdate notBefore a little so that peers whose clocks lag slightly still accept it.
_CLOCK_SKEW = datetime.timedelta(minutes=5)


def is_valid_name(name: str) -> bool:
    """Whether ``name`` may name a site, a peer or a path.

    Not an IP address: TLS would check such a server name against IP SANs instead.
    """
    if NAME_PATTERN.fullmatch(name) is None:
        return False
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return True
    return False


def create_ca(
    directory: Path,
    *,
    name: str = "wangate site CA",
    days: int = 3650,
    force: bool = False,
) -> tuple[Path, Path]:
    """Create a site CA as ``directory/ca.pem`` and ``directory/ca.key`` (mode 0600).

    Refuses to overwrite either file unless ``force`` is true.
    """
    if days < 1:
        raise WangateError(f"a CA must be valid for at least one day, not {days}")
    directory = Path(directory)
    cert_path, key_path = directory / CA_CERT_FILE, directory / CA_KEY_FILE
    _refuse_overwrite((cert_path, key_path), force)

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    public_key = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public_key)
        .serial_number(_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    _write_private(key_path, _private_key_pem(key), force)
    _write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM), force)
    return cert_path, key_path


def issue_site_certificate(
    directory: Path,
    site: str,
    *,
    days: int = 825,
    force: bool = False,
) -> tuple[Path, Path]:
    """Issue ``directory/SITE.pem`` and ``directory/SITE.key`` (0600), signed by the CA there.

    The certificate names the site in its CN and as its only SAN DNS name, and is valid
    for TLS server and client authentication both.
    """
    if not is_valid_name(site):
        raise WangateError(f"{site!r} is not a valid site name (letters, digits, '.', '_', '-')")
    if site in (Path(CA_CERT_FILE).stem, Path(CA_KEY_FILE).stem):
        raise WangateError(f"a site may not be named {site!r}: its files would be the CA's")
    if days < 1:
        raise WangateError(f"a certificate must be valid for at least one day, not {days}")
    directory = Path(directory)
    cert_path, key_path = directory / f"{site}.pem", directory / f"{site}.key"
    _refuse_overwrite((cert_path, key_path), force)
    ca_cert, ca_key = load_ca(directory)

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    if not_after <= now:
        raise WangateError(f"the CA in {directory} has expired; create a new one")
    public_key = key.public_key()
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, site)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(site)]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(key_path, _private_key_pem(key), force)
    _write_public(cert_path, cert.public_bytes(serialization.Encoding.PEM), force)
    return cert_path, key_path


def load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Read the CA certificate and key that :func:`create_ca` wrote to ``directory``."""
    cert_path, key_path = Path(directory) / CA_CERT_FILE, Path(directory) / CA_KEY_FILE
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except OSError as exc:
        raise WangateError(f"cannot read the CA in {directory}: {exc}") from exc
    except ValueError as exc:
        raise WangateError(f"the CA in {directory} is not valid PEM: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise WangateError(f"{key_path} is not an EC private key")
    if key.public_key() != cert.public_key():
        raise WangateError(f"{key_path} is not the key of {cert_path}")
    try:
        cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    except x509.ExtensionNotFound:
        raise WangateError(f"{cert_path} has no subject key identifier") from None
    return cert, key


def site_name_of(cert: x509.Certificate) -> str:
    """The site a certificate names: its SAN DNS name, else its common name.

    Raises :class:`AuthenticationError` if it names no site or more than one.
    """
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        dns_names: list[str] = []
    else:
        dns_names = san.get_values_for_type(x509.DNSName)
    if len(dns_names) > 1:
        raise AuthenticationError(f"certificate names {len(dns_names)} sites: {dns_names}")
    if dns_names:
        return dns_names[0]
    common_names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(common_names) != 1 or not isinstance(common_names[0].value, str):
        raise AuthenticationError("certificate names no site (no SAN DNS name, no single CN)")
    return common_names[0].value


def load_ca_certificates(path: Path) -> list[x509.Certificate]:
    """The trusted CA certificates in a PEM file (one or more, e.g. while rotating a CA)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise WangateError(f"cannot read CA file {path}: {exc.strerror or exc}") from exc
    try:
        cas = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise WangateError(f"{path} holds no PEM certificate: {exc}") from exc
    for ca in cas:
        try:
            constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            constraints = None
        if constraints is None or not constraints.ca:
            raise WangateError(f"{path}: certificate {ca.subject.rfc4514_string()} is not a CA")
    return cas


def verify_site_certificate(
    cert: x509.Certificate,
    intermediates: list[x509.Certificate],
    trusted_cas: list[x509.Certificate],
    *,
    now: datetime.datetime | None = None,
) -> str:
    """Check that ``cert`` is a site certificate issued under ``trusted_cas``; return its site.

    RFC 5280 path validation (signatures, validity at ``now``, CA constraints, key usage)
    by ``cryptography``'s verifier. A site certificate serves both ends of a connection,
    so it must allow TLS client and server authentication both, whichever end it is on.
    Raises :class:`AuthenticationError` naming the reason.
    """
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        usages = x509.ExtendedKeyUsage([])
    for usage, usage_name in (
        (ExtendedKeyUsageOID.SERVER_AUTH, "serverAuth"),
        (ExtendedKeyUsageOID.CLIENT_AUTH, "clientAuth"),
    ):
        if usage not in usages:
            raise AuthenticationError(
                f"certificate of {_describe(cert)} does not allow {usage_name}"
            )
    builder = PolicyBuilder().store(Store(trusted_cas)).max_chain_depth(4)
    if now is not None:
        builder = builder.time(now)
    try:
        builder.build_client_verifier().verify(cert, intermediates)
    except VerificationError as exc:
        raise AuthenticationError(
            f"certificate of {_describe(cert)} does not verify against our CA: {exc}"
        ) from exc
    return site_name_of(cert)


def _describe(cert: x509.Certificate) -> str:
    return repr(cert.subject.rfc4514_string() or "(empty subject)")


def _serial_number() -> int:
    # RFC 5280 4.1.2.2: positive, at most 20 octets; 159 random bits.
    return secrets.randbits(159) | 1


def _private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _refuse_overwrite(paths: tuple[Path, ...], force: bool) -> None:
    if force:
        return
    existing = [str(p) for p in paths if p.exists() or p.is_symlink()]
    if existing:
        raise WangateError(f"refusing to overwrite {', '.join(existing)} (use force=True)")


def _write_private(path: Path, data: bytes, force: bool) -> None:
    _write_atomically(path, data, 0o600, force)


def _write_public(path: Path, data: bytes, force: bool) -> None:
    _write_atomically(path, data, 0o644, force)


def _write_atomically(path: Path, data: bytes, mode: int, force: bool) -> None:
    # The file is born with its final mode (no window where a key is world-readable),
    # and appears under its name only once complete.
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as stream:
            os.fchmod(stream.fileno(), mode)  # the umask may have taken bits away
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        if force:
            os.replace(tmp, path)
        else:
            # link() fails if the name appeared meanwhile: never clobber without force.
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise WangateError(f"refusing to overwrite {path} (use force=True)") from None
    finally:
        tmp.unlink(missing_ok=True)
