"""A strategy survives membership changes (issue 24 §2): models/elastic_train.py with ``--strategy``.

``kungfu-run --elastic -np 3 --max-np 3``, a custom loop (``kungfu_tf.elastic.function``) inside
``kungfu_tf.elastic.run`` with ``SynchronousSGDOptimizer(opt, strategy=...)``:

* every builder, and a written strategy (a file naming the owners of shards), through three changes in one job:
  the worker of rank 2 (an owner of variables in every strategy with parameter servers) is SIGKILLed as
  step 4 begins; the job grows back to 3 at step 8 (``resize(3, wait=True)``: the launcher's replacement
  joins) and shrinks to 2 at step 12 (the worker of rank 2, an owner again, leaves). Plain SGD: the
  crashed owner's values are on every worker, and it has no slots to lose. The step the crash failed
  is run again after the sync and must be counted once (Keras's ``iterations``, which Adam's bias
  correction reads): the survivors once counted it twice.
* SGD with momentum and a SIGKILLed owner, with every strategy that has parameter servers: its slots
  survive in the replicas every rank keeps (they restarted at zero before).
* SGD with momentum, whose slots live on the owners only, through a shrink (the leaving owner hands its
  slots over before the change commits), a growth (the joiner's share moves to it) and a shrink again:
  the written partitioned strategy (shard slots), Parallax (all-reduced slots), and PSLoadBalancing in
  Keras ``fit`` (``elastic_fit``).

Before the strategy was re-built at a change, every worker died at the first one (``reduce: root 2
outside a cluster of 2``: a variable's owner had left) and the launcher ended with 0 workers. Checked:
the job ends well, the final workers hold identical weights, and they equal one process trained on the
union of each step's batches with the same optimizer (tests/elastic_records.py), so no step was lost or
applied twice, every owner's update reached every worker and every slot reached its new owner.

Refusals, the same precise error on every worker: a written strategy for a fixed number of replicas at
a shrink (before the change commits: the cluster stays at 3), and a step traced with a plain
``tf.function`` before a change that re-built the strategy (before it sends anything).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import describe, rank_lines, run_job, worker_env
from elastic_records import (
    MODELS,
    final_weights,
    load,
    reference_weights,
    steps_by_index,
)

SAMPLES, BATCH, HIDDEN, LR, STEPS = 96, 4, 8, 0.05, 16
BUILDERS = ("AllReduce", "PS", "PSLoadBalancing", "PartitionedPS", "UnevenPartitionedPS", "PartitionedAR", "Parallax")
LAUNCHER = ["--elastic", "--max-np", "3"]


def written_strategy(tmp_path, replicas: int = 0, workers: int = 3) -> str:
    """A PartitionedPS strategy for ``workers`` workers (every weight matrix cut into that many shards, one per
    owner), as a file (``graph_config.replicas``: ``replicas``)."""
    import sys

    import keras

    from kungfu_tf.strategy import builders
    from kungfu_tf.strategy import format as strategy_format
    from kungfu_tf.strategy.cluster_spec import ClusterSpec
    from kungfu_tf.strategy.variable_info import describe_variables

    sys.path.insert(0, str(MODELS))
    from digits import build_digits_mlp

    keras.backend.clear_session()  # the variables' names, as the workers' first model has them
    model = build_digits_mlp(hidden=(HIDDEN,), seed=1)
    variables = describe_variables(model.trainable_variables)
    strategy = builders.PartitionedPS(min_partition_bytes=64).build(variables, ClusterSpec(workers))
    assert sum(len(n.part_config) for n in strategy.node_config) >= 2 * workers, strategy  # both kernels cut
    strategy.graph_config.replicas = replicas
    path = tmp_path / "strategy.pbtxt"
    strategy_format.save(strategy, path)
    return str(path)


def check_trained_like_one_process(tmp_path, rc, out, err, sizes: list[int], optimizer: str,
                                   samples: int = SAMPLES) -> None:  # fmt: skip
    steps, finals = check_every_step_once(tmp_path, rc, out, err, sizes)
    reference = reference_weights(steps, samples, HIDDEN, LR, optimizer)
    for got, want in zip(final_weights(tmp_path / "records", finals[0]), reference):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def check_every_step_once(tmp_path, rc, out, err, sizes: list[int] | None,
                          counted: tuple[int, ...] = (STEPS,)) -> tuple[dict, list[str]]:  # fmt: skip
    """The job ended well, ran every step once with ``sizes`` workers at steps 3, 4, 7, 8, 11 and 12 (None: any),
    and its two final workers hold identical weights and counted one of ``counted`` steps; returns (steps by
    index, the final workers' record stems)."""
    report = describe(rc, out, err)
    assert rc == 0, report
    records = load(tmp_path / "records")
    steps = steps_by_index(records)
    assert sorted(steps) == list(range(STEPS)), report
    assert sizes is None or [len(steps[s]) for s in (3, 4, 7, 8, 11, 12)] == sizes, report
    ends = {stem: lines[-1] for stem, lines in records.items() if lines and lines[-1]["event"] == "end"}
    finals = [stem for stem, end in ends.items() if not end["detached"]]
    assert len(finals) == 2 and len({ends[s]["weights_sha256"] for s in finals}) == 1, report
    # Every step counted once on every worker: the step a lost peer failed is run again after the sync, and
    # had counted on the survivors (Adam's bias correction then ran a step ahead of one process).
    iterations = [ends[s]["optimizer_iterations"] for s in finals]
    assert iterations[0] == iterations[1] and iterations[0][0] in counted, report
    return steps, finals


def assert_every_rank_said(err: str, ranks: int, text: str, report: str) -> None:
    """Each of ranks 0..ranks-1 printed ``text`` (the same precise error on every worker)."""
    lines = rank_lines(err)
    for rank in range(ranks):
        assert text in "\n".join(lines.get(rank, [])), report


def train_args(tmp_path, strategy: str, optimizer: str = "sgd") -> list[object]:
    return ["--api", "function", "--strategy", strategy, "--optimizer", optimizer, "--samples", SAMPLES,
            "--batch-size", BATCH, "--hidden", HIDDEN, "--lr", LR, "--steps", STEPS, "--epochs", 10,
            "--record-dir", tmp_path / "records"]  # fmt: skip


@pytest.mark.parametrize("strategy", [*BUILDERS, "written"])
def test_a_strategy_survives_a_crashed_owner_a_growth_and_a_shrink(tmp_path, strategy):
    source = written_strategy(tmp_path) if strategy == "written" else strategy
    args = train_args(tmp_path, source) + ["--crash-at", 4, "--crash-rank", 2, "--resize-at", "8:3,12:2", "--resize-wait"]
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=240, extra_launcher_args=LAUNCHER)
    check_trained_like_one_process(tmp_path, rc, out, err, [3, 2, 2, 3, 3, 2], "sgd")
    # The final workers' step traces: an all-reduce strategy the changes left as it was keeps its trace; one
    # with parameter servers is traced again at each change the worker went through (a joiner's first trace
    # is its warm-up's, alone).
    traces = [r["traces"] for lines in load(tmp_path / "records").values() for r in lines if r["event"] == "traces"]
    if strategy == "AllReduce":
        assert traces and set(traces) == {1}, traces
    elif strategy in ("PS", "PSLoadBalancing", "PartitionedPS", "UnevenPartitionedPS", "written"):
        assert traces and min(traces) >= 2, traces


