"""``resize``: change the number of workers of an elastic job while it trains (KungFu Tab. 2).

Every member calls ``resize`` at the same point between steps, with the same
request. ``(changed, detached)`` says whether this worker now uses another
cluster and whether it has left the job (it should end its training loop and
exit 0). Survivors keep their processes, graphs, variables and optimizer
slots.

* ``resize(n)`` with ``n`` < size (shrink): the workers of rank >= n leave.
  The members agree on the request (consensus), the lowest rank commits the
  new cluster to the config service (PutCluster), all confirm the commit on
  the old cluster (all_reduce(min) of a success flag) and apply it.
* ``resize(workers=[...])``: the cluster becomes exactly these current
  members, in this order (evicts the others, e.g. a straggler).
* ``resize(n)`` with ``n`` > size (grow): asks the config service for ``n``
  workers (RequestSize); launchers start joiners, which warm up on their own
  and are admitted when ready, so growth is asynchronous: the call returns
  ``changed=False`` until the joiners are admitted, and the call that
  applies their version returns ``changed=True`` (any later ``resize(n)``,
  ``ElasticState.check()`` or ``resize()`` does). ``wait=True`` blocks until
  the cluster has ``n`` workers.
* Plain processes (KungFu's elastic scripts: no ``ElasticState`` or other
  apply listener in the process): ``resize(n)`` grows synchronously: rank 0
  declares the job plain (its model signature becomes
  ``job_state.PLAIN_SIGNATURE``), the launcher's joiners run the script from
  the top and are admitted at their first collective
  (kungfu_tf/ops/plain_joiner.py), and the call returns ``changed=True`` once
  the cluster has ``n`` workers; the script then gives them its state
  (``broadcast_variables`` from rank 0, in a ``tf.function`` or with
  ``name=``). After ``timeout`` a GrowthTimeoutError names the joiners and
  their states, on every member.
* ``resize()``: adopt the next committed version, if every member has seen
  one (the same as ``ElasticState.check()`` without the state).

Applying a version runs the apply listeners (kungfu_tf.elastic's state sync),
so after ``changed=True`` every member (joiners too) holds the same state.

Bad requests raise before anything changes, the same error on every worker:
``new_size`` < 1 or not an integer, ``new_size`` outside the job's
``[--min-np, --max-np]``, ``workers`` that name an unknown or a repeated
peer, both arguments at once, or workers that asked for different things.

Example (inside ``kungfu-run --elastic -np 3``)::

    changed, detached = kungfu_tf.ops.resize(2)   # eager: bool tensors
    if detached:
        sys.exit(0)

In a ``tf.function`` or a v1 graph ``resize`` is a ``tf.py_function`` that
returns two bool tensors; order it after the step's updates (control
dependencies), never concurrently with the step's collectives.
"""

from __future__ import annotations

import json
import logging
import operator
from collections.abc import Callable, Sequence
from typing import SupportsIndex, cast

import numpy as np
import tensorflow as tf

from kungfu_tf.ops import elastic_membership as em
from kungfu_tf.ops.collective import all_reduce, consensus

__all__ = ["GrowthTimeoutError", "ResizeError", "resize"]

log = logging.getLogger("kungfu_tf.elastic")

# all_reduce(min) codes of the commit step; the lowest wins everywhere.
_COMMITTED, _CONFLICT, _REFUSED = 2, 1, 0


class ResizeError(RuntimeError):
    """A resize that cannot be done (workers disagree, the config service refused it, ...)."""


class GrowthTimeoutError(ResizeError, TimeoutError):
    """A growth that waited (``wait=True``, or plain processes) and did not reach its size within the timeout.

    Raised on every member at once; the message names the joiners and their states.
    """


def _check_size(new_size: object) -> int:
    if isinstance(new_size, (bool, np.bool_)):
        raise TypeError(f"resize: new_size must be an int >= 1, got the bool {new_size!r}")
    try:
        n = operator.index(cast(SupportsIndex, new_size))  # checked here: TypeError below
    except TypeError:
        raise TypeError(f"resize: new_size must be an int >= 1, got {type(new_size).__name__} {new_size!r}") from None
    if n < 1:
        raise ValueError(f"resize: new_size must be >= 1, got {n}")
    return n


