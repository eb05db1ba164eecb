"""``ElasticState``: the training state that survives resizes, joins and crashes.

It holds the model and optimizer variables (and monitor variables), the
step and epoch counters, and any object with ``state_dict()`` /
``load_state_dict()`` (the data sampler, policies) or plain JSON-able values.
Every member keeps identical state: it is synced after each membership
change, and the sync ends with a check that every worker holds the same
bytes.

* ``commit()`` after each successful step (step += 1). A step applies all of
  its update or none of it (the averaged gradients pass one ``identity_n``),
  so a worker whose step raised holds the state of its last commit.
* ``check()`` at step boundaries: the members agree (all_reduce(min) on
  STAR) on the newest committed cluster version all have seen and apply the
  next one: joiners admitted, workers lost. Returns the Change or None.
* ``sync()``: all_gather of every member's (step, holds-state) -> sources =
  members that held state before, at the highest step; everyone else
  (joiners, survivors whose last step failed while it succeeded elsewhere)
  fetches the variables in slices from all sources in parallel, and the
  Python state from the first; then all compare digests (state_transfer.digest). A cluster
  where nobody holds state but a joiner is present (every holder was lost)
  fails with an ElasticError instead of starting over.
* ``join()``: what a joiner does (``kungfu_tf.elastic.run`` calls it): warm
  up, report ready with its model signature, wait to be admitted, apply
  that version and sync.

Example (a custom loop; ``kungfu-run --elastic -np 2 python train.py``)::

    state = kungfu_tf.elastic.ElasticState(model=model, optimizer=opt, sampler=sampler)

    @kungfu_tf.elastic.run
    def train(state):
        while state.step < total_steps:
            state.check()
            x, y = data[sampler.next_indices(kungfu_tf.rank(), kungfu_tf.size())]
            train_step(x, y)
            sampler.commit(kungfu_tf.size())
            state.commit()

    train(state)   # returns on every worker, also on one that was detached
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from kungfu_tf.elastic import progress_report
from kungfu_tf.elastic import session_state_transfer as sst
from kungfu_tf.elastic import state_transfer as st
from kungfu_tf.elastic.errors import (
    ElasticError,
    JoinerRejectedError,
    StateMismatchError,
)
from kungfu_tf.elastic.signature import model_signature
from kungfu_tf.ops import config, state_sync
from kungfu_tf.ops import elastic_membership as em
from kungfu_tf.ops.collective import all_gather
from kungfu_tf.optimizers.gradient_monitor import is_per_worker
from kungfu_tf.optimizers.keras_build import build_as_apply_would

log = logging.getLogger("kungfu_tf.elastic")

STATE_NAME = "kungfu/elastic/state"
_BUILTIN = ("step", "epoch")


class DetachedFromJob(BaseException):
    """Raised by ``check()`` inside ``kungfu_tf.elastic.run`` when this worker left the job; run returns."""


def _signature_hash(signature: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(signature.encode()).digest()[:7], "little")


_reporter: progress_report.ProgressReporter | None = None


def _progress_reporter() -> progress_report.ProgressReporter:
    global _reporter
    if _reporter is None:
        client = em.config_client()
        _reporter = progress_report.ProgressReporter(client.report_progress)
    return _reporter


class ElasticState:
    """The state of one elastic training job on this worker (see the module docstring).

    Args:
        variables: variables to keep identical on every worker: a list, or a
            callable returning it (read at each sync and after the first
            step after it, so a Keras optimizer may build its slots in the
            first step). With ``model``/``optimizer``, extra variables
            besides theirs.
        model: a Keras model (built): its ``variables`` are kept identical.
        optimizer: a Keras optimizer (with ``model``): its ``variables``,
            slots included, are kept identical, and its ``GradientMonitor``'s
            ``synced_variables()`` (the smoothed estimates) if it has one. An optimizer that builds its
            slots lazily (momentum, Adam: in its first ``apply_gradients``)
            is built on ``model.trainable_variables`` before the first sync,
            so the job's model signature has the slots from the start and a
            joiner, whose warm-up built them, matches it.
        check_every: ``check()`` does its agreement round every this many steps.
        verify_all_syncs: also hash and compare the variables after changes
            that transferred none (a shrink, a crash at an agreed step); by
            default only the Python state is compared then.
        **values: Python state, by name: JSON-able values (``step`` and
            ``epoch`` start at 0 unless given) or objects with
            ``state_dict()``/``load_state_dict()``. Read and set them as
            attributes (``state.epoch += 1``).

    Create one per process: each one syncs after every membership change,
    and every member must run the same syncs.

    Example:
        >>> import tensorflow as tf
        >>> state = ElasticState([tf.Variable(1.0)], lr=0.1)
        >>> state.commit(); state.step, state.lr
        (1, 0.1)
        >>> import keras
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> opt = keras.optimizers.Adam(1e-3)                        # no slots yet
        >>> state = ElasticState(model=model, optimizer=opt)
        >>> len(state.variables())   # kernel, bias; iteration, learning rate, 2 + 2 slots
        8
    """

    def __init__(
        self,
        variables: Sequence[object] | Callable[[], Sequence[object]] = (),
        *,
        model: Any = None,
        optimizer: Any = None,
        check_every: int = 1,
        verify_all_syncs: bool = False,
        **values: Any,
    ) -> None:
        if not isinstance(check_every, int) or isinstance(check_every, bool) or check_every < 1:
            raise ValueError(f"ElasticState: check_every must be an int >= 1, got {check_every!r}")
        for name in values:
            if name.startswith("_") or name in ("variables", "check_every", "verify_all_syncs") or hasattr(type(self), name):
                raise ValueError(f"ElasticState: {name!r} cannot be the name of a value (it is reserved)")
        if optimizer is not None and model is None:
            raise ValueError("ElasticState: optimizer= needs model= (its slots are built on model.trainable_variables)")
        if model is not None and not hasattr(model, "variables"):
            raise TypeError(f"ElasticState: model= must be a Keras model, got {type(model).__name__}")
        if optimizer is not None and not (hasattr(optimizer, "variables") and hasattr(optimizer, "build")):
            raise TypeError(f"ElasticState: optimizer= must be a Keras optimizer, got {type(optimizer).__name__}")
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_signed_count", None)  # len(variables()) when the signature was last taken
        object.__setattr__(self, "_recount", False)  # look again at the variables after the next commit
        object.__setattr__(self, "_verify_all_syncs", bool(verify_all_syncs))
        object.__setattr__(self, "_variables", variables)
        object.__setattr__(self, "_values", {"step": 0, "epoch": 0, **values})
        object.__setattr__(self, "check_every", check_every)
        object.__setattr__(self, "_has_state", False)  # synced (or started) with the job's state
        object.__setattr__(self, "_last_checked_step", None)
        object.__setattr__(self, "_in_run", False)
        object.__setattr__(self, "_signature_sent", False)
        object.__setattr__(self, "_reset_callbacks", [])
        object.__setattr__(self, "last_change", None)
        object.__setattr__(self, "_report_at", 0.0)  # time.monotonic() of the next progress report
        remove = em.add_apply_listener(self._on_applied) if em.is_elastic() else None
        object.__setattr__(self, "_remove_listener", remove)

    # ----------------------------------------------------------- values

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"ElasticState has no value {name!r} (values: {', '.join(sorted(values))})")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._values:
            self._values[name] = value
        else:
            object.__setattr__(self, name, value)

    def variables(self) -> list[object]:
        """The variables kept identical (the callable given is called now; an unbuilt ``optimizer`` is built)."""
        # Per-worker values (a monitor's compute time, its previous gradient) differ by design: never synced.
        extra = [v for v in (self._variables() if callable(self._variables) else self._variables) if not is_per_worker(v)]
        if self._model is None:
            return extra
        model_variables = list(self._model.variables)
        if not model_variables:
            raise ElasticError(
                f"ElasticState: the model {getattr(self._model, 'name', '')!r} has no variables yet: build it "
                "(keras.Input, or call it on a batch) before the elastic state syncs"
            )
        out = model_variables
        if self._optimizer is not None:
            if not getattr(self._optimizer, "built", True):
                # Momentum, Adam, ...: slots otherwise appear in the first step,
                # after the job took its signature (joiners, warmed up, have them).
                # Built as that step would: a joiner's warm-up step built its own,
                # and a LossScaleOptimizer's inner slots are named by who built them.
                build_as_apply_would(self._optimizer, self._model.trainable_variables)
            # A strategy with parameter servers keeps slots only on their owners
            # (moved to the new owners by the optimizer at a change): the state
            # every worker holds alike is the rest of the optimizer's variables.
            replicated = getattr(self._optimizer, "_kungfu_replicated_variables", None)
            out = out + (list(replicated()) if replicated is not None else list(self._optimizer.variables))
            monitor = getattr(self._optimizer, "kungfu_monitor", None)
            if monitor is not None:  # its smoothed estimate goes to joiners with the training state
                out = out + monitor.synced_variables()
        seen = {id(v) for v in out}
        return out + [v for v in extra if id(v) not in seen]

    def python_state(self) -> dict[str, Any]:
        """The Python state as JSON-able values (objects give their ``state_dict()``)."""
        return {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in self._values.items()}

    def load_python_state(self, state: dict[str, Any]) -> None:
        """Adopts a :meth:`python_state` from another worker."""
        for k, v in state.items():
            current = self._values.get(k)
            if hasattr(current, "load_state_dict"):
                current.load_state_dict(v)
            else:
                self._values[k] = v

    def register_reset_callbacks(self, callbacks: Sequence[Callable[[em.Change], None]]) -> None:
        """Calls each ``callback(change)`` after every membership change this worker survives (after the sync)."""
        self._reset_callbacks.extend(callbacks)

    def commit(self) -> None:
        """Counts a successful step (step += 1). Call it right after the step returned."""
        self._values["step"] += 1
        if self._recount:
            self._recount = False
            self._update_signature()
        now = time.monotonic()
        if now >= self._report_at:
            self._report_at = now + progress_report.REPORT_EVERY
            self._report_progress()

    def _report_progress(self) -> None:
        """Rank 0 tells the config service its step, for kungfu-run's job status (off this thread)."""
        if not em.is_elastic() or em.detached():
            return
        # Outside any graph: under a v1 MonitoredSession the default graph is
        # finalized, and reading the membership the first time runs ops.
        with tf.init_scope():
            if not tf.executing_eagerly():
                return  # eager execution disabled globally: no step in the job status
            version, peers = em.current()
            if not peers or peers[0] != em.self_peer():
                return
        _progress_reporter().offer(int(self._values["step"]), int(version))

    def _update_signature(self) -> None:
        """After the first step since a sync: variables that step created (lazily built optimizer slots,
        seen through a callable) join the job's signature, so that joiners, whose warm-up created them
        too, are admitted. Every member created the same ones in the same synchronous step."""
        if not callable(self._variables) or self._signed_count is None:
            return
        variables = self.variables()
        if len(variables) == self._signed_count:
            return
        signature = model_signature(variables)
        log.info("kungfu elastic: %d variables now (%d at the sync): the job's model signature grows",
                 len(variables), self._signed_count)  # fmt: skip
        self._signed_count = len(variables)
        if em.is_elastic() and int(config.rank()) == 0:
            em.config_client().set_signature(signature, grow=True)

    # ----------------------------------------------------------- membership

    def check(self) -> em.Change | None:
        """Step-boundary membership check: applies the next committed version every member has seen.

        Every member calls it at the same steps (every ``check_every``); at
        most once per step (after a sync the step it synced at counts as
        checked, so a joiner that was admitted at step s does not check s
        again). Inside ``elastic.run`` a worker that was detached does not
        return from it: run returns.
        """
        if not em.is_elastic():
            return None
        step = self._values["step"]
        if step == self._last_checked_step or step % self.check_every:
            return None
        self._last_checked_step = step
        change = em.adopt_next()
        if change is not None:
            self.last_change = change
            if change.detached and self._in_run:
                raise DetachedFromJob()
        return change

    def _on_applied(self, change: em.Change) -> None:
        self.last_change = change
        self.sync()
        for callback in self._reset_callbacks:
            callback(change)

    def join(self, warm_up: Callable[[ElasticState], None] | None = None, timeout: float | None = None) -> em.Change | None:
        """A joiner's path into the job; None (nothing to do) on a worker that is not a joiner.

        ``warm_up(state)`` runs first, alone (a one-worker cluster): build the
        model, trace the step and run it on a batch, create the optimizer's
        slots. Then the joiner reports ready with :func:`model_signature`,
        waits until a committed cluster contains it (raising
        :class:`JoinerRejectedError` if the service refused it), applies
        the first such version and syncs the state from the members.
        ``timeout``: seconds to wait for the admission (None: as long as it
        takes; a pre-warmed joiner may wait until the job asks to grow, and
        its launcher stops it when the job ends).
        """
        if not em.is_joiner():
            return None
        if warm_up is not None:
            warm_up(self)
        me = em.self_peer()
        signature = model_signature(self.variables())
        started = time.monotonic()
        em.watcher()
        reply = em.config_client().joiner_ready(me, signature)
        log.info("kungfu elastic: joiner %s ready (job state %d)", me, reply.state_version)

        def decided(state) -> bool:
            return me in em.peers_of(state.cluster) or em.rejection_reason(state, me) is not None

        state = em.watcher().wait_for(decided, timeout)
        if state is None:
            raise ElasticError(f"joiner {me} was not admitted within {timeout:g} s (the job may already have its target size)")
        reason = em.rejection_reason(state, me)
        if reason is not None:
            raise JoinerRejectedError(reason)
        version = int(state.cluster.version)
        while version > 1 and me in em.cluster_at(version - 1):
            version -= 1  # the first version that admitted us: the members apply versions in order
        change = em.apply_version(version, em.cluster_at(version))
        log.info("kungfu elastic: joined at cluster version %d after %.2f s", version, time.monotonic() - started)
        target = em.pending_wait()
        if target:
            # The members are inside resize(target, wait=True): wait with them
            # (the same collectives), then all start the next step together.
            log.info("kungfu elastic: the members wait for %d workers; waiting with them", target)
            em.wait_for_size(target, em.timeout_seconds())
        return change

    # ----------------------------------------------------------- sync

    def sync(self) -> None:
        """Makes every member's state identical (see the module docstring); all members call it together."""
        started = time.monotonic()
        variables = self.variables()
        signature = model_signature(variables)
        python_json = st.canonical_json(self.python_state())
        version = int(config.cluster_version())
        rank, size = int(config.rank()), int(config.cluster_size())
        prefix = f"kungfu/elastic/sync/{version}"
        started_as_joiner = os.environ.get(em.JOINER_ENV, "") == "1"
        info = np.array(
            [self._values["step"], int(self._has_state), len(python_json), _signature_hash(signature),
             int(started_as_joiner)],
            np.int64,
        )
        rows = all_gather(tf.constant(info), name=f"{prefix}/info").numpy()
        differ = [r for r in range(size) if rows[r, 3] != rows[0, 3]]
        if differ:
            raise StateMismatchError(
                f"elastic sync at cluster version {version}: the model of rank(s) {differ} differs from "
                f"rank 0's (variables with other names, shapes or dtypes); this worker's signature:\n{signature}"
            )
        holders = [r for r in range(size) if rows[r, 1]]
        if holders:
            top = max(int(rows[r, 0]) for r in holders)
            sources = [r for r in holders if int(rows[r, 0]) == top]
        elif any(rows[r, 4] for r in range(size)):
            # Joiners are admitted only after the job's first sync (they need
            # its signature): the job had state, and every worker holding it
            # was lost. Starting over from a joiner's warm-up weights would
            # silently throw the training away.
            peers = em.current()[1] if em.is_elastic() else tuple(f"rank {r}" for r in range(size))
            joiners = [peers[r] for r in range(size) if rows[r, 4]]
            raise ElasticError(
                f"no member of cluster v{version} holds the training state: its members "
                f"({', '.join(peers)}) are joiners that were never synced ({', '.join(joiners)}) or workers "
                "that never held it, and every worker that held it was lost; the job cannot go on "
                "(restart it, from a checkpoint if you saved one)"
            )
        else:
            top, sources = int(rows[0, 0]), [0]  # the job's start: rank 0's state for everyone
        receivers = [r for r in range(size) if r not in sources]
        # Variables are hashed only when some are transferred (or
        # verify_all_syncs): members that keep theirs held the same bytes at
        # their last sync and synchronous updates keep them so, while hashing
        # a large model on every shrink or crash costs more than the change
        # itself (68 MB for the 8.5 M-parameter benchmark model with
        # momentum). The Python state (step, epoch, data position) is always
        # compared. The variables never pass through Python: state_sync moves
        # and hashes them in C++.
        variables_digest = b""
        # tf.compat.v1 graph variables (SessionVariable) are out of the eager
        # ops' reach: they travel as bytes through their session.
        in_cpp = state_sync.movable(variables)
        if receivers:
            p2p_version = (version << 32) | (top & 0xFFFFFFFF)
            if rank in sources:
                j = sources.index(rank)
                if j == 0:
                    st.save_blob(f"{STATE_NAME}/python", python_json, p2p_version)
                if in_cpp:
                    variables_digest = state_sync.save_state(variables, STATE_NAME, p2p_version, j, len(sources)).numpy()
                else:
                    data = sst.variable_bytes(variables)
                    start, end = sst.slice_bounds(len(data), len(sources))[j]
                    if end > start:
                        st.save_blob(f"{STATE_NAME}/{j}", data[start:end], p2p_version)
                    variables_digest = sst.bytes_digest(data)
            else:
                if in_cpp:
                    variables_digest = state_sync.fetch_state(variables, sources, STATE_NAME, p2p_version).numpy()
                else:
                    bounds = sst.slice_bounds(sst.byte_count(variables), len(sources))
                    requests = [
                        (src, f"{STATE_NAME}/{j}", end - start)
                        for j, (src, (start, end)) in enumerate(zip(sources, bounds))
                        if end > start
                    ]
                    data = b"".join(sst.fetch_blobs(requests, p2p_version))
                    sst.assign_from_bytes(variables, data)
                    variables_digest = sst.bytes_digest(data)
                python_json = st.fetch_blob(sources[0], f"{STATE_NAME}/python", int(rows[sources[0], 2]), p2p_version)
                self.load_python_state(json.loads(python_json))
                python_json = st.canonical_json(self.python_state())
        elif self._verify_all_syncs:
            variables_digest = (
                state_sync.state_digest(variables).numpy() if in_cpp else sst.bytes_digest(sst.variable_bytes(variables))
            )
        mine = np.frombuffer(st.digest(bytes(variables_digest), python_json), np.uint8)
        digests = all_gather(tf.constant(mine), name=f"{prefix}/digest").numpy()
        if receivers and rank in sources and in_cpp:
            state_sync.forget_state(STATE_NAME)  # every receiver has its pieces (it sent its digest)
        differ = [r for r in range(size) if not np.array_equal(digests[r], digests[sources[0]])]
        if differ:
            raise StateMismatchError(
                f"elastic sync at cluster version {version}: the state digest of rank(s) {differ} differs "
                f"from rank {sources[0]}'s after the transfer (sources {sources}, step {top})"
            )
        self._has_state = True
        self._last_checked_step = self._values["step"]
        self._signed_count = len(variables)
        self._recount = True
        if em.is_elastic() and not self._signature_sent and rank == 0:
            em.config_client().set_signature(signature)
            self._signature_sent = True
        log.info(
            "kungfu elastic: state synced at cluster version %d, step %d (sources %s, receivers %s) in %.3f s",
            version, top, sources, receivers, time.monotonic() - started,
        )
