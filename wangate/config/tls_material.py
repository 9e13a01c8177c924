"""``[tls]``: the CA, the site's certificate chain and its private key, read and checked
when the configuration loads, so that a mismatched or unprotected file stops the
daemon before it listens instead of failing the first handshake."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from wangate.certs import load_ca_certificates, verify_site_certificate
from wangate.config.reader import Reader
from wangate.config.schema import TlsConfig
from wangate.errors import WangateError

# the configuration's logger, whichever module of it warns
log = logging.getLogger("wangate.config")


def tls_config(reader: Reader, value: object, site: str) -> TlsConfig:
    """The ``[tls]`` table, its files read: the key is the certificate's, the chain
    leads to the CA and names ``site``."""
    table = reader.table(value, "tls", {"ca", "cert", "key"}, {"allow_readable_key"})
    paths = {name: reader.file_path(table[name], f"tls.{name}") for name in ("ca", "cert", "key")}
    allow_readable_key: bool = reader.typed(
        table.get("allow_readable_key", False), "tls.allow_readable_key", bool, "a boolean"
    )
    data = {name: _read(reader, path, f"tls.{name}") for name, path in paths.items()}

    try:
        cas = load_ca_certificates(paths["ca"])
    except WangateError as exc:
        raise reader.error("tls.ca", str(exc)) from None
    try:
        chain = x509.load_pem_x509_certificates(data["cert"])
    except ValueError:
        raise reader.error("tls.cert", f"{paths['cert']} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(data["key"], password=None)
    except (ValueError, TypeError) as exc:
        raise reader.error(
            "tls.key", f"{paths['key']} is not an unencrypted PEM private key: {exc}"
        ) from None
    _key_permissions(reader, paths["key"], allow_readable_key)
    if key.public_key() != chain[0].public_key():
        raise reader.error("tls.key", f"{paths['key']} is not the key of {paths['cert']}")
    try:
        named = verify_site_certificate(chain[0], chain[1:], cas)
    except WangateError as exc:
        raise reader.error("tls.cert", f"{paths['cert']}: {exc}") from None
    if named != site:
        raise reader.error(
            "tls.cert", f"{paths['cert']} is for site {named!r}, but site.name is {site!r}"
        )
    return TlsConfig(
        ca=paths["ca"],
        cert=paths["cert"],
        key=paths["key"],
        allow_readable_key=allow_readable_key,
    )


def _key_permissions(reader: Reader, path: Path, allow_readable_key: bool) -> None:
    """A private key is for the daemon's eyes only (like ssh's ``chmod 600`` rule).

    Its group is refused too: the daemon's group is the trainers' group, for the socket.
    """
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise reader.error("tls.key", f"cannot read {path}: {exc.strerror or exc}") from None
    readers = [
        who for bit, who in ((stat.S_IRGRP, "its group"), (stat.S_IROTH, "others")) if mode & bit
    ]
    if not readers:
        return
    who = " and ".join(readers)
    if allow_readable_key:
        log.warning(
            "%s: tls.key: %s (mode %04o) is readable by %s; allowed by tls.allow_readable_key",
            reader.path,
            path,
            mode,
            who,
        )
        return
    raise reader.error(
        "tls.key",
        f"{path} (mode {mode:04o}) is readable by {who}: run `chmod 600 {path}`, "
        "or set allow_readable_key = true in [tls] to accept it",
    )


def _read(reader: Reader, path: Path, key: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise reader.error(key, f"cannot read {path}: {exc.strerror or exc}") from None