@pytest.mark.parametrize("strategy", ["PS", "PSLoadBalancing", "PartitionedPS", "UnevenPartitionedPS", "written"])
def test_a_crashed_owners_optimizer_slots_survive_on_the_others(tmp_path, strategy):
    # SGD with momentum: the owner's slots exist on the owner alone, and rank 2 (an owner in each of these
    # strategies) is SIGKILLed as step 4 begins. Every rank keeps a replica of every parameter server's
    # slots, published after each update, and the change takes the dead owner's from the first survivor.
    # Before, they restarted at zero (a warning named them) and the weights left one process's.
    source = written_strategy(tmp_path) if strategy == "written" else strategy
    args = train_args(tmp_path, source, "momentum") + ["--crash-at", 4, "--crash-rank", 2, "--resize-at", "8:3,12:2",
                                                       "--resize-wait"]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=240, extra_launcher_args=LAUNCHER)
    check_trained_like_one_process(tmp_path, rc, out, err, [3, 2, 2, 3, 3, 2], "momentum")
    assert "left without handing over its optimizer slots" not in err, err[-3000:]


@pytest.mark.parametrize(("strategy", "optimizer", "crash_rank"), [("PS", "adafactor", 0), ("PSLoadBalancing", "muon", 2)])
def test_slots_not_one_per_kind_of_the_variables_shape_follow_their_variables(tmp_path, strategy, optimizer, crash_rank):
    # Keras's Adafactor keeps a matrix's second moment as its row and column sums (made without a reference
    # variable, held in lists by variable index) and two int32 placeholder scalars for a bias; Muon keeps one slot
    # for a matrix and two for a bias. Both were refused with parameter servers in an elastic job. Now a whole
    # variable's slots move as they are: the owner (rank 0 owns everything under PS) is SIGKILLed, its slots come
    # from the others' replicas; then a growth and a shrink move them to new owners.
    args = train_args(tmp_path, strategy, optimizer) + ["--crash-at", 4, "--crash-rank", crash_rank, "--resize-at",
                                                        "8:3,12:2", "--resize-wait"]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=240, extra_launcher_args=LAUNCHER)
    check_trained_like_one_process(tmp_path, rc, out, err, [3, 2, 2, 3, 3, 2], optimizer)
    assert "left without handing over its optimizer slots" not in err, err[-3000:]


