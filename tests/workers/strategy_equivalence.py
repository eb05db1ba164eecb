"""Worker for tests/test_strategy_training.py: every builder trains like one process.

Usage: strategy_equivalence.py NP

For every strategy builder × every model of models/ (small configurations) ×
API, N workers train STEPS steps with SGD + momentum wrapped in
``SynchronousSGDOptimizer(strategy=builder)``, each on its own disjoint
B-row shard of every global batch, from identical weights. Rank 0 also
trains the same model *in this process* with a plain optimizer on the whole
N·B-row batches (no collectives); the weights must agree within RTOL/ATOL
(float32, the only difference being summation order), and a consensus
requires every worker to hold exactly rank 0's weights.

APIs: a tf.function loop calling apply_gradients (every model), Keras
``Model.fit`` (the MLP and NCF), and tf.compat.v1 + MonitoredTrainingSession
(a hand-written embedding + MLP graph: Keras 3 models do not build in v1
graphs). Builders get small partition thresholds so that PartitionedPS,
UnevenPartitionedPS, PartitionedAR and Parallax really cut variables here.

ResNet's batch normalisation normalises each worker's batch by its own
statistics (as in Horovod without SyncBatchNorm), so its reference is one
process averaging the gradients of the N shards — what data parallelism
computes — rather than one process on the union.

Also here: slots of PS variables exist only on their owners; a bf16/fp16 run
changes every variable as the reference does, within a relative bound on the
change (not on the weights, which barely move in two steps); error feedback keeps the
accumulated rounding error of a compressed all-reduce bounded where plain
bf16 grows it every step.
"""

from __future__ import annotations

import os
import sys
import time

import _setup
import keras
from _setup import Checker, np, ops, tf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "models"))
from bert_small import build_bert_small
from comm_heavy_mlp import build_comm_heavy_mlp
from mlp import build_mlp
from ncf import build_ncf
from resnet import build_resnet

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy import builders

STEPS, B = 2, 4
LR, MOMENTUM = 0.05, 0.9
RTOL, ATOL = 1e-4, 1e-5
# The change of each variable (w_after - w_before) relative to the reference
# change (L2 norms): each averaged gradient element carries at most about
# two unit roundoffs (the share's cast, the sum of shares: 2^-8 bf16, 2^-11
# fp16), the change is a momentum-weighted sum of two steps' gradients, and
# the second gradient is taken at slightly different weights. Measured at
# np=2: at most 3.4e-3 (bf16) and 3.5e-4 (fp16), against bounds of 1.2e-2
# and 1.5e-3; the "change error" lines the worker prints show them.
COMPRESSED_CHANGE_RTOL = {"bf16": 3 * 2.0**-8, "fp16": 3 * 2.0**-11}
SMALL = 64  # partition threshold (bytes): every non-trivial variable is cut


def builder_list() -> list[tuple[str, builders.StrategyBuilder]]:
    return [
        ("AllReduce", builders.AllReduce(chunk_size=2)),
        ("PS", builders.PS(owner=_setup.env_size() - 1)),
        ("PSLoadBalancing", builders.PSLoadBalancing()),
        ("PartitionedPS", builders.PartitionedPS(min_partition_bytes=SMALL)),
        ("UnevenPartitionedPS", builders.UnevenPartitionedPS(min_partition_bytes=SMALL)),
        ("PartitionedAR", builders.PartitionedAR(min_partition_bytes=SMALL, topology="RING")),
        ("Parallax", builders.Parallax(chunk_size=3, min_partition_bytes=SMALL)),
    ]


def _dense(n: int, features: int, classes: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, features)).astype(np.float32), rng.integers(0, classes, n).astype(np.int32)


def _tokens(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 32, (n, 6)).astype(np.int32), rng.integers(0, 2, n).astype(np.int32)


