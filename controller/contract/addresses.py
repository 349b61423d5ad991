"""Server addresses as the server binds them and its clients dial them: loopback or not, host:port."""

from __future__ import annotations

import ipaddress


def bare_host(host: str) -> str:
    """The host without the brackets a URL puts around an IPv6 address ("[::1]" -> "::1")."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1, with or without brackets."""
    bare = bare_host(host.strip())
    if bare.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def host_port(host: str, port: int) -> str:
    """host:port as gRPC parses it: an IPv6 address in brackets ("[::1]:50151"), given with or without."""
    bare = bare_host(host.strip())
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"