def _check_workers(workers: object) -> tuple[str, ...]:
    if isinstance(workers, (str, bytes)) or not isinstance(workers, Sequence):
        raise TypeError(f"resize: workers must be a list of 'host:port' strings, got {workers!r}")
    out = []
    for i, w in enumerate(workers):
        if not isinstance(w, str):
            raise TypeError(f"resize: workers[{i}] must be a 'host:port' string, got {type(w).__name__} {w!r}")
        if w in out:
            raise ValueError(f"resize: workers[{i}] {w!r} appears more than once in {list(workers)!r}")
        out.append(w)
    if not out:
        raise ValueError("resize: workers must name at least one worker, got an empty list")
    return tuple(out)


def _request_bytes(new_size: int | None, workers: tuple[str, ...] | None, wait: bool) -> bytes:
    return json.dumps({"new_size": new_size, "workers": workers, "wait": wait}, sort_keys=True).encode()


def _agree(request: bytes, version: int) -> None:
    same = consensus(tf.constant(np.frombuffer(request, np.uint8)), name=f"kungfu/elastic/resize/{version}/request")
    if not bool(same):
        raise ResizeError(
            f"resize: the workers asked for different resizes (this worker: {request.decode()}); "
            "every member must call resize with the same arguments; nothing changed"
        )


def _confirm(code: int, version: int, what: str) -> int:
    """all_reduce(min) of ``code`` over the (old) cluster: everybody learns the worst outcome."""
    agreed = all_reduce(tf.constant([code], tf.int32), op="min", name=f"kungfu/elastic/resize/{version}/{what}", topology="STAR")
    return int(agreed.numpy()[0])


def _range_problem(size: int, state) -> str | None:
    low, high = int(state.min_size), int(state.max_size)
    if size < low or (high and size > high):
        upper = f"max {high}" if high else "no max"
        return (
            f"resize: new_size={size} is outside the job's [min {low}, {upper}] "
            "(kungfu-run --min-np/--max-np; the config service answers OUT_OF_RANGE); nothing changed"
        )
    return None


# Run on every member before a shrink commits, while the leaving workers are still members:
# ``prepare(old_peers, new_peers, version)`` hands over what they alone hold (a strategy's
# optimizer slots on parameter-server owners) or raises to refuse the change (nothing changed).
_shrink_preparations: list[Callable[[tuple[str, ...], tuple[str, ...], int], None]] = []


def add_shrink_preparation(prepare: Callable[[tuple[str, ...], tuple[str, ...], int], None]) -> Callable[[], None]:
    """Calls ``prepare(old_peers, new_peers, version)`` on every member before each shrink commits; returns a remover."""
    _shrink_preparations.append(prepare)

    def remove() -> None:
        if prepare in _shrink_preparations:
            _shrink_preparations.remove(prepare)

    return remove


# Run on every member before a growth to ``n`` workers is requested: ``check(n)`` raises to refuse
# it (a strategy written for a fixed number of replicas), so that nothing changes.
_growth_checks: list[Callable[[int], None]] = []


def add_growth_check(check: Callable[[int], None]) -> Callable[[], None]:
    """Calls ``check(new_size)`` on every member before each ``resize`` growth is requested; returns a remover."""
    _growth_checks.append(check)

    def remove() -> None:
        if check in _growth_checks:
            _growth_checks.remove(check)

    return remove


def _shrink_to(target: tuple[str, ...], version: int, peers: tuple[str, ...]) -> tuple[bool, bool]:
    """Commits ``target`` (a subset of the members) as version + 1 and applies it everywhere."""
    for prepare in _shrink_preparations:
        prepare(peers, target, version)
    code, detail = _COMMITTED, ""
    if em.self_peer() == peers[0]:
        import grpc

        from kungfu_tf.run.control.config_server import make_cluster
        from kungfu_tf.run.control.peer_string import parse_peer_string

        try:
            em.config_client().put_cluster(make_cluster(version + 1, [parse_peer_string(p) for p in target]))
        except grpc.RpcError as e:
            code_name = e.code().name
            detail = f"{code_name}: {e.details()}"
            code = _CONFLICT if code_name == "FAILED_PRECONDITION" else _REFUSED
    outcome = _confirm(code, version, "commit")
    log.info("kungfu elastic: resize commit of version %d confirmed (%d)", version + 1, outcome)
    if outcome == _CONFLICT:
        # Another change (a joiner admitted, a crash) got version + 1 first:
        # apply that one at the next check, then ask again.
        log.warning("kungfu elastic: resize lost a race for version %d%s; nothing changed", version + 1,
                    f" ({detail})" if detail else "")
        return False, False
    if outcome == _REFUSED:
        raise ResizeError(
            f"resize: the config service refused cluster version {version + 1} "
            + (f"({detail})" if detail else f"(see the log of {peers[0]}, which committed it)")
            + "; nothing changed"
        )
    change = em.apply_version(version + 1, target)
    return True, change.detached


