"""``kungfu_tf.data.ElasticSampler``: each sample of each epoch trained exactly once, whatever the cluster does.

Workers are simulated in this process: one sampler per worker, as in a real
job, driven through resizes (4 -> 2 -> 3), a crash whose step completed on
some survivors only, discarded steps (planned, never committed), batch-size
changes and joiners that load a JSON round-tripped state. Every worker's ids
are compared with an independent numpy reference: the epoch's order
``default_rng([seed, epoch]).permutation(n)`` cut into consecutive global
batches of ``min(size * batch, left)`` ids, each split by ``numpy.array_split``.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
import tensorflow as tf

from kungfu_tf.data import ElasticSampler


def reference_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)


class ReferencePosition:
    """numpy model of the position: which ids each rank must get, and what a committed step trains."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch, self.offset = n, seed, 0, 0

    def global_batch(self, size: int, batch: int) -> np.ndarray:
        order = reference_order(self.n, self.seed, self.epoch)
        return order[self.offset : self.offset + min(size * batch, self.n - self.offset)]

    def shares(self, size: int, batch: int) -> list[np.ndarray]:
        return np.array_split(self.global_batch(size, batch), size)

    def advance(self, size: int, batch: int) -> None:
        self.offset += len(self.global_batch(size, batch))
        if self.offset == self.n:
            self.epoch, self.offset = self.epoch + 1, 0


def transfer(source: ElasticSampler, target: ElasticSampler) -> None:
    """What elastic state sync does: the source's state, through JSON, into the target."""
    target.load_state_dict(json.loads(json.dumps(source.state_dict())))


class SimulatedJob:
    """Samplers of the current workers (rank order) plus the record of what was trained."""

    def __init__(self, n: int, seed: int, size: int, batch: int) -> None:
        self.n, self.seed = n, seed
        self.workers = [ElasticSampler(n, batch, seed=seed) for _ in range(size)]
        self.reference = ReferencePosition(n, seed)
        self.trained: dict[int, list[int]] = defaultdict(list)  # epoch -> ids in step order
        self.discarded: list[tuple[int, np.ndarray]] = []  # (epoch, ids of the step)
        self.short_steps = 0

    def plan(self, batch: int) -> list[np.ndarray]:
        """Every worker takes its ids for the next step; checked against the reference."""
        size = len(self.workers)
        shares = [w.next_indices(rank, size, batch_size=batch) for rank, w in enumerate(self.workers)]
        for rank, (got, want) in enumerate(zip(shares, self.reference.shares(size, batch))):
            np.testing.assert_array_equal(got, want, err_msg=f"rank {rank} of {size}, batch {batch}")
            assert got.dtype == np.int64
        if sum(map(len, shares)) < size * batch:
            self.short_steps += 1
        return shares

    def step(self, batch: int) -> None:
        """A step that succeeded on every worker."""
        shares = self.plan(batch)
        self.trained[self.workers[0].epoch].extend(np.concatenate(shares).tolist())
        for w in self.workers:
            w.commit(len(self.workers))
        self.reference.advance(len(self.workers), batch)

    def discarded_step(self, batch: int) -> None:
        """Ids taken, then the step failed everywhere (a peer crashed before the all-reduce completed)."""
        shares = self.plan(batch)
        self.discarded.append((self.workers[0].epoch, np.concatenate(shares)))

    def crash(self, batch: int, victim: int, completed_on: set[int]) -> None:
        """``victim`` dies in a step that completed on the survivors in ``completed_on`` only.

        The step's update exists (somebody applied it), so its ids count as
        trained; survivors that missed it take the state of one that has it
        (the max-step rule of state sync).
        """
        size = len(self.workers)
        shares = self.plan(batch)
        self.trained[self.workers[0].epoch].extend(np.concatenate(shares).tolist())
        for rank in completed_on:
            self.workers[rank].commit(size)
        self.reference.advance(size, batch)
        survivors = [w for rank, w in enumerate(self.workers) if rank != victim]
        source = self.workers[min(completed_on)]
        for rank, w in enumerate(self.workers):
            if rank != victim and rank not in completed_on:
                transfer(source, w)
        self.workers = survivors

    def resize(self, size: int) -> None:
        """Shrink keeps the lowest ranks; grow appends joiners built with other settings, then synced."""
        if size <= len(self.workers):
            self.workers = self.workers[:size]
            return
        for _ in range(size - len(self.workers)):
            joiner = ElasticSampler(self.n, 1, seed=self.seed)
            transfer(self.workers[0], joiner)
            self.workers.append(joiner)

    def check_states_agree(self) -> None:
        states = [w.state_dict() for w in self.workers]
        assert all(s == states[0] for s in states), states
        assert (states[0]["epoch"], states[0]["offset"]) == (self.reference.epoch, self.reference.offset)


