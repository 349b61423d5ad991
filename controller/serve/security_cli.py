"""`dualloop serve` flags for TLS and authentication, mapped onto ServerConfig.tls / .auth."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dualloop.controller.contract.addresses import is_loopback
from dualloop.controller.serve.config import ServerConfig


def add_security_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security (docs/operations.md, threat model)")
    g.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve TLS only (with --tls-key)")
    g.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    g.add_argument("--tls-client-ca", type=Path, help="PEM CA bundle: mutual TLS, clients need a certificate from it")
    g.add_argument(
        "--tokens-file",
        type=Path,
        help="bearer tokens, one per line ('shadow:<token>': shadow sessions only; 'admin:<token>': also the admin "
        "RPCs); also $DUALLOOP_TOKENS",
    )
    g.add_argument(
        "--client-identity",
        action="append",
        help="mTLS: a client certificate CN/SAN allowed to call (repeat); with tokens, both are needed",
    )
    g.add_argument(
        "--shadow-client-identity", action="append", help="mTLS: a CN/SAN allowed to open shadow sessions only"
    )
    g.add_argument(
        "--admin-client-identity",
        action="append",
        help="mTLS: a CN/SAN allowed to call the admin RPCs too (load and promote a candidate model)",
    )
    g.add_argument(
        "--insecure-plaintext-on-network",
        action="store_true",
        help="DANGEROUS: serve plaintext (no TLS) on a non-loopback --host; anyone on the network can read and drive",
    )


def security_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword overrides for load_server_config; sections merge with the file's."""
    tls = {
        k: v
        for k, v in (("cert_file", args.tls_cert), ("key_file", args.tls_key), ("client_ca_file", args.tls_client_ca))
        if v is not None
    }
    auth = {
        k: v
        for k, v in (
            ("tokens_file", args.tokens_file),
            ("client_identities", args.client_identity),
            ("shadow_client_identities", args.shadow_client_identity),
            ("admin_client_identities", args.admin_client_identity),
        )
        if v is not None
    }
    return {
        "tls": tls or None,
        "auth": auth or None,
        "allow_insecure_non_loopback": True if args.insecure_plaintext_on_network else None,
    }


def security_summary(config: ServerConfig, authenticated: bool) -> str:
    """For the start line: what protects this server (and a warning when nothing does beyond loopback)."""
    tls = config.tls
    transport = "plaintext" if tls is None else "mutual TLS" if tls.mutual and tls.require_client_cert else "TLS"
    text = f"{transport}, {'authentication on' if authenticated else 'no authentication'}"
    if not is_loopback(config.host):
        if tls is None:
            text += " [WARNING: plaintext on the network]"
        elif not authenticated and not (tls.mutual and tls.require_client_cert):
            text += " [WARNING: anyone who reaches this address may drive sessions]"
    return text
