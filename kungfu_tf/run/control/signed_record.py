"""Records authenticated with the job secret, for a store that others may write to.

A shared config store (etcd) may be reachable by processes that are not
part of the job; etcd's own TLS and auth are configurable but not assumed.
Each record kungfu-run writes there is sealed with
``HMAC-SHA256(secret, domain, job id, key, payload)``, so a record written
without the job's secret, for another job, or copied to another key does
not open: readers ignore it and log its key and why.

Example:
    >>> sealed = seal_record("s3cret", "job-1", "/kungfu/job-1/state", {"version": 1})
    >>> open_record("s3cret", "job-1", "/kungfu/job-1/state", sealed)
    {'version': 1}
    >>> try:
    ...     open_record("other", "job-1", "/kungfu/job-1/state", sealed)
    ... except UnauthenticRecordError as e:
    ...     print(e)
    its tag does not match the job secret (written by a process without the job's secret, or for another job)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct

__all__ = ["UnauthenticRecordError", "open_record", "seal_record"]

_DOMAIN = b"kungfu-store-record-v1"


class UnauthenticRecordError(ValueError):
    """A stored value that is not a record sealed with this job's secret (the message says why)."""


def _tag(secret: str, job_id: str, key: str, payload: bytes) -> str:
    # Every field length-prefixed, so no two different field lists give one message.
    fields = (_DOMAIN, job_id.encode(), key.encode(), payload)
    message = b"".join(struct.pack(">I", len(f)) + f for f in fields)
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def seal_record(secret: str, job_id: str, key: str, data: dict) -> bytes:
    """``data`` as JSON with its tag, for storing at ``key``."""
    payload = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return json.dumps({"payload": payload, "tag": _tag(secret, job_id, key, payload.encode())}).encode()


def open_record(secret: str, job_id: str, key: str, value: bytes) -> dict:
    """The data sealed in ``value`` at ``key``.

    Raises:
        UnauthenticRecordError: ``value`` is not such a record, or its tag
            does not match (another secret, job or key).
    """
    try:
        outer = json.loads(value)
        payload, tag = outer["payload"], outer["tag"]
        if not isinstance(payload, str) or not isinstance(tag, str):
            raise TypeError
    except (ValueError, TypeError, KeyError):
        raise UnauthenticRecordError(
            f"not a sealed record ({len(value)} bytes starting {value[:32]!r})"
        ) from None
    if not hmac.compare_digest(_tag(secret, job_id, key, payload.encode()), tag):
        raise UnauthenticRecordError(
            "its tag does not match the job secret (written by a process without the job's secret, or for another job)"
        )
    data = json.loads(payload)
    if not isinstance(data, dict):
        raise UnauthenticRecordError("its payload is not an object")
    return data
