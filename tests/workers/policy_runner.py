"""Worker for tests/test_policy.py: the adaptation policy runners with real workers.

Usage: policy_runner.py LOG_DIR

Scenarios, in one job (TF starts once), each checked against numpy or
against values computed here independently of the runner:

* loop: a custom tf.function loop driven by ``PolicyRunner`` (``with
  runner.step()``): three policies run in order in every hook; a batch-size
  change at step 1 shapes step 2's batch (rows counted inside the step) and
  scales the learning rate linearly; a second change right after is refused
  by ``min_dwell_steps``, a tiny one by ``min_relative_change``; an explicit
  learning rate and a topology switch; the step is traced once; the final
  weights equal numpy SGD on the same schedule of global batches; rank 0
  reads the TensorBoard event file back (monitored gns, batch size,
  learning rate, topology index, link rates, cluster size).
* keras: ``model.fit`` with ``PolicyCallback([GNSBatchSizePolicy])`` and a
  stand-in monitor (duck-typed to the GradientMonitor contract) whose GNS
  doubles every 4 steps: the batch doubles at the checks, lr follows "sqrt",
  the monitor's ``local_batch_size`` follows, the train function is traced
  once.
* v1: ``MonitoredTrainingSession`` with ``PolicyHook`` and an
  ``adaptive_batch`` pipeline in the graph: batch change next step, lr
  variable "linear", topology switch.
* topology: ``AdaptiveTopologyPolicy`` behind a policy that writes a
  synthetic throughput (a function of the topology in force): after the
  "contention" it tries the others and keeps STAR on every worker.
* errors: workers asking for different batch sizes, different policy lists,
  a bad request on one rank only, bad values everywhere, missing monitor /
  learning rate: the precise exception on every worker, no hang; the
  cluster keeps working after each.

Ends with "checked N results".
"""

from __future__ import annotations

import glob
import math
import os
import sys

import keras
from _setup import Checker, np, ops, tf

import kungfu_tf
from kungfu_tf.data import adaptive_batch, shard
from kungfu_tf.keras import PolicyCallback
from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.policy import (
    AdaptiveTopologyPolicy,
    BasePolicy,
    GNSBatchSizePolicy,
    PeerPolicyError,
    PolicyDisagreementError,
    PolicyRunner,
)
from kungfu_tf.v1 import PolicyHook

RANK, SIZE = kungfu_tf.rank(), kungfu_tf.size()
FEATURES = 3
chk = Checker(RANK)


def regression_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=n)).astype(np.float32)
    return x, y


def numpy_sgd(x: np.ndarray, y: np.ndarray, local_sizes: list[int], lrs: list[float]) -> np.ndarray:
    """Synchronous SGD on linear regression (mean squared error, no bias), in float64.

    Worker r holds rows r, r+SIZE, ... (kungfu_tf.data.shard); at step k
    every worker takes its next local_sizes[k] rows; the averaged gradient
    is the gradient over the union of those rows.
    """
    w = np.zeros(FEATURES)
    shards = [(x[r::SIZE].astype(np.float64), y[r::SIZE].astype(np.float64)) for r in range(SIZE)]
    offset = 0
    for b, lr in zip(local_sizes, lrs):
        rows_x = np.concatenate([sx[offset : offset + b] for sx, _ in shards])
        rows_y = np.concatenate([sy[offset : offset + b] for _, sy in shards])
        grad = 2 * rows_x.T @ (rows_x @ w - rows_y) / len(rows_y)
        w = w - lr * grad
        offset += b
    return w


class FakeMonitor:
    """Test stand-in for GradientMonitor (contract: values(), local_batch_size, tensors)."""

    def __init__(self, gns_of_call):
        self.local_batch_size = tf.Variable(0, dtype=tf.int64)
        self.tensors = {"gns": tf.Variable(math.nan, dtype=tf.float64)}
        self.calls = 0
        self.gns_of_call = gns_of_call

    def values(self) -> dict:
        gns = self.gns_of_call(self.calls)
        self.calls += 1
        return {"gns": gns, "noise_trace": 4.0 * gns, "grad_sq_norm": 4.0, "grad_variance": math.nan,
                "worker_compute_times": [0.01 * (r + 1) for r in range(SIZE)]}  # fmt: skip


