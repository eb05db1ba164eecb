"""Single-process tests of the model zoo in models/: builders, data, registry.

No launcher and no network: every model is built in a small configuration,
checked for output shapes, and trained for a few SGD steps on its own
synthetic data to show that the loss goes down (i.e. the data are learnable
and the gradients flow). Also checked: the exact size of the
communication-heavy MLP, sparse (IndexedSlices) embedding gradients, the
CIFAR-10 binary reader on files written here, and offline digits.
"""

from __future__ import annotations

import itertools
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

# models/ is a directory of scripts, not a package (train.py imports its
# siblings by bare name), so put it on the path the same way.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

from bert_small import build_bert_small, synthetic_tokens
from cifar10 import RECORD_BYTES, load_cifar10_batches, synthetic_cifar10
from comm_heavy_mlp import build_comm_heavy_mlp, synthetic_comm_heavy_data
from digits import build_digits_mlp, load_digits_split
from mlp import build_mlp
from ncf import build_ncf, synthetic_interactions
from registry import MODELS, get_model_spec
from resnet import build_resnet
from synthetic_data import teacher_dataset


@pytest.fixture(autouse=True)
def _seeded() -> None:
    keras.utils.set_random_seed(0)


def _xent() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


# name -> (small model builder, (inputs, labels), loss, expected output shape, SGD learning rate)
SmallCase = tuple[Callable[[], keras.Model], tuple, keras.losses.Loss, tuple[int, ...], float]


def _small_case(name: str) -> SmallCase:
    if name == "teacher-mlp":
        return lambda: build_mlp(16, 4, hidden=(32,)), teacher_dataset(256, 16, 4, seed=0), _xent(), (256, 4), 0.1
    if name == "digits-mlp":
        x, y, _, _ = load_digits_split(seed=0)
        return lambda: build_digits_mlp(hidden=(32,)), (x[:256], y[:256]), _xent(), (256, 10), 0.1
    if name == "resnet":
        x, y = synthetic_cifar10(64, seed=0)
        return lambda: build_resnet(depth=8, width=4), (x, y), _xent(), (64, 10), 0.05
    if name == "bert-small":
        data = synthetic_tokens(128, seq_len=16, vocab=40, num_classes=2, seed=0)
        build = lambda: build_bert_small(40, 16, d_model=16, num_heads=2, num_layers=1, dropout=0.0)
        return build, data, _xent(), (128, 2), 0.05
    if name == "ncf":
        users, items, labels = synthetic_interactions(30, 40, 512, seed=0)
        build = lambda: build_ncf(30, 40, gmf_dim=8, mlp_dims=(16, 8))
        return build, ([users, items], labels), keras.losses.BinaryCrossentropy(), (512, 1), 2.0
    if name == "comm-heavy-mlp":
        data = synthetic_comm_heavy_data(128, input_dim=64, seed=0)
        return lambda: build_comm_heavy_mlp(64, hidden=(128, 128, 64)), data, _xent(), (128, 10), 0.05
    raise KeyError(name)


SMALL_CASES = ["teacher-mlp", "digits-mlp", "resnet", "bert-small", "ncf", "comm-heavy-mlp"]


def _train_loss(model: keras.Model, loss_fn: keras.losses.Loss, x, y) -> float:
    # Training mode throughout, so BatchNorm uses batch statistics both when
    # stepping and when measuring (its moving averages lag far behind).
    return float(loss_fn(y, model(x, training=True)))


@pytest.mark.parametrize("name", SMALL_CASES)
def test_small_model_forward_shape_and_sgd_reduces_loss(name: str) -> None:
    build, (x, y), loss_fn, out_shape, lr = _small_case(name)
    model = build()
    assert isinstance(model, keras.Model)
    assert tuple(model(x).shape) == out_shape
    opt = keras.optimizers.SGD(learning_rate=lr, momentum=0.9)

    # A graph step: eager execution of the ResNet alone would take ~10 s.
    @tf.function
    def sgd_step(x, y) -> None:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        assert all(g is not None for g in grads), "every trainable variable must get a gradient"
        opt.apply(grads, model.trainable_variables)

    before = _train_loss(model, loss_fn, x, y)
    for _ in range(15):
        sgd_step(x, y)
    after = _train_loss(model, loss_fn, x, y)
    assert np.isfinite(after)
    assert after < 0.9 * before, f"{name}: loss {before:.4f} -> {after:.4f}"


