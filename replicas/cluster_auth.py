"""Replication connections are authenticated: SASL/PLAIN with the cluster's shared secret.

Theory of operation
-------------------
Every node of a replicated set reads the same secret from ``appliance.cluster.secret.file`` (a file only the
service's user can read; under systemd ``LoadCredential=`` can provide it).  A follower opens its
connection to the leader with SaslHandshake v1 (mechanism PLAIN) and SaslAuthenticate carrying
``\\0replica-<node.id>\\0<secret>`` (RFC 4616: authorization id, user, password).  The broker answers:

* SaslHandshake: PLAIN is offered only when a secret is configured (else UNSUPPORTED_SASL_MECHANISM); v0
  (raw SASL tokens outside Kafka framing) is refused with ILLEGAL_SASL_STATE: replicas speak v1;
* SaslAuthenticate: the password is compared in constant time; a match marks the connection as a
  replica's, a mismatch is answered SASL_AUTHENTICATION_FAILED and the connection is closed (Kafka closes
  it too), with one log line naming the peer and the user.

With a secret configured, the broker serves replica requests -- Fetch, ListOffsets and
OffsetsForLeaderEpoch with ``replica_id >= 0`` -- only on authenticated connections, and answers the
others CLUSTER_AUTHORIZATION_FAILED.  Consumers and producers (``replica_id`` -1) are not affected: the
listener stays PLAINTEXT; this module only decides who may act as a replica.  Without a secret every
connection may (a single host, or a private network: listeners bind to loopback unless configured
otherwise).

The password never travels in clear beyond the connection it authenticates, but PLAIN over PLAINTEXT is
readable on the wire: run replication over a private network (or a VPN/TLS tunnel) when hosts are apart.
"""

from __future__ import annotations

import hmac
import logging
import os
import stat
from typing import Final, NamedTuple

from ipc.kafka import ErrorCode
from storage.errors import ConfigError

__all__ = [
    "PLAIN",
    "SaslOutcome",
    "SaslPlainServer",
    "parse_plain_token",
    "read_cluster_secret",
    "replica_credentials",
]

PLAIN: Final = "PLAIN"
MAX_SECRET_BYTES: Final = 4096

_log = logging.getLogger("appliance.cluster_auth")


def read_cluster_secret(path: str | None) -> str | None:
    """The shared secret in ``path`` (one line; a trailing newline is dropped), or None without a path.

    ConfigError for a missing, unreadable, empty or oversized file.  A file others may read is accepted with
    a warning (anyone who reads it can act as a replica)."""
    if not path:
        return None
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            data = f.read(MAX_SECRET_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"appliance.cluster.secret.file {path}: cannot read it: {e.strerror}") from None
    if len(data) > MAX_SECRET_BYTES:
        raise ConfigError(f"appliance.cluster.secret.file {path}: over {MAX_SECRET_BYTES} bytes; a secret is "
                          "one line")
    text = data.decode("utf-8", errors="strict").rstrip("\r\n")
    if not text or "\0" in text:
        raise ConfigError(f"appliance.cluster.secret.file {path}: empty, or holds a NUL byte: put one line "
                          "of random text there (e.g. `openssl rand -hex 32`)")
    if st.st_mode & (stat.S_IRGRP | stat.S_IROTH):
        _log.warning("appliance.cluster.secret.file %s is readable by others (mode %o): whoever reads it can "
                     "act as a replica; chmod 600 it", path, stat.S_IMODE(st.st_mode))
    return text


def replica_credentials(node_id: int, secret: str | None) -> tuple[str, str] | None:
    """(user, password) a follower presents, or None without a secret."""
    return None if secret is None else (f"replica-{node_id}", secret)


def parse_plain_token(token: bytes) -> tuple[str, str, str] | None:
    """``authzid \\0 user \\0 password`` (RFC 4616) as text, or None if malformed."""
    parts = token.split(b"\0")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        return None
    try:
        authzid, user, password = (part.decode("utf-8") for part in parts)
    except UnicodeDecodeError:
        return None
    return authzid, user, password


class SaslOutcome(NamedTuple):
    error: ErrorCode
    message: str | None = None
    principal: str | None = None  # set when the connection is now a replica's


class SaslPlainServer:
    """The broker's side of SASL/PLAIN, sans-IO: the connection keeps the state (``mechanism``,
    ``principal``), this object knows the secret.  ``required`` is False without a secret."""

    def __init__(self, secret: str | None) -> None:
        self._secret = secret.encode() if secret is not None else None

    @property
    def required(self) -> bool:
        return self._secret is not None

    def handshake(self, version: int, mechanism: str) -> tuple[ErrorCode, list[str]]:
        offered = [PLAIN] if self._secret is not None else []
        if version < 1:
            return ErrorCode.ILLEGAL_SASL_STATE, offered
        if mechanism != PLAIN or not offered:
            return ErrorCode.UNSUPPORTED_SASL_MECHANISM, offered
        return ErrorCode.NONE, offered

    def authenticate(self, handshaken: bool, token: bytes) -> SaslOutcome:
        if self._secret is None or not handshaken:
            return SaslOutcome(ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate before a PLAIN SaslHandshake")
        parsed = parse_plain_token(bytes(token))
        if parsed is None:
            return SaslOutcome(ErrorCode.SASL_AUTHENTICATION_FAILED, "malformed PLAIN token")
        _, user, password = parsed
        if not hmac.compare_digest(password.encode(), self._secret):
            return SaslOutcome(ErrorCode.SASL_AUTHENTICATION_FAILED,
                               f"authentication failed for user {user!r}: wrong cluster secret")
        return SaslOutcome(ErrorCode.NONE, None, user)