class Recorder(BasePolicy):
    """Appends (name, hook, step) to a shared log: shows the order the policies run in."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def _note(self, hook: str, ctx) -> None:
        self.log.append((self.name, hook, ctx.step))

    def before_train(self, ctx):
        self._note("before_train", ctx)

    def before_step(self, ctx):
        self._note("before_step", ctx)

    def after_step(self, ctx):
        self._note("after_step", ctx)


class Scripted(BasePolicy):
    """Requests from a script: {step: [(function, value), ...]} in after_step."""

    def __init__(self, script: dict, log: list | None = None):
        self.script, self.log = script, log

    def config(self):
        return {}  # the error scenarios give ranks different scripts on purpose

    def after_step(self, ctx):
        if self.log is not None:
            self.log.append(("scripted", "after_step", ctx.step))
        for fn, value in self.script.get(ctx.step, []):
            getattr(ctx, fn)(value)


# --------------------------------------------------------------------------- loop
def scenario_loop(log_dir: str) -> None:
    b0 = 2 * SIZE  # global; local 2
    x, y = regression_data(200, seed=1)
    order: list = []
    lr = tf.Variable(0.05, dtype=tf.float32)
    monitor = FakeMonitor(lambda call: 10.0 * (call + 1))
    script = {
        1: [("set_batch_size", 2 * b0)],                 # applied: step 2 has local 4, lr x2
        2: [("set_batch_size", 4 * b0)],                 # refused: 1 step since the change (dwell 3)
        5: [("set_batch_size", 2 * b0 + SIZE)],          # refused: +25% < 30%
        6: [("set_learning_rate", 0.02), ("set_topology", "star")],
    }  # fmt: skip
    runner = PolicyRunner(
        [Recorder("first", order), Scripted(script, order), Recorder("last", order)],
        batch_size=b0, learning_rate=lr, monitor=monitor, lr_rule="linear",
        min_dwell_steps=3, min_relative_change=0.3, log_dir=log_dir, verbose=False,
    )  # fmt: skip
    w = tf.Variable(tf.zeros([FEATURES], tf.float64))
    ds = adaptive_batch(shard(tf.data.Dataset.from_tensor_slices((x, y))), runner.local_batch_size)

    @tf.function
    def train_step(iterator):
        bx, by = next(iterator)
        bx, by = tf.cast(bx, tf.float64), tf.cast(by, tf.float64)
        err = tf.linalg.matvec(bx, w) - by
        grad = 2 * tf.linalg.matvec(bx, err, transpose_a=True) / tf.cast(tf.size(by), tf.float64)
        grad = ops.all_reduce(grad, op="mean", name="loop_grad")
        w.assign_sub(tf.cast(lr, tf.float64) * grad)
        return tf.shape(bx)[0]

    steps = 9
    rows, lrs, tops = [], [], []
    it = iter(ds)
    with runner.training():
        for _ in range(steps):
            with runner.step():
                lrs.append(float(lr.numpy()))
                rows.append(int(train_step(it)))
            tops.append(ops.topology().numpy().decode())
    want_rows = [2, 2, 4, 4, 4, 4, 4, 4, 4]
    chk.equal(rows, want_rows, "loop: rows per step (change after step 1 applies at step 2; later ones refused)")
    f32 = lambda v: float(np.float32(v))
    want_lrs = [f32(0.05)] * 2 + [f32(f32(0.05) * 2)] * 5 + [f32(0.02)] * 2
    chk.close(lrs, want_lrs, 1e-7, "loop: learning rate per step (linear rule, then explicit)")
    chk.equal(train_step.experimental_get_tracing_count(), 1, "loop: the step is traced once")
    chk.equal(tops[-1], "STAR", "loop: topology switched")
    chk.equal(int(monitor.local_batch_size.numpy()), 4, "loop: monitor.local_batch_size follows")
    refused = [d for d in runner.history if d.refused]
    chk.equal(len(refused), 2, f"loop: two refused requests: {runner.history}")
    chk.true("min_dwell_steps=3" in refused[0].refused and "min_relative_change=0.3" in refused[1].refused,
             f"loop: refusal reasons: {refused}")  # fmt: skip
    want_order = [("first", "before_train", 0), ("last", "before_train", 0)]
    for s in range(steps):
        want_order += [("first", "before_step", s), ("last", "before_step", s)]
        want_order += [("first", "after_step", s), ("scripted", "after_step", s), ("last", "after_step", s)]
    chk.equal(str(order), str(want_order), "loop: policies run in the given order")
    ref = numpy_sgd(x, y, [r for r in want_rows], [float(v) for v in want_lrs])
    chk.close(w.numpy(), ref, 1e-6, "loop: weights equal numpy SGD on the same batch/lr schedule")
    same = ops.consensus(tf.constant(w.numpy()), name="loop_same").numpy()
    chk.true(bool(same), "loop: identical weights on every worker")
    check_tensorboard(log_dir, steps)


def check_tensorboard(log_dir: str, steps: int) -> None:
    ops.barrier(name="tb_written")
    files = glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))
    chk.equal(len(files), 1, f"tensorboard: one event file (rank 0 only) in {log_dir}: {files}")
    if RANK != 0:
        return
    seen: dict[str, dict[int, object]] = {}
    for event in tf.compat.v1.train.summary_iterator(files[0]):
        for v in event.summary.value:
            seen.setdefault(v.tag, {})[event.step] = tf.make_ndarray(v.tensor)
    gns = seen["policy/gns"]
    chk.close([float(gns[s]) for s in range(steps)], [10.0 * (s + 1) for s in range(steps)], 1e-4,
              "tensorboard: gns per step")  # fmt: skip
    chk.equal([int(seen["policy/batch_size"][s]) for s in range(steps)], [2 * SIZE] * 2 + [4 * SIZE] * 7,
              "tensorboard: batch_size per step")  # fmt: skip
    chk.close(float(seen["policy/learning_rate"][steps - 1]), 0.02, 1e-7, "tensorboard: learning_rate")
    chk.equal(int(seen["policy/topology"][steps - 1]), 0, "tensorboard: topology index (STAR = 0)")
    chk.equal(int(seen["policy/cluster_size"][0]), SIZE, "tensorboard: cluster_size")
    chk.true(all(f"policy/link_rates/{r}" in seen for r in range(SIZE)), f"tensorboard: link rates: {sorted(seen)}")
    chk.true(all(float(t) > 0 for t in seen["policy/throughput"].values()), "tensorboard: throughput > 0")
    chk.true("policy/grad_variance" not in seen, "tensorboard: NaN values are skipped")
    decisions = [t.item().decode() for t in seen["policy/decisions"].values()]
    chk.true(any("batch_size" in d for d in decisions), f"tensorboard: decisions logged: {decisions}")


# --------------------------------------------------------------------------- keras
class RowCounting(keras.Sequential):
    """Records the rows of each batch inside the traced train step."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.rows = tf.Variable(0, dtype=tf.int32, trainable=False)
        self.traces = 0  # Python runs this body only while tracing

    def train_step(self, data):
        self.traces += 1
        self.rows.assign(tf.shape(data[0])[0])
        return super().train_step(data)


