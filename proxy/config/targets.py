"""What ``--discover`` and ``--dns-server`` say, parsed (no I/O): a DNS target and a DNS server address.

``dns://NAME:PORT`` is a name whose A/AAAA records are replicas on PORT; ``dns+srv://NAME`` a name whose
SRV records name the replicas and their ports (``proxy/fleet/discovery.py`` resolves both). A target
that names an IP address is refused: an address is a ``--backend``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

Scheme = Literal["dns", "dns+srv"]


@dataclass(frozen=True, slots=True)
class Target:
    scheme: Scheme
    name: str
    port: int | None  # dns:// only; SRV records carry their own ports

    def __str__(self) -> str:
        return f"{self.scheme}://{self.name}" + (f":{self.port}" if self.port is not None else "")


def parse_target(uri: str) -> Target:
    """``dns://NAME:PORT`` or ``dns+srv://NAME``; ValueError naming what is wrong."""
    parts = urlsplit(uri.strip())
    usage = "expected dns://NAME:PORT or dns+srv://_PORT._PROTO.NAME"
    if parts.scheme not in ("dns", "dns+srv") or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"{usage}, got {uri!r}")
    if is_address(parts.hostname):
        raise ValueError(f"{uri!r} names an address, not a DNS name: give it with --backend")
    if parts.scheme == "dns+srv":
        if parts.port is not None:
            raise ValueError(f"{uri!r}: SRV records carry the ports; give none")
        return Target("dns+srv", parts.hostname, None)
    if parts.port is None:
        raise ValueError(f"{usage}: {uri!r} has no port")
    return Target("dns", parts.hostname, parts.port)


def parse_dns_server(value: str) -> tuple[str, int]:
    """``HOST[:PORT]`` with HOST an IP address (``[v6]:PORT`` for IPv6 with a port); port 53 by default."""
    text = value.strip()
    host, port = text, "53"
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":") or "53"
    elif text.count(":") == 1:
        host, port = text.split(":")
    if not is_address(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected an IP address with an optional port (HOST[:PORT]), got {value!r}")
    return host, int(port)


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
