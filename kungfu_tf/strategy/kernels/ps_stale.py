"""Stale-synchronous and asynchronous parameter-server kernel (``staleness > 0``, ``sync = false``).

Nobody waits for a collective here. Each step:

1. every worker *pushes* its gradient to the owner, whose runtime adds it to
   an accumulator as it arrives (no step of the owner's is needed);
2. the owner *takes* the accumulated sum, applies ``sum / size`` (the same
   scale as synchronous training) and saves the new value in its p2p store,
   versioned by its step count;
3. the others fetch the owner's newest value.

Bounded staleness (SSP) is enforced with clocks: after step ``t`` (0-based)
each worker saves ``clock = t + 1`` and waits until every worker's clock is at
least ``t + 1 - K``, and until the owner's value includes ``t + 1 - K`` of the
owner's steps; so no worker is ever more than ``K`` steps ahead of the
slowest. With ``sync = false`` nobody waits: a worker only needs some value
of the owner's (the first one, at its first step).

Sparse gradients (``IndexedSlices``) move only rows, both ways: workers push
the rows they touched, which the owner's runtime scatter-adds into a table
accumulator; the owner applies the rows it took as an ``IndexedSlices``
gradient and publishes the rows its update changed (found by comparing the
table before and after, exact for every optimizer); each worker then fetches
the rows changed since the version it last received, however many versions
ago that was (the whole table on its first fetch).

Example:
    >>> from kungfu_tf.strategy.kernels.ps_stale import clock_blob
    >>> clock_blob("sgd")
    'sgd/clock'
"""

from __future__ import annotations

import tensorflow as tf

from kungfu_tf.ops import p2p
from kungfu_tf.strategy.kernels.ps_sync import changed_rows


def clock_blob(prefix: str) -> str:
    """Name under which each worker saves its step clock."""
    return f"{prefix}/clock"


def push_gradient(g: tf.Tensor, owner: int, blob: str) -> tf.Operation | None:
    """Adds ``g`` to the owner's accumulator ``blob`` (locally on the owner itself)."""
    return p2p.push(owner, blob, g)


def take_mean(blob: str, like: tf.Tensor, size: int) -> tf.Tensor:
    """The owner's accumulated gradients since its last take, divided by the cluster size."""
    total, _count = p2p.take(blob, like)
    return total / tf.cast(size, total.dtype)


def save_value(value: tf.Tensor, blob: str, version: tf.Tensor) -> tf.Operation | None:
    """The owner publishes ``value`` as ``version`` (its number of applied steps)."""
    return p2p.save(blob, value, version=version)


def fetch_value(owner: int, blob: str, min_version: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """The owner's newest value of at least ``min_version`` (waits until it exists)."""
    value, _version = p2p.request_at_least(owner, blob, tf.maximum(min_version, 0), like)
    return value


def wait_for_clocks(prefix: str, rank: int, size: int, min_clock: tf.Tensor) -> list[tf.Tensor]:
    """Waits until every other worker's clock is at least ``min_clock``; returns what each had."""
    like = tf.zeros([], tf.int64)
    min_clock = tf.maximum(min_clock, 0)  # early steps: any clock will do
    return [
        p2p.request_at_least(peer, clock_blob(prefix), min_clock, like)[1] for peer in range(size) if peer != rank
    ]


def save_clock(prefix: str, clock: tf.Tensor) -> tf.Operation | None:
    """Publishes this worker's clock (steps completed) for the others to wait on."""
    return p2p.save(clock_blob(prefix), clock, version=clock)


def push_rows(g: tf.IndexedSlices, owner: int, blob: str, num_rows: int) -> tf.Operation | None:
    """Adds the rows of ``g`` to the owner's table accumulator ``blob`` (only these rows travel)."""
    return p2p.push_rows(owner, blob, g, num_rows)


def take_mean_rows(blob: str, shape: tuple[int, ...], dtype: tf.DType, size: int) -> tf.IndexedSlices:
    """The rows pushed since the owner's last take, summed and divided by the cluster size."""
    rows, total, _count = p2p.take_rows(blob, shape, dtype)
    return tf.IndexedSlices(total / tf.cast(size, total.dtype), tf.cast(rows, tf.int32), tf.constant(shape, tf.int64))


def save_changed_rows(
    blob: str, before: tf.Tensor, table: tf.Tensor, version: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The owner publishes ``table`` as ``version``; returns (changed rows, their values, version once saved)."""
    after = tf.convert_to_tensor(table)
    rows = changed_rows(before, after)
    saved = p2p.save_rows(blob, after, rows, version)
    with tf.control_dependencies([saved] if saved is not None else []):
        return rows, tf.gather(after, rows), tf.identity(version)


def fetch_rows(
    owner: int, blob: str, min_version: tf.Tensor, shape: tuple[int, ...], dtype: tf.DType
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(rows, values, version): what this worker's copy lacks of the owner's newest version >= ``min_version``."""
    rows, values, version = p2p.request_rows(owner, blob, tf.maximum(min_version, 0), shape, dtype)
    return tf.cast(rows, tf.int32), values, version