class RowLog(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rows, self.lrs = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))  # what this step runs with

    def on_train_batch_end(self, batch, logs=None):
        self.rows.append(int(self.model.rows.numpy()))


def scenario_keras() -> None:
    x, y = regression_data(48 * SIZE, seed=2)
    keras.utils.set_random_seed(3)
    model = RowCounting([keras.Input((FEATURES,)), keras.layers.Dense(1, use_bias=False)])
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.01), name="keras_policy")
    # Doubles every 4 steps (by the step just run: the runner reads the monitor only at the checks).
    monitor = FakeMonitor(lambda call: 100.0 * 2 ** (cb.runner.hook_step // 4))
    model.compile(optimizer=opt, loss="mse")
    gns = GNSBatchSizePolicy(max_batch_size=8 * SIZE, threshold=1.5, every=2)
    # monitor= (not opt.kungfu_monitor): the optimizer would feed a kungfu_monitor its gradients.
    cb = PolicyCallback([gns], batch_size=SIZE, lr_rule="sqrt", monitor=monitor, verbose=False)
    ds = adaptive_batch(shard(tf.data.Dataset.from_tensor_slices((x, y[:, None]))), cb.local_batch_size)
    rows = RowLog()
    model.fit(ds, epochs=1, steps_per_epoch=10, verbose=0, shuffle=False, callbacks=[cb, rows])
    # GNS per step: 100,100,100,100,200,...; checks after steps 1,3,5,7,9 (every 2):
    # step 5 sees 200 = x2 of the reference -> local 2 from step 6; step 9: 400 -> local 4 from step 10.
    chk.equal(rows.rows, [1] * 6 + [2] * 4, f"keras: rows per step, history {cb.runner.history}")
    lr2 = 0.01 * math.sqrt(2.0)
    chk.close(rows.lrs, [0.01] * 6 + [lr2] * 4, 1e-6, "keras: lr follows sqrt")
    chk.equal(cb.runner.batch_size, 4 * SIZE, "keras: final global batch (x2 at step 9)")
    chk.equal(int(monitor.local_batch_size.numpy()), 4, "keras: monitor.local_batch_size")
    chk.equal(model.traces, 1, "keras: train step traced once")


# --------------------------------------------------------------------------- v1
def scenario_v1() -> None:
    x, y = regression_data(40 * SIZE, seed=4)
    with tf.Graph().as_default():
        lr = tf.Variable(0.1, dtype=tf.float32, name="lr")
        monitor = GraphMonitor()
        hook = PolicyHook([Scripted({1: [("set_batch_size", 3 * SIZE)], 3: [("set_topology", "BINARY_TREE")]})],
                          batch_size=SIZE, learning_rate=lr, lr_rule="linear", monitor=monitor,
                          verbose=False)  # fmt: skip
        # kungfu_tf.data.shard reads the cardinality eagerly (not in a v1 graph): tf.data's shard, equal lengths.
        ds = adaptive_batch(tf.data.Dataset.from_tensor_slices((x, y)).shard(SIZE, RANK), hook.local_batch_size)
        iterator = tf.compat.v1.data.make_initializable_iterator(ds)
        bx, by = iterator.get_next()
        w = tf.Variable(tf.zeros([FEATURES]), name="w")
        loss = tf.reduce_mean(tf.square(tf.linalg.matvec(bx, w) - by))
        grad = ops.all_reduce(tf.gradients(loss, [w])[0], op="mean", name="v1_grad")
        train = w.assign_sub(lr * grad)
        rows_op, lr_read, mon_read = tf.shape(bx)[0], lr.read_value(), monitor.local_batch_size.read_value()
        scaffold = tf.compat.v1.train.Scaffold(local_init_op=tf.group(tf.compat.v1.local_variables_initializer(),
                                                                      iterator.initializer))  # fmt: skip
        rows, lrs, mon = [], [], []
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], scaffold=scaffold, config=_session_config()) as sess:
            for _ in range(5):
                r, _, lr_now, m = sess.run([rows_op, train, lr_read, mon_read])
                rows.append(int(r)), lrs.append(float(lr_now)), mon.append(int(m))
    chk.equal(rows, [1, 1, 3, 3, 3], "v1: rows per step")
    chk.close(lrs, [0.1, 0.1, 0.3, 0.3, 0.3], 1e-6, "v1: lr follows linear")
    chk.equal(ops.topology().numpy().decode(), "BINARY_TREE", "v1: topology switched")
    chk.equal(mon, [1, 1, 3, 3, 3], "v1: monitor.local_batch_size follows")
    chk.equal(hook.runner.context.metrics.get("gns"), 7.5, "v1: monitor tensors read into metrics")