def _ncf(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = [rng.integers(0, 40, n).astype(np.int32), rng.integers(0, 30, n).astype(np.int32)]
    return x, rng.integers(0, 2, n).astype(np.float32)


def _images(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 8, 8, 3)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def _logits():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


# name: (build, loss, data(n, seed))
MODELS = {
    "mlp": (lambda: build_mlp(8, 3, hidden=(16,), seed=1), _logits, lambda n, s: _dense(n, 8, 3, s)),
    "comm-heavy-mlp": (
        lambda: build_comm_heavy_mlp(input_dim=12, hidden=(24, 16), num_classes=10),
        _logits,
        lambda n, s: _dense(n, 12, 10, s),
    ),
    "bert-small": (
        lambda: build_bert_small(vocab_size=32, seq_len=6, d_model=8, num_heads=2, num_layers=1, dropout=0.0),
        _logits,
        _tokens,
    ),
    "ncf": (lambda: build_ncf(40, 30, gmf_dim=4, mlp_dims=(8, 4)), keras.losses.BinaryCrossentropy, _ncf),
    "resnet": (lambda: build_resnet(depth=8, width=4, input_shape=(8, 8, 3)), _logits, _images),
}
KERAS_FIT_MODELS = ("mlp", "ncf")


def _take(x, rows):
    return [a[rows] for a in x] if isinstance(x, list) else x[rows]


def shard(x, rank: int, size: int):
    """This worker's rows: B of every global batch of size*B."""
    n = STEPS * size * B
    rows = np.arange(n).reshape(STEPS, size, B)[:, rank].reshape(-1)
    return _take(x, rows)


def fresh_model(name: str) -> keras.Model:
    # Keras names layers by a global counter, and rank 0 builds extra
    # (reference) models: start the counters afresh so that every worker's
    # variables have the same names, as they would in a real job.
    keras.backend.clear_session()
    keras.utils.set_random_seed(5)  # identical initial weights everywhere
    return MODELS[name][0]()


def close(chk: Checker, got: list, want: list, what: str, atol: float = ATOL, rtol: float = RTOL) -> None:
    chk.true(len(got) == len(want), f"{what}: {len(got)} arrays, expected {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape or not np.allclose(g, w, rtol=rtol, atol=atol):
            err = np.max(np.abs(g - w)) if g.shape == w.shape else f"shape {g.shape} vs {w.shape}"
            chk.fail(what, f"array {i}: max abs difference {err}")
    chk.count += 1


def agree(chk: Checker, weights: list, what: str) -> None:
    flat = np.concatenate([np.asarray(w, np.float64).reshape(-1) for w in weights])
    chk.true(bool(ops.consensus(tf.constant(flat), name=f"agree/{what}").numpy()), f"{what}: workers differ")


def train_function(name: str, opt, x, y, batch: int, shards: int = 1) -> keras.Model:
    """A tf.function loop; with ``shards`` > 1, each step averages the gradients of that many row blocks."""
    model = fresh_model(name)
    loss_fn = MODELS[name][1]()

    def grads_of(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return tape.gradient(loss, model.trainable_variables)

    @tf.function
    def step(xb, yb):
        if shards == 1:
            grads = grads_of(xb, yb)
        else:
            parts = [grads_of(_take(xb, slice(i * B, (i + 1) * B)), yb[i * B : (i + 1) * B]) for i in range(shards)]
            grads = [tf.add_n([tf.convert_to_tensor(p[j]) for p in parts]) / shards for j in range(len(parts[0]))]
        opt.apply_gradients(zip(grads, model.trainable_variables))

    for s in range(STEPS):
        rows = slice(s * batch, (s + 1) * batch)
        step(_take(x, rows), y[rows])
    return model


def train_fit(name: str, opt, x, y, batch: int) -> keras.Model:
    model = fresh_model(name)
    model.compile(optimizer=opt, loss=MODELS[name][1](), jit_compile=False)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return model


def sgd():
    return keras.optimizers.SGD(LR, momentum=MOMENTUM)


def run_models(chk: Checker, rank: int, size: int) -> None:
    for model_name in MODELS:
        x, y = MODELS[model_name][2](STEPS * size * B, 9)
        xs, ys = shard(x, rank, size), shard(y, rank, size)
        apis = ["function"] + (["keras"] if model_name in KERAS_FIT_MODELS else [])
        for api in apis:
            train = train_function if api == "function" else train_fit
            reference: list | None = None
            if rank == 0:
                # ResNet: per-worker batch statistics (see the module docstring).
                if model_name == "resnet":
                    ref = train_function(model_name, sgd(), x, y, size * B, shards=size)
                else:
                    ref = train(model_name, sgd(), x, y, size * B)
                reference = [v.numpy() for v in ref.trainable_variables]
            for builder_name, builder in builder_list():
                what = f"{model_name}/{api}/{builder_name}"
                opt = SynchronousSGDOptimizer(sgd(), strategy=builder, name=f"s/{what}")
                model = train(model_name, opt, xs, ys, B)
                got = [v.numpy() for v in model.trainable_variables]
                agree(chk, got, what)
                if rank == 0:
                    close(chk, got, reference, what)
                check_owner_slots(chk, rank, opt, model, what)
                print(f"ran {what}", flush=True)


def check_owner_slots(chk: Checker, rank: int, opt, model: keras.Model, what: str) -> None:
    """Momentum slots exist for exactly the variables (or shards) this rank updates."""
    plan = opt._kungfu_plan
    owned = {id(t) for t in plan.targets}
    known = {id(v) for v in opt._trainable_variables}
    chk.true(owned == known, f"{what}: optimizer built on {len(known)} variables, plan updates {len(owned)}")
    ps_nodes = [n for n in plan.strategy.node_config if n.WhichOneof("synchronizer") == "ps"]
    for v in model.trainable_variables:
        node = next((n for n in ps_nodes if n.var_name == v.path), None)
        if node is not None:
            chk.true((id(v) in known) == (node.ps.owner == rank), f"{what}: slot of {v.path} on rank {rank}")
    chk.count += 1


def run_v1(chk: Checker, rank: int, size: int) -> None:
    """A v1 graph: embedding lookup (sparse gradient) + dense layer, MonitoredTrainingSession."""
    vocab, dim, tokens = 24, 4, 3
    rng = np.random.default_rng(21)
    ids = rng.integers(0, vocab, (STEPS * size * B, tokens)).astype(np.int32)
    y = rng.normal(size=(STEPS * size * B, 2)).astype(np.float32)
    init = [rng.normal(size=s).astype(np.float32) for s in [(vocab, dim), (dim, 2), (2,)]]

    def train(strategy, xs, ys, batch) -> list[np.ndarray]:
        with tf.Graph().as_default():
            xp = tf.compat.v1.placeholder(tf.int32, [None, tokens])
            yp = tf.compat.v1.placeholder(tf.float32, [None, 2])
            emb, w, b = [tf.compat.v1.get_variable(n, initializer=tf.constant(v)) for n, v in zip("ewb", init)]
            h = tf.reduce_mean(tf.nn.embedding_lookup(emb, xp), axis=1)
            loss = tf.reduce_mean(tf.square(tf.matmul(h, w) + b - yp))
            opt = tf.compat.v1.train.MomentumOptimizer(LR, MOMENTUM)
            if strategy is not None:
                opt = SynchronousSGDOptimizer(opt, strategy=strategy, name=f"v1_{type(strategy).__name__}")
            step = tf.compat.v1.train.get_or_create_global_step()
            train_op = opt.minimize(loss, global_step=step)
            with tf.compat.v1.train.MonitoredTrainingSession(config=_setup.session_config()) as sess:
                for s in range(STEPS):
                    rows = slice(s * batch, (s + 1) * batch)
                    sess.run(train_op, {xp: xs[rows], yp: ys[rows]})
                out = sess.run([emb, w, b, step])
        chk.true(int(out[-1]) == STEPS, f"v1: global step {out[-1]}, expected {STEPS}")
        return out[:-1]

    reference = train(None, ids, y, size * B) if rank == 0 else None
    for builder_name, builder in builder_list():
        what = f"v1/{builder_name}"
        got = train(builder, shard(ids, rank, size), shard(y, rank, size), B)
        agree(chk, got, what)
        if rank == 0:
            close(chk, got, reference, what)
        print(f"ran {what}", flush=True)


def change_errors(got: list, reference: list, initial: list) -> list[float]:
    """Per variable: |change - reference change| / |reference change| (L2 norms over the variable)."""
    out = []
    for g, r, w0 in zip(got, reference, initial):
        want = np.asarray(r, np.float64) - np.asarray(w0, np.float64)
        diff = (np.asarray(g, np.float64) - np.asarray(w0, np.float64)) - want
        out.append(float(np.linalg.norm(diff) / np.linalg.norm(want)))
    return out


def run_compressed(chk: Checker, rank: int, size: int) -> None:
    """Compressed training changes the weights as the reference does, within the wire dtype's rounding.

    The weights move by about 1e-2 in two steps, so a bound on the weights
    themselves says little; the bound is on the change w_after - w_before
    relative to the reference's change, per variable (COMPRESSED_CHANGE_RTOL).
    Error feedback bounds the accumulated rounding error.
    """
    x, y = MODELS["mlp"][2](STEPS * size * B, 9)
    initial = [v.numpy() for v in fresh_model("mlp").trainable_variables]
    reference = [v.numpy() for v in train_function("mlp", sgd(), x, y, size * B).trainable_variables]
    for compressor in ("bf16", "fp16", "bf16-ef"):
        opt = SynchronousSGDOptimizer(sgd(), strategy=builders.AllReduce(compressor=compressor), name=compressor)
        got = [v.numpy() for v in train_function("mlp", opt, shard(x, rank, size), shard(y, rank, size), B).trainable_variables]
        errors = change_errors(got, reference, initial)
        bound = COMPRESSED_CHANGE_RTOL[compressor.split("-")[0]]
        largest = max(float(np.max(np.abs(r - w0))) for r, w0 in zip(reference, initial))
        shown = [f"{e:.2e}" for e in errors]
        print(f"compressed/{compressor}: change error per variable {shown}, largest change {largest:.2e}", flush=True)
        chk.true(max(errors) <= bound, f"compressed/{compressor}: relative change errors {errors} > {bound}")
        print(f"ran compressed/{compressor}", flush=True)

    # A constant gradient not representable in bf16 (1 + 2^-9 rounds to 1),
    # sent by rank 0 only (the others send zeros, so the all-reduce's own
    # bf16 additions are exact and only the encoding error remains), T steps
    # of plain SGD (lr 1): without feedback every step loses 2^-9/size, with
    # feedback the loss stays below one rounding step (2^-7/size).
    steps = 40
    g = np.full([16], (1.0 + 2.0**-9) if rank == 0 else 0.0, np.float32)
    exact = -steps * (1.0 + 2.0**-9) / size
    errors = {}
    for compressor in ("bf16", "bf16-ef"):
        v = keras.Variable(np.zeros([16], np.float32), name="ef_probe")
        opt = SynchronousSGDOptimizer(keras.optimizers.SGD(1.0), strategy=builders.AllReduce(compressor=compressor), name=f"ef/{compressor}")

        def make_step(opt, v):
            @tf.function
            def probe_step():
                opt.apply_gradients([(tf.constant(g), v)])

            return probe_step

        run_step = make_step(opt, v)
        for _ in range(steps):
            run_step()
        errors[compressor] = float(np.max(np.abs(v.numpy() - exact)))
    one_step = 2.0**-7 / size  # bf16 spacing near 1.0, averaged: the most one rounding can lose
    chk.true(errors["bf16-ef"] <= one_step, f"error feedback: accumulated error {errors['bf16-ef']} > {one_step}")
    chk.true(errors["bf16"] > 4 * errors["bf16-ef"], f"error feedback did not reduce the error: {errors}")
    print(f"accumulated error after {steps} steps: {errors}", flush=True)
    print("ran error-feedback", flush=True)


def main() -> None:
    size = int(sys.argv[1])
    parts = sys.argv[2].split(",") if len(sys.argv) > 2 else ["models", "v1", "compressed"]
    if "quick" in parts:
        # np = 4 in the test suite: the models with sparse and partitioned
        # variables, tf.function only (the full matrix runs at np = 2).
        global MODELS, KERAS_FIT_MODELS
        MODELS = {k: MODELS[k] for k in ("mlp", "bert-small", "ncf")}
        KERAS_FIT_MODELS = ()
        parts = ["models" if p == "quick" else p for p in parts]
    rank = _setup.env_rank()
    chk = Checker(rank)
    t0 = time.monotonic()
    for label in parts:
        {"models": run_models, "v1": run_v1, "compressed": run_compressed}[label](chk, rank, size)
        print(f"{label} done at {time.monotonic() - t0:.1f}s, {chk.count} checks", flush=True)
    chk.done()


if __name__ == "__main__":
    main()