def test_comm_heavy_mlp_parameter_count() -> None:
    sizes = [1024, 4096, 4096, 1024, 10]
    expected = sum((fan_in + 1) * fan_out for fan_in, fan_out in itertools.pairwise(sizes))  # weights + biases
    assert expected == 25_185_290
    model = build_comm_heavy_mlp()
    assert model.count_params() == expected
    assert [layer.units for layer in model.layers[1:]] == sizes[1:]


@pytest.mark.parametrize("depth", [20, 56])
def test_resnet_depth_counts_weighted_layers(depth: int) -> None:
    model = build_resnet(depth=depth, width=4, input_shape=(8, 8, 3))
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    # depth = 3x3 stem + 6n 3x3 convs (3 stages x n blocks x 2) + the dense head;
    # the two 1x1 projection shortcuts are not counted, as in the paper.
    assert len([c for c in convs if c.kernel_size == (3, 3)]) + len(dense) == depth
    assert len([c for c in convs if c.kernel_size == (1, 1)]) == 2
    assert sum(isinstance(layer, keras.layers.BatchNormalization) for layer in model.layers) == len(convs)
    with pytest.raises(ValueError, match="6n\\+2"):
        build_resnet(depth=depth + 1)


def _embedding_gradients(model: keras.Model, x, y, loss_fn, variables) -> list:
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    return tape.gradient(loss, variables)


def test_bert_embeddings_have_sparse_gradients() -> None:
    tokens, labels = synthetic_tokens(8, seq_len=16, vocab=40, num_classes=2, seed=0)
    model = build_bert_small(40, 16, d_model=16, num_heads=2, num_layers=1)
    emb = model.get_layer("embeddings")
    grads = _embedding_gradients(model, tokens, labels, _xent(), [emb.token.embeddings, emb.position.embeddings])
    for g in grads:
        assert isinstance(g, tf.IndexedSlices), type(g)
    assert tuple(grads[0].dense_shape.numpy()) == (40, 16)
    # Only rows of tokens actually present in the batch are touched.
    assert set(np.unique(grads[0].indices.numpy())) == set(np.unique(tokens))


def test_ncf_embeddings_have_sparse_gradients() -> None:
    users, items, labels = synthetic_interactions(1000, 500, 16, seed=0)
    model = build_ncf(1000, 500, gmf_dim=4, mlp_dims=(8, 4))
    tables = [model.get_layer(n).embeddings for n in ("gmf_user", "gmf_item", "mlp_user", "mlp_item")]
    grads = _embedding_gradients(model, [users, items], labels, keras.losses.BinaryCrossentropy(), tables)
    for g in grads:
        assert isinstance(g, tf.IndexedSlices), type(g)
    assert tuple(grads[0].dense_shape.numpy()) == (1000, 4)
    assert tuple(grads[3].dense_shape.numpy()) == (500, 4)


def test_synthetic_generators_are_seeded_and_labels_follow_their_rule() -> None:
    t1, l1 = synthetic_tokens(64, 12, 30, 3, seed=5)
    t2, l2 = synthetic_tokens(64, 12, 30, 3, seed=5)
    np.testing.assert_array_equal(t1, t2)
    np.testing.assert_array_equal(l1, l2)
    counts = np.stack([(t1 % 3 == c).sum(axis=1) for c in range(3)], axis=1)
    np.testing.assert_array_equal(l1, counts.argmax(axis=1))
    assert t1.dtype == np.int32 and t1.min() >= 0 and t1.max() < 30 and len(set(l1.tolist())) == 3

    u, i, y = synthetic_interactions(7, 9, 200, seed=1)
    assert u.dtype == i.dtype == np.int32 and u.max() < 7 and i.max() < 9
    assert y.dtype == np.float32 and 0.2 < y.mean() < 0.8  # both classes well represented
    np.testing.assert_array_equal(y, synthetic_interactions(7, 9, 200, seed=1)[2])

    x, labels = synthetic_cifar10(20, seed=3)
    assert x.shape == (20, 32, 32, 3) and x.dtype == np.float32 and labels.dtype == np.int32
    assert 0.0 <= x.min() and x.max() <= 1.0
    np.testing.assert_array_equal(x, synthetic_cifar10(20, seed=3)[0])


