"""Keras ``model.fit`` in an elastic job: ``ElasticCallback`` and the ``elastic_fit`` loop.

Example:
    >>> import kungfu_tf
    >>> from kungfu_tf.data import ElasticSampler
    >>> from kungfu_tf.keras import elastic_fit
    >>> sampler = ElasticSampler(len(x), batch_size=32, seed=1)                    # doctest: +SKIP
    >>> state = kungfu_tf.elastic.ElasticState(model=model, optimizer=model.optimizer,
    ...                                        sampler=sampler)                    # doctest: +SKIP
    >>> @kungfu_tf.elastic.run
    ... def train(state):
    ...     elastic_fit(model, state, sampler, (x, y), epochs=5)                    # doctest: +SKIP
    >>> train(state)                                                                # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from kungfu_tf.ops import config
from kungfu_tf.strategy import plan_generation


class ElasticCallback(keras.callbacks.Callback):
    """Commits each step of ``fit`` to the elastic state, checks membership, and stops ``fit`` on a change.

    After each batch: ``sampler.commit(size)`` (the data position, if a
    sampler is given), ``state.commit()`` (step + 1), and every
    ``check_every`` steps ``state.check()`` (the step-boundary membership
    check; it applies a committed resize, grow or crash and syncs the state).
    A change applied otherwise between steps (``kungfu_tf.ops.resize`` called
    by a policy or another callback) counts too; it is seen through
    ``state.last_change``. Place the callback *first* (its commit comes
    before callbacks that may resize, so the resize syncs the committed
    state) and :attr:`watcher` *last* (it stops ``fit`` when a callback in
    between resized). When the cluster changed, the data of the rest of the
    epoch must be split again among the new workers, so the callback sets
    ``model.stop_training`` and :attr:`interrupted`: ``fit`` returns after
    this batch, and the caller calls ``fit`` again with a dataset rebuilt for
    the new rank and size and ``initial_epoch=state.epoch`` (which
    :func:`elastic_fit` does). Keras keeps ``model.train_function`` across
    ``fit`` calls: nothing is traced again.

    Epochs: ``state.epoch`` advances only when the epoch's data is finished
    (the sampler moved to the next epoch; without a sampler, when Keras
    ended the epoch without an interruption), never because ``fit`` stopped
    for a resize. Keras still calls ``on_epoch_end`` of the stopped, partial
    epoch on every callback; the resumed ``fit`` then begins that epoch again
    (same epoch number, the rest of its data).

    Keras counts the steps of the first epoch of a ``fit`` whose dataset has
    no known length and runs every later epoch for that many steps. A ``fit``
    that resumes in the middle of an epoch would thus cut the next epochs
    short; the callback therefore also stops ``fit`` after the first epoch
    of a ``fit`` that began mid-epoch (and, as a guard, after any epoch that
    Keras ended before its data was finished), so that the next ``fit``
    starts at an epoch's beginning. With a sampler the data position is part
    of the elastic state: a crashed step's samples are trained later.

    A crash (a peer lost) fails the running step: the error leaves ``fit``
    and ``kungfu_tf.elastic.run`` recovers and calls the training function
    again. A worker that a resize detached stops ``fit``; :attr:`detached`
    is True and :func:`elastic_fit` returns.

    Args:
        state: the ``kungfu_tf.elastic.ElasticState`` (holding the model's and
            the optimizer's variables, and the sampler).
        sampler: the ``kungfu_tf.data.ElasticSampler`` whose dataset feeds
            ``fit``, built for the rank and size current when ``fit`` began
            by :func:`epoch_rest_dataset` (``sampler.dataset`` with its
            length known; see there why).
        check_every: run the membership check every this many steps.

    Raises:
        ValueError: ``check_every`` is not a positive int; at ``fit``: the
            model was compiled with ``steps_per_execution`` > 1 (each step
            must be committed), or ``fit``'s epoch is not ``state.epoch``
            (pass ``initial_epoch=state.epoch``).

    Example:
        >>> from kungfu_tf.keras import ElasticCallback, epoch_rest_dataset
        >>> cb = ElasticCallback(state, sampler)                                   # doctest: +SKIP
        >>> while True:                                                            # doctest: +SKIP
        ...     ds = epoch_rest_dataset(sampler, (x, y), kungfu_tf.rank(), kungfu_tf.size())
        ...     model.fit(ds, epochs=5, initial_epoch=state.epoch, callbacks=[cb, *others, cb.watcher])
        ...     if not cb.interrupted or cb.detached:
        ...         break
    """

    def __init__(self, state: Any, sampler: Any = None, check_every: int = 1):
        super().__init__()
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every <= 0:
            raise ValueError(f"ElasticCallback: check_every must be a positive int, got {check_every!r}")
        self.state = state
        self.sampler = sampler
        self.check_every = check_every
        self.interrupted = ""  # why the last fit stopped early ("" if it did not)
        self.detached = False
        self.changes: list[Any] = []  # every change state.check() applied, in order
        self._size = 1
        self._batch_size = 0
        self._first_epoch = True
        self._started_mid_epoch = False
        self._seen_change: Any = None
        self.watcher = _ChangeWatcher(self)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        steps = getattr(self.model, "steps_per_execution", 1)
        steps = int(steps.numpy()) if hasattr(steps, "numpy") else int(steps or 1)
        if steps != 1:
            raise ValueError(
                f"ElasticCallback: the model was compiled with steps_per_execution={steps}; elastic training "
                "commits every step, compile with steps_per_execution=1"
            )
        self.interrupted = ""
        self._seen_change = getattr(self.state, "last_change", None)
        self._size = config.current_int(config.cluster_size)  # the size the dataset was built for
        self._first_epoch = True
        self._started_mid_epoch = self.sampler is not None and self.sampler.offset > 0
        self._batch_size = 0 if self.sampler is None else self.sampler.batch_size

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if epoch != self.state.epoch:
            raise ValueError(
                f"ElasticCallback: fit is at epoch {epoch} but state.epoch is {self.state.epoch}; "
                "pass initial_epoch=state.epoch to fit"
            )

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.sampler is not None:
            self.sampler.commit(self._size)
            self.state.epoch = self.sampler.epoch
        self.state.commit()
        change = self._applied_elsewhere()
        if change is None and not self.state.step % self.check_every:
            change = self.state.check()
            self._seen_change = getattr(self.state, "last_change", None)
        if change is not None:
            self._changed(change)
        elif self.sampler is not None and self.sampler.batch_size != self._batch_size:
            self._stop(f"the batch size changed to {self.sampler.batch_size}: the next fit counts its steps again")

    def _applied_elsewhere(self) -> Any:
        """A change applied since this callback last looked, by a ``resize()`` outside it (or None)."""
        change = getattr(self.state, "last_change", None)
        if change is self._seen_change:
            return None
        self._seen_change = change
        return change

    def _changed(self, change: Any) -> None:
        self.changes.append(change)
        self.detached = bool(getattr(change, "detached", False) or getattr(self.state, "detached", False))
        self._stop(f"the cluster changed ({change})")

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        first, self._first_epoch = self._first_epoch, False
        if self.interrupted:
            return  # a partial epoch: the resumed fit runs the rest of it
        if self.sampler is None:
            self.state.epoch = epoch + 1
            return
        if self.sampler.epoch == epoch:
            self._stop(f"Keras ended epoch {epoch} before its data was finished (its cached step count)")
        elif first and self._started_mid_epoch:
            self._stop("the fit began mid-epoch: the next fit counts a whole epoch's steps")

    def _stop(self, reason: str) -> None:
        self.interrupted = reason
        self.model.stop_training = True


class _ChangeWatcher(keras.callbacks.Callback):
    """The last callback of a batch: stops ``fit`` when a callback after the ElasticCallback resized."""

    def __init__(self, elastic: ElasticCallback):
        super().__init__()
        self.elastic = elastic

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        change = self.elastic._applied_elsewhere()
        if change is not None:
            self.elastic._changed(change)


def epoch_rest_dataset(sampler: Any, arrays: Any, rank: int, size: int) -> tf.data.Dataset:
    """``sampler.dataset(arrays, rank, size)`` with its length known: the steps left in the current epoch.

    Keras runs a dataset of unknown length until it fails to produce a
    batch, and that last, failed call of the train function still advances
    the optimizer's ``iterations`` (which Adam's bias correction reads): an
    epoch would count one step more than it trained, and a ``fit`` stopped
    for a resize one less than one that ran to the end. With the length
    known Keras never asks past it.

    Example:
        >>> import numpy as np
        >>> from kungfu_tf.data import ElasticSampler
        >>> s = ElasticSampler(10, batch_size=2, shuffle=False)
        >>> int(epoch_rest_dataset(s, np.zeros([10, 3]), rank=0, size=2).cardinality())   # ceil(10 / 4)
        3
    """
    steps = -(-(sampler.num_samples - sampler.offset) // (size * sampler.batch_size))
    return sampler.dataset(arrays, rank, size).apply(tf.data.experimental.assert_cardinality(steps))


def _left_the_job() -> bool:
    """True if this worker applied a cluster version that does not contain it (the listeners of a change never
    hear of one that detaches: a ``PolicyCallback`` whose policy resized stops ``fit`` by itself)."""
    from kungfu_tf.ops import elastic_membership as em

    return em.is_elastic() and em.self_peer() not in em.current()[1]


def forget_stale_train_function(model: keras.Model) -> None:
    """Makes ``fit`` trace its step again if a strategy was re-built since it was traced (a membership change).

    A strategy's owners and slots are the shape of the traced step
    (kungfu_tf/strategy/plan_generation.py); Keras keeps ``model.train_function``
    from one ``fit`` (or ``train_on_batch``: a joiner's warm-up) to the next.
    """
    generation = plan_generation.current()
    if getattr(model, "_kungfu_plan_generation", generation) != generation or (
        generation and not hasattr(model, "_kungfu_plan_generation")
    ):
        model.train_function = None
    object.__setattr__(model, "_kungfu_plan_generation", generation)


def retrace_if_replanned(model: keras.Model) -> bool:
    """Inside ``fit``: makes ``model.train_function`` anew if a strategy plan was replaced since (a switch).

    ``fit`` reads ``model.train_function`` at every batch, so the next batch
    traces the step for the new plan; the step traced for the old one would
    refuse to run (kungfu_tf/strategy/plan_generation.py). Returns whether it did.
    """
    generation = plan_generation.current()
    if getattr(model, "_kungfu_plan_generation", 0) == generation:
        return False
    object.__setattr__(model, "_kungfu_plan_generation", generation)
    model.make_train_function(force=True)
    return True


def elastic_fit(
    model: keras.Model,
    state: Any,
    sampler: Any,
    arrays: Any,
    epochs: int,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    check_every: int = 1,
    **fit_args: Any,
) -> keras.callbacks.History | None:
    """``model.fit`` over ``sampler.dataset(arrays, rank, size)`` until ``epochs`` epochs are trained, re-entered
    after every membership change; call it inside ``kungfu_tf.elastic.run`` (which recovers from crashes).

    Each ``fit`` gets a dataset built for the current rank and size and
    ``initial_epoch=state.epoch``; an :class:`ElasticCallback` placed before
    ``callbacks`` commits each step before they see it (a callback that
    resizes, a ``PolicyCallback`` say, resizes after the commit) and its
    ``watcher`` after them stops ``fit`` when one of them changed the cluster. Returns the last
    ``fit``'s History, or None when this worker was detached (or had
    nothing left to train).

    Example:
        >>> @kungfu_tf.elastic.run                                                     # doctest: +SKIP
        ... def train(state):
        ...     return elastic_fit(model, state, sampler, (x, y), epochs=5, verbose=0)
    """
    elastic = ElasticCallback(state, sampler, check_every=check_every)
    # The sampler orders the data (the same order on every worker, re-split on
    # a change); Keras would warn that it ignores its own shuffle on a dataset.
    fit_args.setdefault("shuffle", False)
    history = None
    while state.epoch < epochs:
        dataset = epoch_rest_dataset(sampler, arrays, config.current_int(config.rank), config.current_int(config.cluster_size))
        forget_stale_train_function(model)
        history = model.fit(dataset, epochs=epochs, initial_epoch=state.epoch,
                            callbacks=[elastic, *callbacks, elastic.watcher], **fit_args)  # fmt: skip
        if elastic.detached or _left_the_job():
            return None  # a resize (this callback's check, or another callback's, a policy's) took it out
        if not elastic.interrupted:
            break
    return history
