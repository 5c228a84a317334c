"""Network addresses, for the API server and the sandbox service alike."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether a bind address or a Host header's name is this machine only ('127.0.0.1', '::1', '[::1]',
    'localhost'). A wildcard ('0.0.0.0', '::') is every interface, not loopback."""
    name = host.strip("[]")
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return name == "localhost"


def host_name(header: str) -> str:
    """The name of an HTTP Host header, without its port: 'localhost:8000' -> 'localhost', '[::1]:8000' -> '[::1]'."""
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0]