def test_each_sample_of_each_epoch_once_through_resizes_crash_and_discarded_steps():
    n, seed = 103, 5
    job = SimulatedJob(n, seed, size=4, batch=5)
    while job.workers[0].epoch < 3:
        job.resize(4)
        job.step(5)
        job.discarded_step(5)  # a peer crashed before the all-reduce; 4 workers remain...
        job.step(5)  # ...and run the step again
        job.resize(2)
        job.step(7)
        job.discarded_step(6)  # the policy's batch for the discarded step is not kept...
        job.step(7)  # ...a different one takes the same position
        job.resize(3)
        job.step(3)
        job.crash(3, victim=1, completed_on={2})  # rank 0 missed the completed step
        job.check_states_agree()
        job.step(4)
        job.check_states_agree()
    assert job.short_steps >= 3  # each epoch ended with a short step (103 is prime)
    for epoch in range(3):
        ids = job.trained[epoch]
        assert sorted(ids) == list(range(n)), f"epoch {epoch}: some ids twice or never"
    assert len(job.discarded) >= 6
    for epoch, ids in job.discarded:
        # Discarded samples are trained later in the same epoch (and not before: exactly once).
        assert set(ids.tolist()) <= set(job.trained[epoch])


def test_last_short_step_of_an_epoch_splits_evenly_lower_ranks_first():
    sampler = ElasticSampler(10, batch_size=2, shuffle=False)
    first = [sampler.next_indices(r, 4).tolist() for r in range(4)]
    assert first == [[0, 1], [2, 3], [4, 5], [6, 7]]
    sampler.commit(4)
    assert [sampler.next_indices(r, 4).tolist() for r in range(4)] == [[8], [9], [], []]
    sampler.commit(4)
    assert (sampler.epoch, sampler.offset) == (1, 0)
    # 7 left with 3 workers of batch 4: 3, 2, 2.
    sampler.batch_size = 1
    sampler.next_indices(0, 3)
    sampler.commit(3)
    assert [len(sampler.next_indices(r, 3, batch_size=4)) for r in range(3)] == [3, 2, 2]


def test_commit_advances_by_the_planned_step_not_the_current_batch_size():
    s = ElasticSampler(30, batch_size=3, shuffle=False)
    assert s.next_indices(1, 2).tolist() == [3, 4, 5]
    s.batch_size = 5  # the policy's choice for the next step, made while this one runs
    s.commit()
    assert s.offset == 6
    assert s.next_indices(0, 2).tolist() == [6, 7, 8, 9, 10]


def test_state_round_trip_mid_epoch_gives_the_same_future_ids():
    a = ElasticSampler(37, batch_size=3, seed=11)
    for size, batch in [(4, 3), (2, 5), (3, 2)]:
        a.next_indices(0, size, batch_size=batch)
        a.commit(size)
    a.next_indices(1, 3)  # planned, not committed: not part of the state
    b = ElasticSampler(37, batch_size=1, seed=11)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict() and b.batch_size == 2 and 0 < b.offset < 37
    with pytest.raises(RuntimeError, match="no step was planned at epoch 0, offset"):
        b.commit(3)  # the loaded state has no plan: the step must be planned again
    a.load_state_dict(a.state_dict())
    with pytest.raises(RuntimeError, match="no step was planned"):
        a.commit(3)  # loading forgets the steps planned before, even at the same position
    for step in range(40):  # over two epoch ends
        size = 1 + step % 4
        for rank in range(size):
            np.testing.assert_array_equal(a.next_indices(rank, size), b.next_indices(rank, size))
        a.commit(size)
        b.commit(size)
    assert a.epoch >= 2 and a.state_dict() == b.state_dict()