def _cifar_record(label: int, image_hwc: np.ndarray) -> bytes:
    # The official layout: label byte, then the red, green and blue planes.
    return bytes([label]) + image_hwc.transpose(2, 0, 1).tobytes()


def test_cifar10_loader_reads_binary_records_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 32, 32, 3), dtype=np.uint8)
    labels = np.array([3, 9, 0, 7, 1], dtype=np.int32)
    # A known pixel: record 1, row 5, column 7, blue channel. On disk it is
    # byte 1 + 2*1024 + 5*32 + 7 of that record.
    images[1, 5, 7] = (10, 20, 200)
    files = [tmp_path / "data_batch_1.bin", tmp_path / "data_batch_2.bin"]
    files[0].write_bytes(b"".join(_cifar_record(int(labels[k]), images[k]) for k in range(2)))
    files[1].write_bytes(b"".join(_cifar_record(int(labels[k]), images[k]) for k in range(2, 5)))
    assert files[0].read_bytes()[RECORD_BYTES + 1 + 2 * 1024 + 5 * 32 + 7] == 200

    x, y = load_cifar10_batches(files)
    assert x.shape == (5, 32, 32, 3) and x.dtype == np.float32
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, labels)
    np.testing.assert_array_equal(x, images.astype(np.float32) / 255.0)
    np.testing.assert_allclose(x[1, 5, 7], np.array([10, 20, 200]) / 255.0, rtol=1e-6)
    assert 0.0 <= x.min() and x.max() <= 1.0


def test_cifar10_loader_rejects_truncated_file(tmp_path: Path) -> None:
    good = tmp_path / "data_batch_1.bin"
    good.write_bytes(bytes(RECORD_BYTES * 2))
    truncated = tmp_path / "data_batch_2.bin"
    truncated.write_bytes(bytes(RECORD_BYTES * 2 - 10))
    with pytest.raises(ValueError, match="data_batch_2.bin"):
        load_cifar10_batches([good, truncated])
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty.bin"):
        load_cifar10_batches([empty])


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_digits_load_offline_and_mlp_learns(no_network: None) -> None:
    x_train, y_train, x_test, y_test = load_digits_split(test_fraction=0.2, seed=0)
    assert len(x_train) + len(x_test) == 1797
    assert x_train.shape[1] == x_test.shape[1] == 64
    assert x_train.dtype == np.float32 and y_train.dtype == np.int32
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0 and x_train.max() > 0.9
    assert set(y_train.tolist()) == set(range(10))
    # Disjoint: the test rows are held out from training.
    train_rows = {row.tobytes() for row in x_train}
    assert sum(row.tobytes() in train_rows for row in x_test) < 0.05 * len(x_test)

    model = build_digits_mlp(seed=0)
    model.compile(keras.optimizers.Adam(1e-2), _xent(), metrics=["accuracy"], jit_compile=False)
    model.fit(x_train, y_train, batch_size=64, epochs=10, verbose=0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    assert accuracy > 0.9


@pytest.mark.parametrize("name", sorted(MODELS))
def test_registry_entry_builds_and_matches_its_data(name: str) -> None:
    spec = get_model_spec(name)
    assert spec.name == name and spec.description
    inputs, labels = spec.data(2, 0)
    arrays = inputs if isinstance(inputs, list) else [inputs]
    assert [a.shape[1:] for a in arrays] == list(spec.input_shapes)
    assert len(labels) == 2
    model = spec.build()
    out = model(inputs)
    assert out.shape[0] == 2
    loss = spec.loss()(labels, out)
    assert np.isfinite(float(loss))


def test_registry_rejects_unknown_name() -> None:
    with pytest.raises(ValueError, match="resnet20"):
        get_model_spec("resnet-9000")
    assert set(MODELS) == {"digits-mlp", "resnet20", "resnet56", "bert-small", "ncf", "comm-heavy-mlp", "teacher-mlp"}