def _adopt_pending() -> bool:
    return em.adopt_next() is not None


def _set_target_everywhere(n: int, state, version: int, peers: tuple[str, ...], what: str, refused: str,
                           plain: bool = False) -> None:  # fmt: skip
    """Rank 0 sets the job's target size to ``n`` (if it differs); every member learns the outcome.

    One all-reduce, whether or not rank 0 called the service (the job state
    each worker read may differ by a moment), so a refusal raises the same
    ResizeError everywhere instead of on rank 0 alone while the others go on
    into a collective it never joins. ``refused`` begins the error message.
    ``plain``: first declare the job one of plain processes (its joiners are
    admitted at their first collective, see kungfu_tf/ops/plain_joiner.py).
    """
    from kungfu_tf.run.control.job_state import PLAIN_SIGNATURE

    code, detail = _COMMITTED, ""
    if em.self_peer() == peers[0]:
        import grpc

        try:
            if plain and state.signature != PLAIN_SIGNATURE:
                em.config_client().set_signature(PLAIN_SIGNATURE)
            if int(state.target_size) != n:
                em.config_client().request_size(n)
        except grpc.RpcError as e:
            detail = f"{e.code().name}: {e.details()}"
            code = _REFUSED
    if _confirm(code, version, what) == _REFUSED:
        raise ResizeError(f"resize: {refused}" + (f" ({detail})" if detail else f" (see the log of {peers[0]})"))


def _grow_to(n: int, state, wait: bool, plain: bool, timeout: float) -> tuple[bool, bool]:
    for check in _growth_checks:
        check(n)  # raises on every member alike (the same strategy everywhere): nothing requested yet
    version, peers = em.current()
    _set_target_everywhere(n, state, version, peers, "request_size", f"the config service refused target size {n}",
                           plain=plain)  # fmt: skip
    if not wait:
        return _adopt_pending(), False
    # Every version applied while waiting (the first included) tells its
    # joiners that the members wait, so they wait with them.
    try:
        return em.wait_for_size(n, timeout), False
    except TimeoutError as e:
        raise GrowthTimeoutError(_growth_timeout(n, timeout, plain)) from e


def _growth_timeout(n: int, timeout: float, plain: bool) -> str:
    """What a growth that timed out found: the cluster, the joiners and their states, the job's limits."""
    from kungfu_tf.proto import config_pb2

    version, peers = em.current()
    try:
        state = em.config_client().get_job_state()
    except Exception as e:  # noqa: BLE001 - the message is the point; the service may be gone
        return f"resize({n}): the cluster did not reach {n} workers within {timeout:g} s (it has {len(peers)}); " \
               f"the config service cannot be read: {e}"
    joiners = ", ".join(
        f"{em.peer_of(j.peer)} {config_pb2.Joiner.State.Name(j.state)}" + (f" ({j.reason})" if j.reason else "")
        for j in state.joiners
    ) or "none (the launcher started none: is --max-np high enough, and does the job use kungfu-run --elastic?)"
    how = ("a joiner that is a plain process is admitted at its first collective or kungfu_tf.rank()/size() "
           "call" if plain else "a joiner is admitted after its warm-up, in ElasticState.join")  # fmt: skip
    return (
        f"resize({n}): the cluster did not reach {n} workers within {timeout:g} s (resize's timeout=, by default "
        f"the job's --timeout): it has {len(peers)} at version {version}; joiners: {joiners}; target {state.target_size}, "
        f"--max-np {state.max_size or 'none'}; {how}. The target stays {n}: a later resize() or resize({n}) "
        "adopts joiners admitted after this"
    )


def _cancel_growth(n: int, state, version: int, peers: tuple[str, ...]) -> None:
    """``resize(size)`` at the current size: the target goes back to it (a pending growth is cancelled)."""
    refused = f"the config service refused to set the target back to {n} workers (cancelling a pending growth)"
    _set_target_everywhere(n, state, version, peers, "cancel_growth", refused)


