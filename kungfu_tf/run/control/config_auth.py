"""Challenge–response for the config service: the job secret never crosses the wire.

Every call of the ConfigService (but ``Challenge`` itself) is authenticated
both ways by HMAC-SHA256 keyed with the job secret:

1. the client asks for a challenge; the server answers a fresh random nonce
   (32 bytes, single use, valid for ``NONCE_LIFETIME_SECONDS``);
2. the client sends the call with the nonce and
   ``HMAC(secret, "request", nonce, method, job id, SHA-256(request bytes))``
   as gRPC metadata; the server redeems the nonce (whatever the outcome, so
   each nonce allows one guess) and compares with ``hmac.compare_digest``;
3. the server answers with
   ``HMAC(secret, "response", nonce, method, job id, SHA-256(response bytes))``
   in the trailing metadata, which the client checks before using the answer.

So an eavesdropper sees nonces and MACs only, which it can neither replay
(nonces are single use), move to another method, job or request body, nor
turn back into the secret; and a client never trusts an answer from a server
that does not hold the secret. The channel stays unencrypted: cluster
contents (hosts and ports) are visible on the network, but not forgeable.

Example:
    >>> from kungfu_tf.run.control.config_auth import request_mac
    >>> len(request_mac(b"secret", b"n" * 32, "/kungfu.ConfigService/GetCluster", "job-1", b""))
    64
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import threading
import time
from collections import OrderedDict

NONCE_METADATA_KEY = "kungfu-auth-nonce"
MAC_METADATA_KEY = "kungfu-auth-mac"
SERVER_MAC_METADATA_KEY = "kungfu-auth-server-mac"
NONCE_BYTES = 32
NONCE_LIFETIME_SECONDS = 60.0
# Challenges outstanding at once; beyond it the oldest is forgotten, so a flood
# of Challenge calls costs bounded memory (and fails only the flooder's calls
# and, at worst, a concurrent honest call, which can retry).
MAX_OUTSTANDING_NONCES = 4096
_DOMAIN = b"kungfu-config-auth-v1"


def _mac(key: bytes, role: bytes, nonce: bytes, method: str, job_id: str, body: bytes) -> str:
    # Every field length-prefixed, so no two different field lists give one message.
    fields = (_DOMAIN, role, nonce, method.encode(), job_id.encode(), hashlib.sha256(body).digest())
    message = b"".join(struct.pack(">I", len(f)) + f for f in fields)
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def request_mac(key: bytes, nonce: bytes, method: str, job_id: str, request: bytes) -> str:
    """The client's proof for one call (hex): binds key, nonce, method, job and request bytes."""
    return _mac(key, b"request", nonce, method, job_id, request)


def response_mac(key: bytes, nonce: bytes, method: str, job_id: str, response: bytes) -> str:
    """The server's proof for its answer (hex), over the same nonce, method and job."""
    return _mac(key, b"response", nonce, method, job_id, response)


def macs_equal(expected: str, got: str | bytes | None) -> bool:
    """Constant-time comparison of a MAC with one received as metadata."""
    if isinstance(got, bytes):
        try:
            got = got.decode("ascii")
        except UnicodeDecodeError:
            return False
    if not isinstance(got, str) or not got.isascii():
        return False
    return hmac.compare_digest(expected, got)


class NonceBook:
    """The server's outstanding challenges: issued once, redeemed at most once.

    Example:
        >>> book = NonceBook()
        >>> n = book.issue()
        >>> book.redeem(n), book.redeem(n)
        (True, False)
    """

    def __init__(self, lifetime: float = NONCE_LIFETIME_SECONDS, capacity: int = MAX_OUTSTANDING_NONCES):
        """Nonces expire after ``lifetime`` seconds; at most ``capacity`` are kept."""
        self._lifetime = lifetime
        self._capacity = capacity
        self._expiry: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def issue(self) -> bytes:
        """A fresh random nonce, remembered until redeemed or expired."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        now = time.monotonic()
        with self._lock:
            while self._expiry and (len(self._expiry) >= self._capacity or next(iter(self._expiry.values())) < now):
                self._expiry.popitem(last=False)  # oldest first: issue order is expiry order
            self._expiry[nonce] = now + self._lifetime
        return nonce

    def redeem(self, nonce: bytes) -> bool:
        """True once for a nonce this book issued that has not expired; forgets it."""
        with self._lock:
            expiry = self._expiry.pop(nonce, None)
        return expiry is not None and time.monotonic() <= expiry
