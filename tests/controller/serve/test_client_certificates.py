"""`dualloop stream --address` and `dualloop admin` to a server that requires client certificates
(mutual TLS): --cert-file and --key-file (ClientCredentials, shared by both) present one, and without
them the refusal names the two options (the commands could present none, so they could not reach
such a server at all)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dualloop.controller.cli import main
from dualloop.controller.logs.synthetic import REAL_DRIVE
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.controller.serve.security import AuthConfig
from dualloop.planner.tls import ServerTLS
from tests.controller.serve.servers import shipped
from tests.controller.serve.tls_certs import Issued, TestCA


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Issued | TestCA]:
    folder = tmp_path_factory.mktemp("pki")
    ca = TestCA(folder, "ca")
    return {"ca": ca, "shadow-rig": ca.client_cert("shadow-rig"), "ops": ca.client_cert("ops")}


@pytest.fixture(scope="module")
def mutual(pki: dict[str, Issued | TestCA]) -> Iterator[ServerThread]:
    """A server that refuses handshakes without a client certificate from its CA, and allows callers
    by the certificate's name: a shadow stack and an operator, no tokens."""
    ca, server = pki["ca"], pki["ca"].server_cert()  # type: ignore[union-attr]
    tls = ServerTLS(cert_file=server.cert_file, key_file=server.key_file, client_ca_file=ca.cert_file)
    assert tls.require_client_cert
    auth = AuthConfig(shadow_client_identities=["shadow-rig"], admin_client_identities=["ops"], tokens_env=None)
    with shipped(tls=tls, auth=auth) as srv:
        yield srv


def ca_flags(pki: dict[str, Issued | TestCA], client: str | None = None) -> list[str]:
    flags = ["--ca-file", str(pki["ca"].cert_file)]
    if client is not None:
        issued = pki[client]
        flags += ["--cert-file", str(issued.cert_file), "--key-file", str(issued.key_file)]
    return flags


def run(*args: str) -> tuple[int, str, str]:
    """The command in its own process: its exit code, stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUALLOOP_")}
    cmd = [sys.executable, "-m", "dualloop.controller.cli", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def stream_args(server: ServerThread) -> list[str]:
    # every 10th observation at 20x: a few hundred observations in a few seconds
    return ["stream", str(REAL_DRIVE), "--address", server.address, "--every", "10", "--speed", "20"]


def test_stream_with_a_client_certificate_streams(mutual: ServerThread, pki: dict[str, Issued | TestCA]) -> None:
    code, out, err = run(*stream_args(mutual), *ca_flags(pki, "shadow-rig"))
    assert code == 0, out + err
    summary = next(line for line in out.splitlines() if " snapshots; " in line)
    sent, snapshots = (int(summary.split(f" {what}")[0].split()[-1]) for what in ("observations sent", "snapshots;"))
    assert sent > 100 and snapshots > 0, summary


def test_stream_without_a_client_certificate_names_the_options(
    mutual: ServerThread, pki: dict[str, Issued | TestCA]
) -> None:
    code, out, err = run(*stream_args(mutual), *ca_flags(pki))
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1 and "UNAVAILABLE" in lines[0], out + err
    assert "--cert-file and --key-file" in lines[0] and "--ca-file" not in lines[0], lines


def test_admin_with_a_client_certificate_reaches_the_admin_rpc(
    mutual: ServerThread, pki: dict[str, Issued | TestCA]
) -> None:
    """The operator's certificate gets as far as the admin RPC's own refusal (nothing to promote)."""
    code, out, err = run("admin", "promote", "--address", mutual.address, *ca_flags(pki, "ops"))
    assert code == 1 and "FAILED_PRECONDITION: no candidate loaded" in out, out + err


def test_admin_without_a_client_certificate_names_the_options(
    mutual: ServerThread, pki: dict[str, Issued | TestCA]
) -> None:
    code, out, err = run("admin", "promote", "--address", mutual.address, *ca_flags(pki))
    assert code == 1 and "UNAVAILABLE" in out and "--cert-file and --key-file" in out, out + err


@pytest.mark.parametrize("command", ["stream", "admin"])
@pytest.mark.parametrize("given", ["--cert-file", "--key-file"])
def test_one_of_the_pair_is_refused_naming_both(
    mutual: ServerThread,
    pki: dict[str, Issued | TestCA],
    capsys: pytest.CaptureFixture[str],
    command: str,
    given: str,
) -> None:
    issued = pki["ops"]
    path = issued.cert_file if given == "--cert-file" else issued.key_file  # type: ignore[union-attr]
    args = ["stream", str(REAL_DRIVE)] if command == "stream" else ["admin", "promote"]
    assert main([*args, "--address", mutual.address, *ca_flags(pki), given, str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--cert-file and --key-file go together" in lines[0], lines


def _encrypted_key(folder: Path) -> Path:
    path = folder / "encrypted.key"
    key = ec.generate_private_key(ec.SECP256R1())
    encryption = serialization.BestAvailableEncryption(b"a passphrase")
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    return path


@pytest.mark.parametrize("command", ["stream", "admin"])
@pytest.mark.parametrize("problem", ["missing certificate", "not a PEM key", "another's key", "encrypted key"])
def test_an_unusable_certificate_or_key_is_named(
    pki: dict[str, Issued | TestCA], tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, problem: str
) -> None:
    """Refused before connecting, in one line naming the option and its file (no server needed)."""
    ops, rig = pki["ops"], pki["shadow-rig"]
    cert, key = ops.cert_file, ops.key_file  # type: ignore[union-attr]
    if problem == "missing certificate":
        cert, expected = tmp_path / "missing.crt", f"--cert-file {tmp_path / 'missing.crt'}: cannot read"
    elif problem == "not a PEM key":
        key = tmp_path / "key.pem"
        key.write_text("not a key\n")
        expected = f"--key-file {key}: not a PEM file"
    elif problem == "another's key":
        key = rig.key_file  # type: ignore[union-attr]
        expected = f"--cert-file {cert} and --key-file {key} cannot be used together"
    else:
        key = _encrypted_key(tmp_path)
        expected = f"--key-file {key}: the key is encrypted"
    args = ["stream", str(REAL_DRIVE)] if command == "stream" else ["admin", "promote"]
    flags = [*ca_flags(pki), "--cert-file", str(cert), "--key-file", str(key)]
    assert main([*args, "--address", "127.0.0.1:1", *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines


def test_a_client_certificate_without_address_is_refused(
    pki: dict[str, Issued | TestCA], capsys: pytest.CaptureFixture[str]
) -> None:
    """The server `stream` starts itself is plaintext on loopback: a certificate for it is a mistake."""
    assert main(["stream", str(REAL_DRIVE), *ca_flags(pki, "ops")[2:]]) == 2
    assert "--cert-file and --key-file go with --address" in capsys.readouterr().err
