"""Horovod's elastic states: ``ObjectState``, ``TensorFlowState``, ``TensorFlowKerasState`` (= ``KerasState``).

The state of the *re-run* mode (:mod:`kungfu_tf.elastic.rerun`): the training
function is entered again from the last commit after every membership
change. Values are plain attributes (``state.batch = 3``) that the function
changes freely; the state keeps a copy of them as of the last commit:

* ``commit()``: ``save()`` (copy the values and variables) and
  ``check_host_updates()``;
* ``check_host_updates()``: every member agrees on the next committed
  cluster version (the step-boundary check of
  :class:`~kungfu_tf.elastic.ElasticState`); when one was applied (joiners
  admitted, a peer lost, a ``resize``) it raises :class:`HostsUpdatedInterrupt`
  and the re-run starts from the last commit;
* ``restore()``: every value and variable back to the last commit (after a
  lost peer, before any change is applied);
* ``sync()``: every member holds the same committed state (the members with
  the most commits are its sources; joiners fetch it in slices, as
  ``ElasticState.sync`` does); ``kungfu_tf.elastic.run`` calls it;
* ``register_reset_callbacks([fn])`` / ``on_reset()``: each ``fn()`` runs
  after every change this worker goes through (joiners too, once admitted),
  after the sync and before the function is entered again: rescale the
  learning rate to ``kungfu_tf.size()`` there.

Values must be JSON-able (they travel to joiners) or objects with
``state_dict()`` / ``load_state_dict()`` (an ``ElasticSampler``: its position
is committed and rolled back with the rest). The variables of the model and
the optimizer (slots included) are copied on the device at each commit, as
Horovod does: commit every few batches if that copy costs.

Example (``kungfu-run --elastic -np 2 --max-np 3 python train.py``)::

    import kungfu_tf as hvd

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, batch=0)
    state.register_reset_callbacks([lambda: optimizer.learning_rate.assign(0.01 * hvd.size())])

    @hvd.elastic.run
    def train(state):
        for state.batch in range(state.batch, 100):
            train_step(next_batch())
            state.commit()

    train(state)
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from kungfu_tf.elastic.rerun import HostsUpdatedInterrupt
from kungfu_tf.elastic.state import DetachedFromJob, ElasticState
from kungfu_tf.ops import elastic_membership as em

log = logging.getLogger("kungfu_tf.elastic")

# What the inner ElasticState calls the committed values (one of its Python values).
_COMMITTED = "committed"


class _CommittedValues:
    """The committed values as one Python value of the inner ElasticState: synced to joiners and compared."""

    def __init__(self, owner: ObjectState) -> None:
        self.owner = owner

    def state_dict(self) -> dict[str, Any]:
        return {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in self.owner._committed_items()}

    def load_state_dict(self, values: dict[str, Any]) -> None:
        self.owner._adopt_committed(values)


class ObjectState:
    """Python values that every worker holds alike, committed and rolled back as in Horovod (module docstring).

    Args:
        bcast_object, get_rank: accepted for Horovod's signature and ignored
            (the sync moves the state itself).
        **values: the values, by name; read and set them as attributes.

    Example:
        >>> state = ObjectState(batch=0, seen=[])
        >>> state.batch = 5; state.seen.append(1); state.save()
        >>> state.batch = 9; state.seen.append(2); state.restore()
        >>> state.batch, state.seen
        (5, [1])
    """

    _RESERVED = ("model", "optimizer", "variables", "session", "backend")

    def __init__(self, bcast_object: Any = None, get_rank: Any = None, **values: Any) -> None:
        self._init_state(variables=(), model=None, optimizer=None, values=values)

    def _init_state(self, *, variables: Any, model: Any, optimizer: Any, values: dict[str, Any]) -> None:
        for name in values:
            if name.startswith("_") or name in self._RESERVED or hasattr(type(self), name):
                raise ValueError(f"{type(self).__name__}: {name!r} cannot be the name of a value (it is reserved)")
        self._names = tuple(values)
        for name, value in values.items():
            setattr(self, name, value)
        self._saved: dict[str, Any] = {}
        self._saved_variables: list[tf.Tensor] = []
        self._reset_callbacks: list[Callable[[], None]] = []
        self._rerun_requested = False
        self._pending_change: em.Change | None = None
        self._in_run = False
        self.elastic_state = ElasticState(variables, model=model, optimizer=optimizer, **{_COMMITTED: _CommittedValues(self)})
        # Roll back to the last commit before any change syncs (first), and
        # take the synced state as the new commit after it.
        if em.is_elastic():
            em.add_apply_listener(self._before_sync, first=True)
        self.elastic_state.register_reset_callbacks([self._after_sync])
        self._save_values()
        self._save_variables()

    # ------------------------------------------------------------ Horovod's API

    def save(self) -> None:
        """Copies the values (and variables) as the last commit; counts a commit."""
        self._save_values()
        self._save_variables()
        self.elastic_state.commit()

    def restore(self) -> None:
        """Every value (and variable) back to the last commit."""
        for var, saved in zip(self._variables(), self._saved_variables):
            var.assign(saved)
        self._restore_values()

    def sync(self) -> None:
        """Makes the state identical on every member (a collective: all members call it together).

        As Horovod's: the variables as they are and the committed values of
        the source; both become the commit.
        """
        self.elastic_state.sync()
        self._restore_values()
        self._save_variables()

    def commit(self) -> None:
        """``save()``, then ``check_host_updates()`` (which raises :class:`HostsUpdatedInterrupt` after a change)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Applies the next committed cluster version if every member has seen one; raises after a change.

        Every member calls it at the same points (a collective). A change
        restores the last commit before it syncs, so the function re-runs
        from there. Inside ``kungfu_tf.elastic.run`` a worker that the change
        detached leaves the function and run returns None.

        After a ``kungfu_tf.ops.resize`` that changed the cluster it raises at
        once, without a collective: call it right after the resize, so the
        members enter the function again together with the joiners, which
        enter it from the top once admitted.

        Raises:
            HostsUpdatedInterrupt: a change was applied (here, or before by a
                ``kungfu_tf.ops.resize`` call).
        """
        # The listeners saw every applied change that keeps this worker.
        change, self._pending_change = self._pending_change, None
        if change is None and em.is_elastic():
            change = em.adopt_next()
            self._pending_change = None
        if change is None:
            return
        self.elastic_state.last_change = change
        if change.detached and self._in_run:
            raise DetachedFromJob()
        raise HostsUpdatedInterrupt(change)

    def register_reset_callbacks(self, callbacks: Sequence[Callable[[], None]]) -> None:
        """Calls each ``callback()`` after every membership change (see :meth:`on_reset`)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Runs the reset callbacks (``kungfu_tf.elastic.run`` calls it after each change, before re-entering)."""
        for callback in self._reset_callbacks:
            callback()

    # ------------------------------------------------------------ internals

    def _variables(self) -> list[Any]:
        return self.elastic_state.variables()

    def _committed_items(self) -> list[tuple[str, Any]]:
        return [(name, self._saved[name]) for name in self._names]

    def _save_values(self) -> None:
        for name in self._names:
            value = getattr(self, name)
            self._saved[name] = value.state_dict() if hasattr(value, "state_dict") else copy.deepcopy(value)

    def _save_variables(self) -> None:
        # A copy on the device; a later in-place update of the variable never reaches it.
        self._saved_variables = [tf.identity(tf.convert_to_tensor(v)) for v in self._variables()]

    def _adopt_committed(self, values: dict[str, Any]) -> None:
        """A sync brought another member's committed values: they become this worker's commit and values."""
        for name in self._names:
            self._saved[name] = copy.deepcopy(values[name])
        self._restore_values()

    def _restore_values(self) -> None:
        for name in self._names:
            current = getattr(self, name)
            if hasattr(current, "load_state_dict"):
                current.load_state_dict(self._saved[name])
            else:
                setattr(self, name, copy.deepcopy(self._saved[name]))

    def _before_sync(self, change: em.Change) -> None:
        self.restore()

    def _after_sync(self, change: em.Change | None) -> None:
        # The variables a sync brought are the new commit (the values came through _adopt_committed).
        self._save_variables()
        if change is not None:  # applied here or by a resize: the next check raises the interrupt
            self._pending_change = change

    def _request_rerun(self) -> None:
        """Asks ``kungfu_tf.elastic.run`` to enter the function once more when it returns (a Keras callback that
        ended a resumed, partial epoch)."""
        self._rerun_requested = True

    def __repr__(self) -> str:
        values = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._names)
        return f"{type(self).__name__}({values})"


class TensorFlowState(ObjectState):
    """An :class:`ObjectState` with a list of ``tf.Variable`` committed, rolled back and synced with its values.

    Args:
        variables: the variables (a list, or a callable returning it).
        session: accepted for Horovod's signature (TF1 graphs) and ignored.
        **values: Python values, as in :class:`ObjectState`.

    Example:
        >>> v = tf.Variable(1.0)
        >>> state = TensorFlowState([v], step=0)
        >>> _ = v.assign(5.0); state.restore(); float(v.numpy())
        1.0
    """

    def __init__(self, variables: Sequence[Any] | Callable[[], Sequence[Any]] = (), session: Any = None, **values: Any) -> None:
        self.variables = variables
        self._init_state(variables=variables, model=None, optimizer=None, values=values)


class TensorFlowKerasState(ObjectState):
    """An :class:`ObjectState` with a Keras model and its optimizer (every slot) committed, rolled back and synced.

    Args:
        model: a built Keras model.
        optimizer: its optimizer (default: ``model.optimizer``, as after ``compile``).
        backend: accepted for Horovod's signature and ignored.
        **values: Python values, as in :class:`ObjectState` (``batch=0, epoch=0``).

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> state = TensorFlowKerasState(model, keras.optimizers.SGD(0.1), batch=0, epoch=0)
        >>> state.batch, state.epoch
        (0, 0)
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **values: Any) -> None:
        if not getattr(model, "built", True) or not model.variables:
            raise ValueError("TensorFlowKerasState: the model must be built first (keras.Input, model.build(shape), or a call)")
        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError("TensorFlowKerasState: pass optimizer= or compile the model first (model.optimizer is None)")
        self.model = model
        self.optimizer = optimizer
        self._init_state(variables=(), model=model, optimizer=optimizer, values=values)


KerasState = TensorFlowKerasState