def test_orders_are_seeded_permutations():
    n = 50
    same = [ElasticSampler(n, 1, seed=3), ElasticSampler(n, 1, seed=3)]
    other = ElasticSampler(n, 1, seed=4)
    for epoch in range(3):
        np.testing.assert_array_equal(same[0].order(epoch), reference_order(n, 3, epoch))
        np.testing.assert_array_equal(same[0].order(epoch), same[1].order(epoch))
        assert not np.array_equal(same[0].order(epoch), other.order(epoch))
        assert sorted(same[0].order(epoch).tolist()) == list(range(n))
    assert not np.array_equal(same[0].order(0), same[0].order(1))  # a new order every epoch
    np.testing.assert_array_equal(ElasticSampler(n, 1, seed=3, shuffle=False).order(2), np.arange(n))
    assert not same[0].order().flags.writeable


def test_batches_projects_the_rest_of_the_epoch_without_moving():
    n, seed, size = 29, 2, 3
    workers = [ElasticSampler(n, 4, seed=seed) for _ in range(size)]
    reference = ReferencePosition(n, seed)
    for w in workers:
        w.next_indices(0, size)
        w.commit(size)
    reference.advance(size, 4)
    iterators = [w.batches(rank, size) for rank, w in enumerate(workers)]
    trained = list(reference_order(n, seed, 0)[:12])
    batch = 4
    while reference.epoch == 0:
        shares = [next(it) for it in iterators]
        for got, want in zip(shares, reference.shares(size, batch)):
            np.testing.assert_array_equal(got, want)
        trained += np.concatenate(shares).tolist()
        assert workers[0].offset == reference.offset  # yielding does not move the position
        for w in workers:
            w.commit(size)  # commits the step the iterator planned
            w.batch_size = 2  # applies from the next batch the iterators make
        reference.advance(size, batch)
        batch = 2
    assert all(next(it, None) is None for it in iterators)  # each stops at the epoch's end
    assert sorted(trained) == list(range(n))
    assert [w.epoch for w in workers] == [1] * size


def test_dataset_gathers_rows_of_the_planned_ids_and_follows_resizes():
    n = 23
    x = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
    y = np.arange(n, dtype=np.int64) * 10
    workers = [ElasticSampler(n, 3, seed=9) for _ in range(2)]
    trained: list[int] = []

    def train(steps: int) -> None:
        size = len(workers)
        iterators = [iter(w.dataset((x, y), rank, size, with_ids=True)) for rank, w in enumerate(workers)]
        for _ in range(steps):
            for it in iterators:
                ids, (xb, yb) = next(it)
                np.testing.assert_array_equal(xb.numpy(), x[ids.numpy()])
                np.testing.assert_array_equal(yb.numpy(), y[ids.numpy()])
                trained.extend(ids.numpy().tolist())
            for w in workers:
                w.commit(size)

    train(2)  # 12 ids
    workers.append(ElasticSampler(n, 1, seed=9))
    transfer(workers[0], workers[2])
    workers[0].next_indices(0, 2)
    with pytest.raises(ValueError, match="planned for size 2"):
        workers[0].commit(3)  # a step planned before the resize cannot be committed after it
    for w in workers:
        w.batch_size = 2
    train(2)  # 12 more: 23 reached after 11
    assert sorted(trained) == list(range(n))
    assert [w.epoch for w in workers] == [1, 1, 1]
    plain = workers[0].dataset(x, 0, 1)
    assert plain.element_spec.shape.as_list() == [None, 2]
    assert next(iter(plain)).shape == (2, 2)