@pytest.mark.parametrize(("strategy", "staleness", "optimizer"), [("PS", 1, "momentum"), ("PSLoadBalancing", -1, "adam"),
                                                                 ("PartitionedPS", 2, "momentum")])  # fmt: skip
def test_stale_and_asynchronous_parameter_servers_survive_a_crash_a_growth_and_a_shrink(tmp_path, strategy, staleness,
                                                                                        optimizer):  # fmt: skip
    # A stale parameter server's copies differ between workers (each is the owner's value as of its last fetch).
    # Before, every worker failed the first state sync (StateMismatchError: the digests differed) and the job
    # fell to 0 workers. Now every change first gives every worker the owners' values (a crashed owner's: the
    # first member's copy), and the new plan's stale blobs are its own (the owners' stores keep the old plan's,
    # at versions the new plan's restarted step count would have taken for its own: PartitionedPS, which cuts
    # every kernel into as many shards as workers, fell to 0 workers without them). Rank 0 owns every variable
    # under PS; rank 2 some under PSLoadBalancing and PartitionedPS. Stale training is not one process's: the job
    # must end well, every step once, and the final workers (sync_stale_copies at the end) identical. A stale step
    # has no completion barrier: the step the crash failed had counted itself on the survivors and counts again
    # when it is run again (documented), hence STEPS + 1; and a worker may have run one or more steps ahead of
    # the others when the owner died (as staleness allows), hence no fixed number of workers per step.
    args = train_args(tmp_path, strategy, optimizer) + ["--staleness", staleness, "--crash-at", 4, "--crash-rank",
                                                        0 if strategy == "PS" else 2, "--resize-at", "8:3,12:2",
                                                        "--resize-wait"]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=240, extra_launcher_args=LAUNCHER)
    check_every_step_once(tmp_path, rc, out, err, None, counted=(STEPS, STEPS + 1))


def _owned_slot_pieces(path) -> dict[tuple[int, int, int, int, int], np.ndarray]:
    """models/elastic_train.py --record-owned-slots: (variable, kind, axis, start, stop) -> the slot's values (kind
    -1: the part's own value)."""
    with np.load(path) as data:
        return {tuple(int(x) for x in key.replace("v", "").replace("k", "").replace("a", "").split("_")): data[key]
                for key in data.files}  # fmt: skip