def _resize_now(new_size: int | None, workers: tuple[str, ...] | None, wait: bool | None,
                timeout: float) -> tuple[bool, bool]:  # fmt: skip
    em.watcher()  # started before anything else, so that seen versions are known
    version, peers = em.current()
    # Nothing here syncs with a joiner after a change (no ElasticState):
    # the workers are plain processes that sync their own state.
    plain = not em.has_apply_listeners()
    if wait is None:
        wait = plain
    with em.resizing(version + 1):
        log.info("kungfu elastic: resize(new_size=%s, workers=%s) at version %d", new_size, workers, version)
        _agree(_request_bytes(new_size, workers, wait), version)
        log.info("kungfu elastic: resize request agreed")
        if new_size is None and workers is None:
            return _adopt_pending(), False
        state = em.job_state()
        if workers is not None:
            unknown = [w for w in workers if w not in peers]
            if unknown:
                raise ValueError(
                    f"resize: workers {unknown} are not members of cluster version {version} "
                    f"({', '.join(peers)}); a resize to a list can only keep or evict members "
                    "(grow with resize(new_size)); nothing changed"
                )
            problem = _range_problem(len(workers), state)
            if problem:
                raise ValueError(problem)
            if workers == peers:
                return False, False
            return _shrink_to(workers, version, peers)
        assert new_size is not None
        problem = _range_problem(new_size, state)
        if problem:
            raise ValueError(problem)
        if new_size < len(peers):
            return _shrink_to(peers[:new_size], version, peers)
        if new_size == len(peers):
            _cancel_growth(new_size, state, version, peers)
            return False, False
        return _grow_to(new_size, state, wait, plain, timeout)


def resize(
    new_size: int | tf.Tensor | None = None,
    *,
    workers: Sequence[str] | None = None,
    wait: bool | None = None,
    timeout: float | None = None,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Resizes the elastic job; returns ``(changed, detached)`` as bool tensors.

    Args:
        new_size: the number of workers wanted (>= 1, within the job's
            ``--min-np``/``--max-np``); a scalar int tensor is read when the
            op runs. None with ``workers`` None: adopt the next committed
            version (joiners admitted, a crash).
        workers: instead of ``new_size``: the exact list of current members
            ("host:port", see ``kungfu_tf.ops.membership.cluster_peers()``)
            to keep, in their new rank order.
        wait: when growing, block until the cluster has ``new_size``
            workers. None (the default): block when the workers are plain
            processes (no ``ElasticState`` or other apply listener in this
            process: KungFu's scripts), else return at once.
        timeout: for ``wait``, in seconds (default: the job's ``--timeout``);
            after it, ResizeError says what the growth found.

    Example:
        >>> changed, detached = resize(2)  # doctest: +SKIP
        >>> bool(changed), bool(detached)  # doctest: +SKIP
        (True, False)
    """
    if new_size is not None and workers is not None:
        raise ValueError(f"resize: pass new_size ({new_size!r}) or workers ({workers!r}), not both")
    checked_workers = _check_workers(workers) if workers is not None else None
    if wait is not None and not isinstance(wait, bool):
        raise TypeError(f"resize: wait must be a bool or None, got {wait!r}")
    wait_seconds = em.timeout_seconds() if timeout is None else float(timeout)
    size_tensor = None
    if new_size is not None:
        if isinstance(new_size, (tf.Tensor, tf.Variable)):
            static = tf.get_static_value(new_size)
            if static is not None:
                _check_size(static.item() if hasattr(static, "item") else static)
            if not new_size.dtype.is_integer:
                raise TypeError(f"resize: new_size must be an integer tensor, got {new_size.dtype.name}")
            size_tensor = tf.cast(new_size, tf.int64)
        else:
            new_size = _check_size(new_size)

    def run(*size: tf.Tensor) -> tuple[bool, bool]:
        n = _check_size(int(size[0].numpy())) if size else new_size
        return _resize_now(n, checked_workers, wait, wait_seconds)

    if tf.executing_eagerly():
        args = (size_tensor,) if size_tensor is not None else ()
        changed, detached = run(*args)
        return tf.constant(changed), tf.constant(detached)
    inputs = [size_tensor] if size_tensor is not None else []
    changed, detached = tf.py_function(run, inputs, [tf.bool, tf.bool], name="kungfu_resize")
    changed.set_shape([])
    detached.set_shape([])
    return changed, detached