def test_invalid_arguments_name_the_cause():
    with pytest.raises(ValueError, match="num_samples must be at least 1, got 0"):
        ElasticSampler(0, 1)
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        ElasticSampler(5, 0)
    with pytest.raises(TypeError, match="batch_size must be an int, got 2.0"):
        ElasticSampler(5, 2.0)
    with pytest.raises(TypeError, match="num_samples must be an int, got True"):
        ElasticSampler(True, 1)
    with pytest.raises(ValueError, match="seed must be at least 0, got -1"):
        ElasticSampler(5, 1, seed=-1)
    with pytest.raises(TypeError, match="shuffle must be a bool, got 1"):
        ElasticSampler(5, 1, shuffle=1)
    s = ElasticSampler(5, 1)
    for rank, size in [(2, 2), (-1, 2)]:
        with pytest.raises(ValueError, match=rf"rank must be in \[0, size=2\), got rank={rank}"):
            s.next_indices(rank, size)
    with pytest.raises(ValueError, match="size must be at least 1, got 0"):
        s.batches(0, 0)
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        s.next_indices(0, 1, batch_size=0)
    with pytest.raises(ValueError, match="batch_size must be at least 1, got -3"):
        s.batch_size = -3
    with pytest.raises(RuntimeError, match="no step was planned at epoch 0, offset 0"):
        s.commit(1)
    s.next_indices(0, 4)
    with pytest.raises(ValueError, match="commit: size=3, but the step at epoch 0, offset 0 was planned for size 4"):
        s.commit(3)
    with pytest.raises(ValueError, match=r"first dimension must be num_samples=5; got an array of shape \[4\]"):
        s.dataset((np.zeros(5), np.zeros(4)), 0, 1)


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda st: st.pop("offset"), ValueError, r"missing \['offset'\], unknown \[\]"),
        (lambda st: st.update(position=3), ValueError, r"missing \[\], unknown \['position'\]"),
        (lambda st: st.update(offset=8), ValueError, r"state\['offset'\] is 8, outside the epoch \[0, 8\)"),
        (lambda st: st.update(offset=-1), ValueError, r"state\['offset'\] is -1, outside the epoch"),
        (lambda st: st.update(offset="3"), TypeError, r"state\['offset'\] must be int, got '3'"),
        (lambda st: st.update(epoch=1.0), TypeError, r"state\['epoch'\] must be int, got 1.0"),
        (lambda st: st.update(shuffle=1), TypeError, r"state\['shuffle'\] must be bool, got 1"),
        (lambda st: st.update(epoch=-2), ValueError, r"state\['epoch'\] must be at least 0, got -2"),
        (lambda st: st.update(batch_size=0), ValueError, r"state\['batch_size'\] must be at least 1, got 0"),
        (lambda st: st.update(seed=8), ValueError, r"state\['seed'\] is 8, this sampler's seed is 7"),
        (lambda st: st.update(num_samples=9), ValueError, r"state\['num_samples'\] is 9, this sampler's"),
    ],
)
def test_load_state_dict_rejects_bad_states(change, error, message):
    s = ElasticSampler(8, 2, seed=7)
    state = s.state_dict()
    change(state)
    with pytest.raises(error, match=message):
        s.load_state_dict(state)
    assert s.state_dict() == ElasticSampler(8, 2, seed=7).state_dict()  # unchanged
    with pytest.raises(TypeError, match="state must be a mapping, got list"):
        s.load_state_dict([])


def test_dataset_batches_follow_a_batch_size_set_between_steps():
    # The policy changes the per-worker batch between steps; the next element has the new size.
    s = ElasticSampler(20, 2, shuffle=False)
    it = iter(s.dataset(np.arange(20), 0, 1))
    assert next(it).numpy().tolist() == [0, 1]
    s.commit(1)
    s.batch_size = 5
    assert next(it).numpy().tolist() == [2, 3, 4, 5, 6]
    s.commit(1)
    assert s.offset == 7
    assert tf.data.experimental.cardinality(s.dataset(np.arange(20), 0, 1)) == tf.data.UNKNOWN_CARDINALITY
