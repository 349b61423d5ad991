"""TLS credentials from PEM files, for gRPC servers and channels (the controller server, the planner).

Files are checked when the configuration is built (stdlib ssl parses them and matches key to
certificate), so a wrong path or a mismatched pair fails at start with the file named, not at the
first handshake. A server re-reads its files when they change, on the next new connection.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from pathlib import Path

import grpc
from pydantic import BaseModel, ConfigDict, model_validator

log = logging.getLogger("dualloop.tls")


class TLSFileError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names the file."""


def read_pem(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TLSFileError(f"{what} {path}: cannot read: {err.strerror or err}") from None
    if b"-----BEGIN " not in data:
        raise TLSFileError(f"{what} {path}: not a PEM file (no '-----BEGIN' line)")
    return data


def check_pair(cert_file: Path, key_file: Path, what: str) -> None:
    """Raises TLSFileError unless the files hold a certificate chain and its private key."""
    read_pem(cert_file, f"{what} certificate")
    read_pem(key_file, f"{what} key")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert_file, key_file)
    except ssl.SSLError as err:
        raise TLSFileError(
            f"{what} certificate {cert_file} and key {key_file} cannot be used together: {err.reason or err}"
        ) from None


def check_ca(ca_file: Path, what: str) -> None:
    read_pem(ca_file, what)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=ca_file)
    except ssl.SSLError as err:
        raise TLSFileError(f"{what} {ca_file}: not a CA certificate bundle: {err.reason or err}") from None


def validity_problem(cert_file: Path, now_s: float | None = None) -> str | None:
    """Why the file's first certificate (a server's own, in a chain) is not valid now, with its
    dates; None when it is, or when its dates cannot be read here. A server starts anyway (the
    clock may be what is wrong, and a reload may bring a good certificate), but says so: every
    handshake of a client that checks dates fails."""
    try:  # the standard library's decoder (no cryptography dependency in the lean install)
        decoded = ssl._ssl._test_decode_cert(str(cert_file))  # type: ignore[attr-defined]
        not_before, not_after = decoded["notBefore"], decoded["notAfter"]
        start, end = ssl.cert_time_to_seconds(not_before), ssl.cert_time_to_seconds(not_after)
    except (AttributeError, KeyError, ValueError, OSError, ssl.SSLError):
        return None
    now = time.time() if now_s is None else now_s
    if now < start:
        return f"certificate {cert_file} is not valid yet: valid from {not_before} until {not_after}"
    if now > end:
        return f"certificate {cert_file} has expired: valid from {not_before} until {not_after}"
    return None


class ServerTLS(BaseModel):
    """A gRPC server's TLS: its certificate chain and key; with client_ca_file, mutual TLS."""

    model_config = ConfigDict(extra="forbid")

    cert_file: Path  # PEM certificate chain, the server's certificate first
    key_file: Path  # PEM private key (unencrypted; protect the file: mode 0600, owned by the server's user)
    # PEM CA bundle that client certificates must chain to (mutual TLS); None: server-only TLS.
    client_ca_file: Path | None = None
    # With client_ca_file: refuse handshakes without a valid client certificate (false: verify one
    # only when presented; identity rules then treat a missing one as not allowed).
    require_client_cert: bool = True
    # Re-read the files when they change (checked on each new connection); open connections keep theirs.
    reload: bool = True

    @model_validator(mode="after")
    def _files_usable(self) -> ServerTLS:
        check_pair(self.cert_file, self.key_file, "TLS server")
        if self.client_ca_file is not None:
            check_ca(self.client_ca_file, "TLS client CA")
        return self

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None

    def _certificate_configuration(self) -> grpc.ServerCertificateConfiguration:
        pair = (read_pem(self.key_file, "TLS server key"), read_pem(self.cert_file, "TLS server certificate"))
        ca = read_pem(self.client_ca_file, "TLS client CA") if self.client_ca_file is not None else None
        return grpc.ssl_server_certificate_configuration([pair], ca)

    def _stamp(self) -> tuple[tuple[int, int], ...]:
        files = [self.cert_file, self.key_file] + ([self.client_ca_file] if self.client_ca_file else [])
        stamps = []
        for f in files:
            st = os.stat(f)
            stamps.append((st.st_mtime_ns, st.st_size))
        return tuple(stamps)

    def credentials(self) -> grpc.ServerCredentials:
        require = self.mutual and self.require_client_cert
        if not self.reload:
            pair = (read_pem(self.key_file, "TLS server key"), read_pem(self.cert_file, "TLS server certificate"))
            ca = read_pem(self.client_ca_file, "TLS client CA") if self.client_ca_file is not None else None
            return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=require)
        lock = threading.Lock()
        loaded = [self._stamp()]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            # gRPC calls this on every new connection; None keeps the current certificates.
            with lock:
                try:
                    stamp = self._stamp()
                    if stamp == loaded[0]:
                        return None
                    # A half-written rotation (new certificate, old key) is refused and retried on the
                    # next connection: the old certificates stay in use meanwhile.
                    check_pair(self.cert_file, self.key_file, "TLS server")
                    if self.client_ca_file is not None:
                        check_ca(self.client_ca_file, "TLS client CA")
                    config = self._certificate_configuration()
                except (OSError, TLSFileError) as err:
                    log.warning("TLS files changed but cannot be used yet; keeping the current ones: %s", err)
                    return None
                loaded[0] = stamp
                log.info("TLS certificates reloaded from %s", self.cert_file)
                problem = validity_problem(self.cert_file)
                if problem is not None:
                    log.warning("the reloaded TLS %s; clients that check dates refuse every handshake", problem)
                return config

        return grpc.dynamic_ssl_server_credentials(
            self._certificate_configuration(), fetch, require_client_authentication=require
        )


class ClientTLS(BaseModel):
    """A gRPC channel's TLS: the CA that the server's certificate must chain to; with a client
    certificate and key, mutual TLS."""

    model_config = ConfigDict(extra="forbid")

    ca_file: Path | None = None  # PEM CA bundle; None: the system's trusted roots
    cert_file: Path | None = None  # the client's certificate chain, for mutual TLS
    key_file: Path | None = None
    # The name the server's certificate must carry when it differs from the address' host.
    server_name: str | None = None

    @model_validator(mode="after")
    def _files_usable(self) -> ClientTLS:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (a client certificate needs its key)")
        if self.ca_file is not None:
            check_ca(self.ca_file, "TLS CA")
        if self.cert_file is not None and self.key_file is not None:
            check_pair(self.cert_file, self.key_file, "TLS client")
        return self

    def credentials(self) -> grpc.ChannelCredentials:
        ca = read_pem(self.ca_file, "TLS CA") if self.ca_file is not None else None
        key = read_pem(self.key_file, "TLS client key") if self.key_file is not None else None
        cert = read_pem(self.cert_file, "TLS client certificate") if self.cert_file is not None else None
        return grpc.ssl_channel_credentials(ca, key, cert)

    def options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def channel(self, address: str, options: list[tuple[str, object]] | None = None) -> grpc.Channel:
        return grpc.secure_channel(address, self.credentials(), [*(options or []), *self.options()])
