"""Kafka's listener syntax: ``NAME://HOST:PORT``, the name being the security protocol.

``HOST`` is a host name, an IPv4 address, an IPv6 address in brackets (``[::1]``) or empty for every
interface; ``PORT`` is 0 to 65535 (0: an ephemeral port chosen at bind time).  A bare ``HOST:PORT`` means
``PLAINTEXT``.  Malformed text raises :class:`~appliance.config.settings.Invalid` (a ``ValueError``) saying
what was expected; the configuration adds the key.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final

from appliance.config.settings import Invalid, text

__all__ = ["SECURITY_PROTOCOLS", "Listener", "parse_listener", "split_host_port"]

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")


@dataclass(frozen=True, slots=True)
class Listener:
    """One ``NAME://HOST:PORT`` entry of ``listeners``.  The name is the security protocol."""

    name: str  # PLAINTEXT, SASL_PLAINTEXT, SSL or SASL_SSL
    host: str  # "" binds every interface, as in Kafka; IPv6 without brackets
    port: int  # 0 = an ephemeral port chosen at bind time (tests)

    @property
    def security_protocol(self) -> str:
        return self.name

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def address(self) -> tuple[str, int]:
        """What to pass to ``socket.bind``: every interface for an empty host."""
        return (self.host, self.port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")


def split_host_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPV6]:PORT`` as (host without brackets, port); the host may be empty."""
    if address.startswith("["):
        host, sep, rest = address[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise Invalid(f"{address!r}: expected [IPV6]:PORT")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise Invalid(f"{address!r}: {host!r} is not an IPv6 address") from None
        port_text = rest[1:]
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            raise Invalid(f"{address!r}: expected HOST:PORT")
        if ":" in host:
            raise Invalid(f"{address!r}: write an IPv6 host in brackets, [::1]:9092")
        if host and not _HOSTNAME.fullmatch(host):
            raise Invalid(f"{address!r}: {host!r} is not a host name or address")
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise Invalid(f"{address!r}: the port must be a number from 0 to 65535")
    return host, int(port_text)


def parse_listener(listener: str) -> Listener:
    """Parse ``NAME://HOST:PORT`` (a bare ``HOST:PORT`` means PLAINTEXT); ``ValueError`` if malformed."""
    listener = text(listener).strip()
    name, sep, rest = listener.partition("://")
    if not sep:
        name, rest = "PLAINTEXT", listener
    name = name.upper()
    if name not in SECURITY_PROTOCOLS:
        known = ", ".join(SECURITY_PROTOCOLS)
        raise Invalid(f"{listener!r}: unknown listener name {name!r}: expected one of {known}")
    host, port = split_host_port(rest)
    return Listener(name, host, port)
