"""Worker for tests/test_user_scripts.py: Horovod's custom training loop with
``kungfu_tf.DistributedGradientTape`` and a plain Keras optimizer.

* direct: ``gradient()`` of a loss whose gradient is ``rank + 1`` per element
  returns the mean over workers, in the structure of the sources (a dict
  here), with ``None`` for a source the loss does not use (numpy reference);
* loop: a model with an ``Embedding`` (its gradient is ``tf.IndexedSlices``,
  all-gathered) and a ``Dense`` head trained for STEPS steps by a
  ``tf.function`` step that wraps its tape, with SGD + momentum; every
  worker has its own B rows of each global batch. Rank 0 trains the same
  model with a plain tape on the whole global batches in this process; the
  weights and optimizer variables must match (rtol 1e-5, atol 1e-6), and a
  consensus requires every worker to hold rank 0's state. Run twice: the
  ``tape = DistributedGradientTape(tape)`` spelling with sparse gradients
  gathered, and ``with DistributedGradientTape(tf.GradientTape()) as tape``
  with ``sparse_as_dense=True``.

Ends with "checked N results" (N in tests/test_user_scripts.py).
"""

from __future__ import annotations

import keras
from _setup import Checker, np, ops, tf

import kungfu_tf

RANK, SIZE = kungfu_tf.rank(), kungfu_tf.size()
STEPS, B = 5, 4
VOCAB, DIM, TOKENS = 12, 3, 3
LR, MOMENTUM = 0.1, 0.9


def direct(chk: Checker) -> None:
    a, unused = tf.Variable(tf.zeros([3])), tf.Variable(1.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(a * float(RANK + 1))
    grads = kungfu_tf.DistributedGradientTape(tape).gradient(loss, {"a": a, "unused": unused})
    chk.true(sorted(grads) == ["a", "unused"] and grads["unused"] is None, f"direct: structure {grads}")
    chk.close(grads["a"].numpy(), np.full(3, np.mean(np.arange(SIZE) + 1.0)), 1e-6, "direct: mean gradient")


def model_with_embedding() -> keras.Model:
    model = keras.Sequential([
        keras.Input((TOKENS,), dtype="int32"),
        keras.layers.Embedding(VOCAB, DIM),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(1),
    ])
    rng = np.random.default_rng(3)  # the same start on every worker
    model.set_weights([(0.5 * rng.normal(size=w.shape)).astype(np.float32) for w in model.weights])
    return model


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    n = STEPS * SIZE * B
    return rng.integers(0, VOCAB, size=(n, TOKENS)).astype(np.int32), rng.normal(size=(n, 1)).astype(np.float32)


def shard(a: np.ndarray) -> np.ndarray:
    return a.reshape(STEPS, SIZE, B, *a.shape[1:])[:, RANK].reshape(STEPS * B, *a.shape[1:])


def train(x: np.ndarray, y: np.ndarray, batch: int, tape_kind: str) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    model = model_with_embedding()
    opt = keras.optimizers.SGD(LR, momentum=MOMENTUM)
    loss_fn = keras.losses.MeanSquaredError()
    sparse_seen: list[bool] = []

    @tf.function
    def step(xb, yb):
        if tape_kind == "with":
            with kungfu_tf.DistributedGradientTape(tf.GradientTape(), sparse_as_dense=True) as tape:
                loss = loss_fn(yb, model(xb, training=True))
        else:
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            if tape_kind == "wrap":
                tape = kungfu_tf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        sparse_seen.append(isinstance(grads[0], tf.IndexedSlices))  # at trace time
        opt.apply_gradients(zip(grads, model.trainable_variables))

    for s in range(STEPS):
        step(x[s * batch : (s + 1) * batch], y[s * batch : (s + 1) * batch])
    model.sparse_seen = sparse_seen
    return model, opt


def loop(chk: Checker, tape_kind: str) -> None:
    x, y = data()
    model, opt = train(shard(x), shard(y), B, tape_kind)
    # Traced twice (the optimizer creates its variables in the first call).
    chk.true(set(model.sparse_seen) == {tape_kind == "wrap"}, f"{tape_kind}: sparse gradient {model.sparse_seen}")
    got = [v.numpy() for v in list(model.weights) + list(opt.variables)]
    flat = np.concatenate([g.astype(np.float64).reshape(-1) for g in got])
    chk.true(bool(ops.consensus(tf.constant(flat), name=f"agree/{tape_kind}").numpy()), f"{tape_kind}: workers differ")
    if RANK == 0:
        ref_model, ref_opt = train(x, y, SIZE * B, "plain")
        want = [v.numpy() for v in list(ref_model.weights) + list(ref_opt.variables)]
        chk.true(len(got) == len(want), f"{tape_kind}: {len(got)} arrays, reference {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            chk.true(np.allclose(g, w, rtol=1e-5, atol=1e-6), f"{tape_kind}: state {i} max diff {np.max(np.abs(g - w))}")


def main() -> None:
    chk = Checker(RANK)
    direct(chk)
    loop(chk, "wrap")
    loop(chk, "with")
    chk.done()


if __name__ == "__main__":
    main()