class GraphMonitor:
    """Test stand-in for a GradientMonitor built in a v1 graph (contract: tensors, local_batch_size)."""

    def __init__(self):
        self.local_batch_size = tf.Variable(0, dtype=tf.int64, name="monitor_local_batch_size")
        self.tensors = {"gns": tf.Variable(7.5, dtype=tf.float64, name="monitor_gns")}


def _session_config():
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)


# --------------------------------------------------------------------------- topology
class SyntheticThroughput(BasePolicy):
    """Throughput as a function of the topology: contention from step 8 slows all but STAR."""

    def after_step(self, ctx):
        contended = ctx.step >= 8
        ctx.metrics["throughput"] = {"STAR": 90.0}.get(ctx.topology, 50.0) if contended else 100.0


def scenario_topology() -> None:
    ops.set_topology("RING", key="topology_start")
    policy = AdaptiveTopologyPolicy(candidates=("RING", "BINARY_TREE", "STAR"), drop=0.2, window=4,
                                    trial_steps=2, settle_steps=1)  # fmt: skip
    runner = PolicyRunner([SyntheticThroughput(), policy], verbose=False)
    with runner.training():
        for _ in range(24):
            with runner.step():
                ops.all_reduce(tf.ones([4]), name="topology_step")
    switches = [d.new for d in runner.history if d.name == "topology"]
    # windows 0-3, 4-7 at 100; 8-11 at 50 -> trial: BINARY_TREE, STAR, RING; keep STAR.
    chk.equal(switches, ["BINARY_TREE", "STAR", "RING", "STAR"], f"topology: switches {runner.history}")
    chk.equal(ops.topology().numpy().decode(), "STAR", "topology: STAR in force")
    chk.close(policy.best, 90.0, 1e-9, "topology: new reference throughput")