@pytest.mark.parametrize(("strategy", "staleness"), [("PS", 1), ("PartitionedPS", -1)])
def test_a_crashed_stale_owners_slots_are_its_own_of_a_recent_step(tmp_path, strategy, staleness):
    # A stale (staleness 1) or asynchronous parameter server's owner saves its slots in its value's blob; every
    # other worker fetches them with the value and keeps them as replicas. The owner (rank 0 owns everything under
    # PS; rank 2 a shard of each kernel and a bias under PartitionedPS) is SIGKILLed when 4 steps are done: after
    # the change, what the new owners hold of each part it held, its value and its slots, must be bit for bit its
    # own after one of its steps (the slots: that step's, or one version behind), a recent one within the staleness
    # bound (the first survivor is at most K steps behind the owner and its copies at most K steps behind its own
    # step). Before, no replica of a
    # stale owner's slots existed: they restarted at zero (under PS without the warning: no survivor held a slot).
    crash_rank = 0 if strategy == "PS" else 2
    args = train_args(tmp_path, strategy, "momentum") + ["--staleness", staleness, "--crash-at", 4, "--crash-rank",
                                                         crash_rank, "--record-owned-slots"]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=240, extra_launcher_args=LAUNCHER)
    check_every_step_once(tmp_path, rc, out, err, None, counted=(STEPS, STEPS + 1))
    report = describe(rc, out, err)
    assert "left without handing over its optimizer slots" not in err, report
    record_dir = tmp_path / "records"
    records = load(record_dir)
    (dead,) = [stem for stem, lines in records.items() if not lines or lines[-1]["event"] != "end"]
    owned_by_step = {n: _owned_slot_pieces(record_dir / f"{dead}-owned-step{n}.npz") for n in range(1, 5)}
    assert owned_by_step[4], report  # the dead worker owned slots
    (version,) = {r["new_version"] for lines in records.values() for r in lines if r["event"] == "change" and r["lost"]}
    after: dict[tuple[int, int], np.ndarray] = {}  # (variable, kind) -> the survivors' slots, assembled
    for stem in records:
        path = record_dir / f"{stem}-owned-v{version}.npz"
        for (vi, k, axis, start, stop), values in (_owned_slot_pieces(path) if path.exists() else {}).items():
            if axis < 0:
                after[(vi, k)] = values
                continue
            # Every worker's shard of a variable along one axis: put each in place, the whole grows to fit.
            whole = after.setdefault((vi, k), np.full(values.shape, np.nan, values.dtype))
            if whole.shape[axis] < stop:
                grown = np.full([*whole.shape[:axis], stop, *whole.shape[axis + 1:]], np.nan, values.dtype)
                grown[tuple(slice(0, n) for n in whole.shape)] = whole
                after[(vi, k)] = whole = grown
            whole[(slice(None),) * axis + (slice(start, stop),)] = values
    oldest = 1 if staleness < 0 else 4 - 2 * staleness
    parts = {(vi, axis, start, stop) for vi, _, axis, start, stop in owned_by_step[4]}
    assert any(k >= 0 for _, k, *_ in owned_by_step[4]), report  # the dead owner held slots, not only values
    for vi, axis, start, stop in parts:
        region = (Ellipsis,) if axis < 0 else (slice(None),) * axis + (slice(start, stop),)
        kinds = [k for v, k, a, b, e in owned_by_step[4] if (v, a, b, e) == (vi, axis, start, stop)]
        got = {k: after[(vi, k)][region] for k in kinds}
        part = (axis, start, stop)

        def owners(n: int, k: int, vi: int = vi, part: tuple[int, int, int] = part) -> bytes:
            return owned_by_step[n][(vi, k, *part)].tobytes() if n >= 1 else b""

        # The value as after step n; the slots too, or one version behind (a step aborted between writing the value
        # and the replicas it brought), never ahead.
        paired = [n for n in range(oldest, 5) if got[-1].tobytes() == owners(n, -1)
                  and all(got[k].tobytes() in (owners(n, k), owners(n - 1, k)) for k in kinds if k >= 0)]  # fmt: skip
        assert paired and all(np.any(got[k] != 0) for k in kinds if k >= 0), (vi, axis, start, stop, got,
                                                                               report[-3000:])  # fmt: skip


