"""Worker for tests/test_user_scripts.py: ``kungfu_tf.broadcast_variables`` called
twice in one ``tf.function`` (the model's variables, then the optimizer's), as
Horovod's TF2 examples do, without names.

Every rank starts from its own, rank-seeded weights and momentum slots;
after the function ran, each variable must equal the root's initial value,
computed here with numpy from the root's seed. The same in a
``tf.compat.v1`` graph run by a Session. Then Horovod's custom loop:
``DistributedGradientTape`` and the two broadcasts inside the traced step
when ``first_batch`` is true; afterwards all workers hold identical weights
(consensus). Ends with "checked N results" (N = 8 on every rank).
"""

from __future__ import annotations

import _setup
import keras
from _setup import Checker, np, ops, seed_of, tf

import kungfu_tf

RANK, SIZE = kungfu_tf.rank(), kungfu_tf.size()
ROOT = SIZE - 1


def values(label: str, rank: int, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed_of(label, rank))
    return [rng.normal(size=s).astype(np.float32) for s in shapes]


def model_and_optimizer(label: str) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.set_weights(values(f"{label}/model", RANK, [tuple(w.shape) for w in model.weights]))
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    opt.build(model.trainable_variables)
    for m, v in zip(opt.momentums, values(f"{label}/slots", RANK, [tuple(m.shape) for m in opt.momentums])):
        m.assign(v)
    return model, opt


def in_function(chk: Checker) -> None:
    model, opt = model_and_optimizer("function")

    @tf.function
    def sync():
        kungfu_tf.broadcast_variables(model.variables, root=ROOT)
        kungfu_tf.broadcast_variables(opt.variables, root=ROOT)

    sync()
    sync()  # a second run reuses the same keys
    want = values("function/model", ROOT, [tuple(w.shape) for w in model.weights])
    for i, (w, v) in enumerate(zip(model.weights, want)):
        chk.equal(w.numpy(), v, f"function: model variable {i} is the root's")
    want = values("function/slots", ROOT, [tuple(m.shape) for m in opt.momentums])
    for i, (m, v) in enumerate(zip(opt.momentums, want)):
        chk.equal(m.numpy(), v, f"function: momentum slot {i} is the root's")


def in_v1_graph(chk: Checker) -> None:
    shapes = [(4, 3), (3,)]
    with tf.Graph().as_default():
        model = [tf.compat.v1.get_variable(f"w{i}", initializer=v) for i, v in enumerate(values("v1", RANK, shapes))]
        other = [tf.compat.v1.get_variable("o", initializer=values("v1/other", RANK, [(2,)])[0])]
        first = kungfu_tf.broadcast_variables(model, root=ROOT)
        second = kungfu_tf.broadcast_variables(other, root=ROOT)
        with tf.compat.v1.Session(config=_setup.session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run([first, second])
            got = sess.run(model + other)
    for i, (g, v) in enumerate(zip(got, values("v1", ROOT, shapes) + values("v1/other", ROOT, [(2,)]))):
        chk.equal(g, v, f"v1 graph: variable {i} is the root's")


def horovod_loop(chk: Checker) -> None:
    model, opt = model_and_optimizer("loop")
    rng = np.random.default_rng(seed_of("loop/data", RANK))

    @tf.function
    def training_step(x, y, first_batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        tape = kungfu_tf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:  # Horovod's examples broadcast after the first step
            kungfu_tf.broadcast_variables(model.variables, root=0)
            kungfu_tf.broadcast_variables(opt.variables, root=0)
        return loss

    for s in range(3):
        training_step(rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32), s == 0)
    flat = np.concatenate([v.numpy().astype(np.float64).reshape(-1) for v in model.weights + opt.variables])
    chk.true(bool(ops.consensus(tf.constant(flat), name="agree/loop").numpy()), "loop: workers differ")


def main() -> None:
    chk = Checker(RANK)
    in_function(chk)
    in_v1_graph(chk)
    horovod_loop(chk)
    chk.done()


if __name__ == "__main__":
    main()
