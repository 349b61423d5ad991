"""`dualloop bench tick --secure`: a throwaway CA, server certificate and bearer token for one run.

Made at bench time in a temporary folder (nothing reused between runs, nothing left behind), so a
secure run pays what a network deployment pays: a TLS handshake per channel, encryption of every
message, the token checked on every RPC.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

TOKEN_ENV = "DUALLOOP_BENCH_TOKEN"  # how the token reaches the clients process (not on its command line)


class MissingExtraError(RuntimeError):
    """cryptography (the `bench` extra) is not installed."""


@dataclass(frozen=True)
class BenchPKI:
    ca_file: Path  # what the clients trust
    cert_file: Path  # the server's certificate, for 127.0.0.1 and localhost
    key_file: Path
    tokens_file: Path  # the server's tokens file: one token
    token: str


def require_cryptography() -> None:
    """Raises MissingExtraError, naming the extra, when cryptography is not installed (checked
    before a `--secure both` command spends its first, plain, run)."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise MissingExtraError(
            "bench tick --secure makes its certificates with the 'cryptography' package, which is not "
            "installed; it comes with the bench extra: pip install 'dualloop[bench]'"
        ) from None


def make_pki(folder: Path) -> BenchPKI:
    """A CA, a server certificate it signs (EC P-256, valid for a day) and a token, as files in folder."""
    require_cryptography()
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dualloop bench CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki = BenchPKI(
        folder / "ca.pem", folder / "server.crt", folder / "server.key", folder / "tokens", secrets.token_urlsafe(32)
    )
    pki.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.key_file.touch(mode=0o600)
    pki.key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    pki.tokens_file.touch(mode=0o600)
    pki.tokens_file.write_text(pki.token + "\n")
    return pki