def test_without_replicas_a_crashed_owners_slots_restart_and_every_survivor_says_so(tmp_path):
    # KUNGFU_SLOT_REPLICAS=0 trades the replicas' bytes for slots that restart when their owner crashes, and the
    # survivors must say so. Under PS rank 0 holds every slot; it is SIGKILLed when 4 steps are done. Before, the
    # survivors, holding no slot, could not tell that the optimizer had any, and said nothing.
    args = train_args(tmp_path, "PS", "momentum") + ["--crash-at", 4, "--crash-rank", 0, "--record-owned-slots"]
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=240, extra_launcher_args=LAUNCHER,
                           env=worker_env(KUNGFU_SLOT_REPLICAS="0"))  # fmt: skip
    check_every_step_once(tmp_path, rc, out, err, None)
    report = describe(rc, out, err)
    said = [line for lines in rank_lines(err).values() for line in lines if "left without handing over" in line]
    assert len(said) == 2 and all("restart" in line for line in said), report
    record_dir = tmp_path / "records"
    records = load(record_dir)
    (version,) = {r["new_version"] for lines in records.values() for r in lines if r["event"] == "change" and r["lost"]}
    after = [piece for stem in records if (record_dir / f"{stem}-owned-v{version}.npz").exists()
             for (_, k, *_), piece in _owned_slot_pieces(record_dir / f"{stem}-owned-v{version}.npz").items()
             if k >= 0]  # fmt: skip
    assert after and not any(np.any(piece) for piece in after), report  # the new owner's momentum: zeros


def test_slots_that_cannot_be_cut_into_shards_are_refused_with_a_partitioned_strategy_before_it_trains(tmp_path):
    # Adafactor's factored slots of a shard are not a cut of its variable's: under a partitioned strategy they
    # cannot follow the shards to new owners. Before, the owners raised while building the optimizer and the
    # others waited for them; now every worker refuses it at its first step, with the same error.
    args = train_args(tmp_path, written_strategy(tmp_path), "adafactor") + ["--resize-at", "12:2"]
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=120, extra_launcher_args=LAUNCHER)
    report = describe(rc, out, err)
    assert rc != 0, report
    assert_every_rank_said(err, 3, "Adafactor cannot train with parameter servers in an elastic job", report)
    assert_every_rank_said(err, 3, "a partitioned variable's slots are cut from its own", report)
    steps = [r for lines in load(tmp_path / "records").values() for r in lines if r["event"] == "step"]
    assert not steps, report


def test_an_optimizer_whose_slots_cannot_move_trains_with_all_reduce_through_changes(tmp_path):
    # Under all-reduce every worker updates (and holds the slots of) every variable: the state sync brings
    # Adafactor's factored slots to joiners, and nothing has to move between owners.
    args = train_args(tmp_path, "AllReduce", "adafactor") + ["--crash-at", 4, "--crash-rank", 2, "--resize-at",
                                                             "8:3,12:2", "--resize-wait"]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=240, extra_launcher_args=LAUNCHER)
    check_trained_like_one_process(tmp_path, rc, out, err, [3, 2, 2, 3, 3, 2], "adafactor")


def test_an_optimizers_step_state_stays_equal_on_workers_that_own_nothing(tmp_path):
    # Keras's Nadam keeps u_product beside its slots: one scalar for all variables, advanced in every step that
    # updates variables. Under PS rank 0 owns every variable; ranks 1 and 2 update none, and their u_product
    # stayed at 1: the state digest of the first sync then differed between ranks (and before that, Nadam was
    # refused with parameter servers in an elastic job). Now every worker advances it alike and a rebuilt
    # optimizer keeps it: the owner is SIGKILLed, rank 1 takes its variables over with the right bias correction.
    args = train_args(tmp_path, "PS", "nadam") + ["--crash-at", 4, "--crash-rank", 0, "--resize-at", "8:3,12:2",
                                                  "--resize-wait"]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=240, extra_launcher_args=LAUNCHER)
    check_trained_like_one_process(tmp_path, rc, out, err, [3, 2, 2, 3, 3, 2], "nadam")


