"""Which hosts are this machine. One answer for every place that asks: configuration rules (a listener
on loopback needs no credentials), clients, peers and scalers (a token never goes over plain http to
another host), and the HTTP gateway's guard against DNS rebinding (the Host header of a request to a
server without credentials).

Only ``localhost`` and loopback IP addresses count: any other name may resolve anywhere.
"""

from __future__ import annotations

import ipaddress
import re

# A Host header: a name or IPv4 address, or an IPv6 address in brackets, each with an optional port.
_HOST_HEADER = re.compile(r"(?:\[(?P<v6>[^\]]+)\]|(?P<name>[^:\[\]]+))(?::[0-9]{1,5})?")


def is_loopback_name(host: str) -> bool:
    """``localhost`` or a loopback IP address (no port, no brackets): a host whose traffic never leaves
    this machine, so a token sent to it in the clear is not exposed."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_host_header(value: str | None) -> bool:
    """A Host header naming this machine: ``localhost``, ``127.0.0.0/8`` or ``[::1]``, each with an
    optional port (an IPv6 address only in brackets, as HTTP writes it)."""
    match = _HOST_HEADER.fullmatch(value or "")
    if match is None:
        return False
    if match["v6"] is not None:
        return ":" in match["v6"] and is_loopback_name(match["v6"])
    return is_loopback_name(match["name"])