# --------------------------------------------------------------------------- errors
def expect(exc_type, fragments, fn, what):
    try:
        fn()
    except exc_type as e:
        missing = [f for f in fragments if f not in str(e)]
        chk.true(not missing, f"{what}: message lacks {missing}: {e}")
        return
    except Exception as e:  # noqa: BLE001
        chk.fail(what, f"raised {type(e).__name__}: {e}")
    chk.fail(what, f"no {exc_type.__name__} raised")


def run_loop(runner, steps=3):
    """Runs the runner's hooks around ``steps`` empty steps (the policies are what is tested)."""
    with runner.training():
        for _ in range(steps):
            with runner.step():
                taken = runner.steps_done + 1
    assert taken == runner.steps_done == steps, f"run_loop ran {runner.steps_done} steps, not {steps}"


def scenario_tensorboard_errors(log_dir: str) -> None:
    """A log_dir rank 0 cannot write, and a write that fails there: every worker raises, naming it."""
    not_a_dir = os.path.join(os.path.dirname(log_dir), "tb_not_a_dir")
    if RANK == 0:
        with open(not_a_dir, "w") as f:
            f.write("a file, not a directory")
    ops.barrier(name="tb_file_made")
    bad = PolicyRunner([], log_dir=os.path.join(not_a_dir, "tb") if RANK == 0 else None, verbose=False)
    fragments = ["log_dir=", "tb_not_a_dir", "not a directory"]
    if RANK == 0:
        expect(OSError, fragments, bad.before_train, "unwritable log_dir")
    else:
        expect(PeerPolicyError, ["rank 0", *fragments], bad.before_train, "unwritable log_dir on rank 0")

    failing = PolicyRunner([], log_dir=os.path.join(os.path.dirname(log_dir), "tb_failing"), log_every=2, verbose=False)
    failing.before_train()
    if failing._log.writes:  # rank 0: the disk fills up at the first logged step

        def full(step, values):
            raise OSError(28, "No space left on device")

        failing._log._summary.scalars = full

    trained = []

    def steps():
        for i in range(3):
            with failing.step():
                trained.append(i)  # the step's work; the failure comes after it, in the runner

    fragments = ["log_dir=", "tb_failing", "No space left on device"]
    if RANK == 0:
        expect(OSError, fragments, steps, "TensorBoard write fails")
    else:
        expect(PeerPolicyError, ["rank 0", *fragments], steps, "TensorBoard write fails on rank 0")
    # The write failed at the end of a step whose work had run, not before any step.
    assert trained and trained == list(range(len(trained))), trained


