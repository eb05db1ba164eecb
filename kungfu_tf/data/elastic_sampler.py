"""Dynamic data partitioning for elastic jobs: ``ElasticSampler``.

KungFu's dynamic partitioning operator (Mai et al., "Managing data under
adaptation"): every worker holds the same seeded order of the whole data set
for an epoch, and the position reached in it, (epoch, offset). Each step takes
the next ``size * batch_size`` ids of the order and splits them among the
workers of the cluster as it is at that step, so after a resize or a crash the
rest of the epoch is simply re-split among the current workers. The position
advances only when a step succeeded (:meth:`ElasticSampler.commit`), so the
samples of a step discarded after a crash are trained by a later step, and
each sample of an epoch is trained exactly once.

Example:
    >>> from kungfu_tf.data import ElasticSampler
    >>> sampler = ElasticSampler(num_samples=10, batch_size=2, shuffle=False)
    >>> [sampler.next_indices(rank, 2).tolist() for rank in range(2)]
    [[0, 1], [2, 3]]
    >>> sampler.commit(2)
    >>> [sampler.next_indices(rank, 3).tolist() for rank in range(3)]   # resized to 3 workers
    [[4, 5], [6, 7], [8, 9]]
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

# Every key of state_dict(); load_state_dict() accepts exactly these.
_STATE_TYPES: dict[str, type] = {
    "num_samples": int,
    "seed": int,
    "shuffle": bool,
    "batch_size": int,
    "epoch": int,
    "offset": int,
}
# Keys that describe the data set and its order rather than a position: a state
# from a sampler that differs in them would give other ids for the same position.
_IDENTITY_KEYS = ("num_samples", "seed", "shuffle")


class ElasticSampler:
    """The ids each worker trains at each step of each epoch, for any cluster size.

    The order of epoch ``e`` is a permutation of ``range(num_samples)``, the
    same on every worker: ``numpy.random.default_rng([seed, e]).permutation(num_samples)``
    (``numpy.arange(num_samples)`` with ``shuffle=False``). The state is the
    position in it: ``epoch`` and ``offset`` (ids of the epoch already trained),
    plus the per-worker ``batch_size``, which a policy may change between steps.

    A step with ``size`` workers trains the *global batch*: the next
    ``min(size * batch_size, num_samples - offset)`` ids of the order (the
    epoch's last step may be short). Worker ``rank`` takes its contiguous share
    of it; shares are as even as possible and the lower ranks get one id more
    when the global batch does not split evenly (``numpy.array_split``). In a
    very short last step some workers may get no ids at all: their step must
    still take part in the collectives (with a zero gradient, say). Unequal
    shares make the plain average of the workers' gradients weight samples
    unequally in that step; weight by the share if that matters.

    Every worker keeps its own sampler and calls the same methods at the same
    steps, so all of them hold the same state. A worker that joins (or a
    survivor that missed the last step) gets the state of the others through
    :meth:`state_dict` / :meth:`load_state_dict` (JSON-able; elastic state sync
    carries it).

    Thread-safe: :meth:`dataset` produces batches on a ``tf.data`` thread while
    the training loop commits.

    Args:
        num_samples: ids are ``0 .. num_samples - 1`` (rows of the data set).
        batch_size: the per-worker batch size (a policy may change it later).
        seed: seeds the order of every epoch (a non-negative int).
        shuffle: False keeps the ids in order in every epoch.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``num_samples`` or ``batch_size`` is below 1, or ``seed`` below 0.

    Example (a custom loop; re-read rank and size at every step, since a
    resize may change them between steps)::

        sampler = ElasticSampler(len(x_train), batch_size=32, seed=42)
        while sampler.epoch < epochs:
            size, rank = kungfu_tf.size(), kungfu_tf.rank()
            ids = sampler.next_indices(rank, size)
            train_step(x_train[ids], y_train[ids])   # may fail if a peer crashes
            sampler.commit(size)                     # only after the step succeeded
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int = 0, shuffle: bool = True) -> None:
        self._num_samples = _int_at_least("ElasticSampler: num_samples", num_samples, 1)
        self._batch_size = _int_at_least("ElasticSampler: batch_size", batch_size, 1)
        self._seed = _int_at_least("ElasticSampler: seed", seed, 0)
        if not isinstance(shuffle, bool):
            raise TypeError(f"ElasticSampler: shuffle must be a bool, got {shuffle!r}")
        self._shuffle = shuffle
        self._epoch = 0
        self._offset = 0
        # Steps handed out but not committed yet: (epoch, offset) -> (size, global
        # batch). commit() advances by what was planned at the current position,
        # so a batch size changed after the step's ids were taken does not skew it.
        self._planned: dict[tuple[int, int], tuple[int, int]] = {}
        self._order_cache: tuple[int, np.ndarray] | None = None
        self._lock = threading.RLock()

    @property
    def num_samples(self) -> int:
        """Number of ids per epoch."""
        return self._num_samples

    @property
    def seed(self) -> int:
        """Seed of every epoch's order."""
        return self._seed

    @property
    def shuffle(self) -> bool:
        """Whether the order is shuffled (else ids in order)."""
        return self._shuffle

    @property
    def epoch(self) -> int:
        """The epoch the next step trains (starts at 0)."""
        return self._epoch

    @property
    def offset(self) -> int:
        """How many ids of the current epoch's order committed steps have trained."""
        return self._offset

    @property
    def batch_size(self) -> int:
        """Per-worker batch size of the next step (settable between steps)."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        value = _int_at_least("ElasticSampler: batch_size", value, 1)
        with self._lock:
            self._batch_size = value

    def order(self, epoch: int | None = None) -> np.ndarray:
        """The global order of ``epoch`` (default: the current one), as a read-only int64 array.

        Example:
            >>> ElasticSampler(5, 1, shuffle=False).order().tolist()
            [0, 1, 2, 3, 4]
        """
        with self._lock:
            epoch = self._epoch if epoch is None else _int_at_least("ElasticSampler.order: epoch", epoch, 0)
            if self._order_cache is not None and self._order_cache[0] == epoch:
                return self._order_cache[1]
            if self._shuffle:
                order = np.random.default_rng([self._seed, epoch]).permutation(self._num_samples).astype(np.int64)
            else:
                order = np.arange(self._num_samples, dtype=np.int64)
            order.flags.writeable = False
            if epoch == self._epoch:
                self._order_cache = (epoch, order)
            return order

    def next_indices(self, rank: int, size: int, batch_size: int | None = None) -> np.ndarray:
        """Worker ``rank``'s ids (int64) for the next step of a cluster of ``size`` workers.

        Does not move the position: calling it again before :meth:`commit`
        returns the same ids (for the same ``size``), which is what a worker
        does when its step failed and is run again. ``batch_size``, when
        given, becomes the sampler's per-worker batch size from this step on
        (a policy's latest choice; :meth:`state_dict` carries it).

        Raises:
            TypeError: an argument is not an int.
            ValueError: ``size`` or ``batch_size`` is below 1, or ``rank`` is outside ``[0, size)``.

        Example:
            >>> s = ElasticSampler(10, batch_size=3, shuffle=False)
            >>> s.next_indices(1, 2).tolist(), s.next_indices(1, 2, batch_size=2).tolist()
            ([3, 4, 5], [2, 3])
        """
        rank, size = _rank_and_size("ElasticSampler.next_indices", rank, size)
        with self._lock:
            if batch_size is not None:
                self.batch_size = batch_size
            count = min(size * self._batch_size, self._num_samples - self._offset)
            self._planned[(self._epoch, self._offset)] = (size, count)
            return self._share(self.order(), self._offset, count, rank, size)

    def commit(self, size: int | None = None) -> None:
        """Advance past the step planned at the current position (call only after it succeeded).

        The step must have been planned, by :meth:`next_indices` (or
        :meth:`batches` / :meth:`dataset`) at this position; ``size`` (default:
        the planned one) must be the cluster size it was planned for. At the
        end of the epoch, ``epoch`` grows by one and ``offset`` returns to 0.

        Raises:
            RuntimeError: no step was planned at the current position (a state
                loaded by :meth:`load_state_dict` must be planned again).
            ValueError: ``size`` differs from the size the step was planned for
                (ids were taken for another cluster: after a resize, plan again
                or rebuild :meth:`batches` / :meth:`dataset`).

        Example:
            >>> s = ElasticSampler(3, batch_size=2, shuffle=False)
            >>> _ = s.next_indices(0, 1); s.commit(1); (s.epoch, s.offset)
            (0, 2)
            >>> _ = s.next_indices(0, 1); s.commit(1); (s.epoch, s.offset)
            (1, 0)
        """
        if size is not None:
            size = _int_at_least("ElasticSampler.commit: size", size, 1)
        with self._lock:
            position = (self._epoch, self._offset)
            if position not in self._planned:
                raise RuntimeError(
                    f"ElasticSampler.commit: no step was planned at epoch {self._epoch}, offset "
                    f"{self._offset}; call next_indices(rank, size) for the step before committing it "
                    "(after load_state_dict, the step must be planned again)"
                )
            planned_size, count = self._planned[position]
            if size is not None and size != planned_size:
                raise ValueError(
                    f"ElasticSampler.commit: size={size}, but the step at epoch {self._epoch}, offset "
                    f"{self._offset} was planned for size {planned_size} (its ids were split among "
                    f"{planned_size} workers); after a resize, call next_indices with the new size "
                    "(or rebuild batches()/dataset()) before the step"
                )
            self._offset += count
            if self._offset == self._num_samples:
                self._epoch += 1
                self._offset = 0
            # Plans behind the new position can never be committed.
            self._planned = {p: plan for p, plan in self._planned.items() if p >= (self._epoch, self._offset)}

    def state_dict(self) -> dict[str, Any]:
        """The position (and what defines the order), JSON-able; see :meth:`load_state_dict`.

        Example:
            >>> ElasticSampler(8, 2, seed=7).state_dict()
            {'num_samples': 8, 'seed': 7, 'shuffle': True, 'batch_size': 2, 'epoch': 0, 'offset': 0}
        """
        with self._lock:
            return {
                "num_samples": self._num_samples,
                "seed": self._seed,
                "shuffle": self._shuffle,
                "batch_size": self._batch_size,
                "epoch": self._epoch,
                "offset": self._offset,
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict` of a sampler over the same data).

        Takes position and batch size; forgets the steps planned here and
        not committed (plan the next step again).

        Raises:
            TypeError: ``state`` is not a mapping, or a value has the wrong type.
            ValueError: keys are missing or unknown; ``num_samples``, ``seed``
                or ``shuffle`` differ from this sampler's (another order); or
                ``batch_size``, ``epoch`` or ``offset`` is out of range
                (``offset`` must be in ``[0, num_samples)``).

        Example:
            >>> a, b = ElasticSampler(8, 2, seed=7), ElasticSampler(8, 2, seed=7)
            >>> _ = a.next_indices(0, 2); a.commit(2)
            >>> b.load_state_dict(a.state_dict()); b.offset
            4
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"ElasticSampler.load_state_dict: state must be a mapping, got {type(state).__name__}")
        missing = sorted(set(_STATE_TYPES) - set(state))
        unknown = sorted(set(state) - set(_STATE_TYPES), key=str)
        if missing or unknown:
            raise ValueError(
                f"ElasticSampler.load_state_dict: state keys must be {sorted(_STATE_TYPES)}; "
                f"missing {missing}, unknown {unknown}"
            )
        for key, kind in _STATE_TYPES.items():
            value = state[key]
            ok = isinstance(value, bool) if kind is bool else _is_int(value)
            if not ok:
                raise TypeError(
                    f"ElasticSampler.load_state_dict: state[{key!r}] must be {kind.__name__}, got {value!r}"
                )
        for key in _IDENTITY_KEYS:
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"ElasticSampler.load_state_dict: state[{key!r}] is {state[key]!r}, this sampler's "
                    f"{key} is {getattr(self, key)!r}; a state of another sampler would give other ids"
                )
        batch_size = _int_at_least("ElasticSampler.load_state_dict: state['batch_size']", state["batch_size"], 1)
        epoch = _int_at_least("ElasticSampler.load_state_dict: state['epoch']", state["epoch"], 0)
        offset = int(state["offset"])
        if not 0 <= offset < self._num_samples:
            raise ValueError(
                f"ElasticSampler.load_state_dict: state['offset'] is {offset}, outside the epoch "
                f"[0, {self._num_samples}) (num_samples={self._num_samples})"
            )
        with self._lock:
            self._batch_size, self._epoch, self._offset = batch_size, epoch, offset
            self._planned = {}

    def batches(self, rank: int, size: int) -> Iterator[np.ndarray]:
        """Worker ``rank``'s ids for each remaining step of the current epoch, for a fixed ``size``.

        A plain Python iterator. It starts at the current position and
        projects it, as if each step it yields were committed, without
        moving the sampler: commit each step after it succeeded, as with
        :meth:`next_indices` (each yielded step is planned for :meth:`commit`).
        The batch size is read as each batch is made, so a change between
        steps applies from the next batch. Rebuild it after every resize (and
        at each epoch): it stops at the end of the epoch.

        Raises:
            TypeError, ValueError: as :meth:`next_indices`, at the call.

        Example:
            >>> s = ElasticSampler(5, batch_size=1, shuffle=False)
            >>> [ids.tolist() for ids in s.batches(rank=1, size=2)]
            [[1], [3], []]
        """
        rank, size = _rank_and_size("ElasticSampler.batches", rank, size)
        with self._lock:
            epoch, offset = self._epoch, self._offset
        return self._projected_batches(epoch, offset, rank, size)

    def dataset(self, arrays: Any, rank: int, size: int, with_ids: bool = False) -> tf.data.Dataset:
        """A ``tf.data.Dataset`` of worker ``rank``'s batches of ``arrays`` for the rest of the epoch.

        ``arrays`` is an array or a nest (tuple, dict) of arrays whose first
        dimension is ``num_samples``, e.g. ``(x, y)`` for Keras ``fit``.
        Each element gathers the rows of one :meth:`batches` step, so it
        follows the same rules: the position is read when an iterator is
        created (each Keras epoch, each ``iter()``), commit each step after it
        succeeded, rebuild the iterator after a resize. With ``with_ids``
        each element is ``(ids, batch)``, to record which samples were
        trained. The batch dimension is unknown (None) and batches are made
        when asked for (no autotuned prefetch), so a batch size changed
        between steps applies from the next batch.

        Raises:
            ValueError: an array's first dimension is not ``num_samples``;
                ``rank``/``size`` as :meth:`next_indices`.

        Example:
            >>> import numpy as np
            >>> s = ElasticSampler(4, batch_size=2, shuffle=False)
            >>> x = np.arange(8).reshape(4, 2)
            >>> [b.tolist() for b in s.dataset(x, rank=0, size=1).as_numpy_iterator()]
            [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
        """
        rank, size = _rank_and_size("ElasticSampler.dataset", rank, size)
        tensors = tf.nest.map_structure(tf.convert_to_tensor, arrays)
        for tensor in tf.nest.flatten(tensors):
            if tensor.shape.rank == 0 or tensor.shape[0] != self._num_samples:
                raise ValueError(
                    f"ElasticSampler.dataset: every array's first dimension must be num_samples="
                    f"{self._num_samples}; got an array of shape {tensor.shape.as_list()}"
                )
        start_iterator: Callable[[], Iterator[np.ndarray]] = lambda: self.batches(rank, size)
        ids = tf.data.Dataset.from_generator(start_iterator, output_signature=tf.TensorSpec([None], tf.int64))

        @tf.autograph.experimental.do_not_convert
        def gather(batch_ids: tf.Tensor) -> Any:
            batch = tf.nest.map_structure(lambda t: tf.gather(t, batch_ids), tensors)
            return (batch_ids, batch) if with_ids else batch

        # No read-ahead: a batch made early would use a stale batch size and
        # plan steps past a resize.
        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_optimization.inject_prefetch = False
        return ids.map(gather).with_options(options)

    def _projected_batches(self, epoch: int, offset: int, rank: int, size: int) -> Iterator[np.ndarray]:
        while offset < self._num_samples:
            with self._lock:
                count = min(size * self._batch_size, self._num_samples - offset)
                self._planned[(epoch, offset)] = (size, count)
                ids = self._share(self.order(epoch), offset, count, rank, size)
            yield ids
            offset += count

    @staticmethod
    def _share(order: np.ndarray, offset: int, count: int, rank: int, size: int) -> np.ndarray:
        # array_split's rule: the first count % size workers get one id more.
        base, extra = divmod(count, size)
        start = offset + rank * base + min(rank, extra)
        return order[start : start + base + (rank < extra)].copy()


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _int_at_least(name: str, value: object, minimum: int) -> int:
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = operator.index(value)  # type: ignore[arg-type]
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def _rank_and_size(where: str, rank: object, size: object) -> tuple[int, int]:
    size = _int_at_least(f"{where}: size", size, 1)
    if not _is_int(rank):
        raise TypeError(f"{where}: rank must be an int, got {rank!r}")
    rank = operator.index(rank)  # type: ignore[arg-type]
    if not 0 <= rank < size:
        raise ValueError(f"{where}: rank must be in [0, size={size}), got rank={rank}")
    return rank, size