@pytest.mark.parametrize("strategy", ["written", "Parallax"])  # PSLoadBalancing: the Keras test below
def test_optimizer_slots_move_to_the_new_owners(tmp_path, strategy):
    source = written_strategy(tmp_path) if strategy == "written" else strategy
    args = train_args(tmp_path, source, "momentum") + ["--resize-at", "4:2,8:3,12:2", "--resize-wait"]
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=240, extra_launcher_args=LAUNCHER)
    check_trained_like_one_process(tmp_path, rc, out, err, [3, 2, 2, 3, 3, 2], "momentum")


def test_keras_fit_traces_its_step_again_after_a_change(tmp_path):
    # elastic_fit re-enters fit after each change; fit's train_function was traced for the old plan (and a
    # joiner's by its warm-up, alone): it refused to run (a plan generation behind) until fit traced it again.
    # One epoch of 160 samples is 16 steps of 4 per worker at these sizes (fit runs whole epochs).
    samples = 4 * BATCH * (3 + 2 + 3 + 2)
    args = ["--api", "keras", "--strategy", "PSLoadBalancing", "--optimizer", "momentum", "--samples", samples,
            "--batch-size", BATCH, "--hidden", HIDDEN, "--lr", LR, "--epochs", 1, "--record-dir", tmp_path / "records",
            "--policy-resize-at", "4:2,12:2", "--resize-at", "8:3", "--resize-wait"]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=240, extra_launcher_args=LAUNCHER)
    check_trained_like_one_process(tmp_path, rc, out, err, [3, 2, 2, 3, 3, 2], "momentum", samples)


def test_a_strategy_written_for_3_replicas_refuses_a_shrink_before_it_commits(tmp_path):
    args = train_args(tmp_path, written_strategy(tmp_path, replicas=3)) + ["--resize-at", "4:2"]
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=120, extra_launcher_args=LAUNCHER)
    report = describe(rc, out, err)
    assert rc != 0, report
    assert_every_rank_said(err, 3, "was written for 3 replicas (graph_config.replicas) and the cluster changed to 2 workers", report)
    # Nothing changed: no worker applied a new cluster (the launcher drops the workers after they failed).
    changes = [r for lines in load(tmp_path / "records").values() for r in lines if r["event"] == "change"]
    assert not changes and "3 -> 2 workers" not in out, report


def test_a_strategy_written_for_2_replicas_refuses_a_growth_before_it_is_requested(tmp_path):
    # Before, the growth was requested and committed (the launcher's joiner admitted), and then every worker
    # failed in the strategy's re-build for 3 workers: the cluster had changed under a refused strategy.
    args = train_args(tmp_path, written_strategy(tmp_path, replicas=2, workers=2)) + ["--resize-at", "4:3", "--resize-wait"]
    rc, out, err = run_job(2, MODELS / "elastic_train.py", *args, timeout=120, extra_launcher_args=LAUNCHER)
    report = describe(rc, out, err)
    assert rc != 0, report
    assert_every_rank_said(err, 2, "was written for 2 replicas (graph_config.replicas) and the cluster changed to 3 workers", report)
    changes = [r for lines in load(tmp_path / "records").values() for r in lines if r["event"] == "change"]
    assert not changes and "2 -> 3 workers" not in out, report


def test_a_plain_tf_function_refuses_to_run_a_stale_plan(tmp_path):
    args = train_args(tmp_path, "PSLoadBalancing") + ["--resize-at", "4:2", "--plain-tf-function"]
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=120, extra_launcher_args=LAUNCHER)
    report = describe(rc, out, err)
    assert rc != 0, report
    # The survivors; rank 2 left at the shrink.
    assert_every_rank_said(err, 2, "this step was traced for the strategy as it was before a membership change", report)
    assert "outside a cluster" not in err, report