def scenario_errors(log_dir: str) -> None:
    base = 2 * SIZE
    differ = PolicyRunner([Scripted({0: [("set_batch_size", base * (RANK + 1))]})], batch_size=base, verbose=False)
    expect(PolicyDisagreementError, ["batch_size", "rank 0 ", "rank 1 ", "nothing was changed"], lambda: run_loop(differ),
           "disagreeing batch sizes")  # fmt: skip
    chk.equal((differ.batch_size, int(differ.local_batch_size.numpy())), (base, 2), "disagreement: nothing changed")

    policies = [Scripted({})] if RANK == 0 else [Scripted({}), Recorder("extra", [])]
    expect(PolicyDisagreementError, ["policies", "Recorder"], lambda: PolicyRunner(policies).before_train(),
           "different policy lists")  # fmt: skip

    window = AdaptiveTopologyPolicy(window=4 + RANK)  # same class, different parameters
    expect(PolicyDisagreementError, ["policies[0] AdaptiveTopologyPolicy.window: rank 0 4, rank 1 5"],
           lambda: PolicyRunner([window]).before_train(), "different policy parameters")  # fmt: skip

    scenario_tensorboard_errors(log_dir)

    zero_on_1 = PolicyRunner([Scripted({1: [("set_batch_size", 0)] if RANK == 1 else []})], batch_size=base)
    if RANK == 1:
        expect(ValueError, ["batch_size must be positive, got 0"], lambda: run_loop(zero_on_1), "set_batch_size(0)")
    else:
        expect(PeerPolicyError, ["rank 1", "Scripted.after_step", "batch_size must be positive, got 0"],
               lambda: run_loop(zero_on_1), "set_batch_size(0) on a peer")  # fmt: skip

    half = PolicyRunner([Scripted({0: [("set_batch_size", 3.5)]})], batch_size=base)
    expect(TypeError, ["batch_size must be an int, got 3.5"], lambda: run_loop(half), "set_batch_size(3.5)")

    odd = PolicyRunner([Scripted({0: [("set_batch_size", 2 * SIZE + 1)]})], batch_size=base)
    expect(ValueError, ["not a multiple of the cluster size"], lambda: run_loop(odd), "batch not divisible")

    torus = PolicyRunner([Scripted({0: [("set_topology", "TORUS")] if RANK == 0 else []})])
    if RANK == 0:
        expect(ValueError, ["unknown topology 'TORUS'"], lambda: run_loop(torus), "unknown topology")
    else:
        expect(PeerPolicyError, ["rank 0", "unknown topology 'TORUS'"], lambda: run_loop(torus), "unknown topology on a peer")

    expect(ValueError, ["GNSBatchSizePolicy needs gradient statistics", "GradientMonitor"],
           lambda: PolicyRunner([GNSBatchSizePolicy(64)], batch_size=base).before_train(), "policy without monitor")  # fmt: skip
    expect(ValueError, ["lr_rule='linear' needs a learning rate"],
           lambda: PolicyRunner([], batch_size=base, lr_rule="linear").before_train(), "lr_rule without optimizer")  # fmt: skip
    no_lr = PolicyRunner([Scripted({0: [("set_learning_rate", 0.1)]})])
    expect(ValueError, ["set_learning_rate: this runner has no learning rate"], lambda: run_loop(no_lr),
           "set_learning_rate without optimizer")  # fmt: skip
    expect(ValueError, ["lr_rule must be one of"], lambda: PolicyRunner([], lr_rule="cubic"), "unknown lr_rule")
    # The cluster still works after every error above.
    total = ops.all_reduce(tf.constant([1.0]), name="after_errors").numpy()
    chk.equal(total, [float(SIZE)], "errors: collectives still work")


def main() -> None:
    log_dir = sys.argv[1]
    scenario_errors(log_dir)
    scenario_loop(log_dir)
    scenario_keras()
    scenario_v1()
    scenario_topology()
    chk.done()


if __name__ == "__main__":
    main()
