"""Reading the per-worker records of models/elastic_train.py and checking them against a one-process reference.

Shared by tests/test_elastic_keras.py and tests/test_elastic_v1.py.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS = REPO_ROOT / "models"


def load(record_dir: Path) -> dict[str, list[dict]]:
    """file stem ("host_port-pid") -> its records, in order."""
    return {p.stem: [json.loads(line) for line in p.read_text().splitlines()] for p in sorted(record_dir.glob("*.jsonl"))}


def steps_by_index(records: dict[str, list[dict]]) -> dict[int, dict[int, list[int]]]:
    """step -> {rank: ids} over every worker (each committed step is recorded by each member that ran it)."""
    out: dict[int, dict[int, list[int]]] = defaultdict(dict)
    for lines in records.values():
        for r in lines:
            if r["event"] == "step":
                assert r["rank"] not in out[r["step"]] or out[r["step"]][r["rank"]] == r["ids"], (r, out[r["step"]])
                out[r["step"]][r["rank"]] = r["ids"]
    return dict(out)


def check_each_sample_once(records: dict[str, list[dict]], samples: int, epochs: int) -> None:
    """Every sample id of every epoch trained exactly once, and the steps numbered 0..n-1 without gaps."""
    per_epoch: dict[int, list[int]] = defaultdict(list)
    seen_steps = set()
    for lines in records.values():
        for r in lines:
            if r["event"] == "step" and (r["step"], r["rank"]) not in seen_steps:
                seen_steps.add((r["step"], r["rank"]))
                per_epoch[r["epoch"]].extend(r["ids"])
    assert sorted(per_epoch) == list(range(epochs)), sorted(per_epoch)
    for epoch, ids in per_epoch.items():
        assert sorted(ids) == list(range(samples)), f"epoch {epoch}: {len(ids)} ids, {len(set(ids))} distinct"
    steps = sorted({s for s, _ in seen_steps})
    assert steps == list(range(len(steps))), steps


def reference_weights(steps: dict[int, dict[int, list[int]]], samples: int, hidden: int, lr: float,
                      optimizer: str = "sgd") -> list[np.ndarray]:  # fmt: skip
    """The trained weights of :func:`reference_training`."""
    return [w.numpy() for w in reference_training(steps, samples, hidden, lr, optimizer)[0].trainable_weights]


def reference_training(steps: dict[int, dict[int, list[int]]], samples: int, hidden: int, lr: float,
                       optimizer: str = "sgd") -> tuple[Any, Any]:  # fmt: skip
    """One process: from the same initial weights, each step's update is ``optimizer`` (models/elastic_train.py
    --optimizer: its slots carried from step to step) on the mean of the shares' mean-loss gradients (what
    S-SGD over those workers computes; a LossScaleOptimizer's scaled, as the workers' step scales them).
    Returns the trained Keras model and optimizer."""
    import keras
    import tensorflow as tf

    sys.path.insert(0, str(MODELS))
    from digits import build_digits_mlp, load_digits_split
    from elastic_train import make_optimizer

    keras.utils.set_random_seed(1)
    x, y, _, _ = load_digits_split(test_fraction=0.2, seed=0)
    x, y = x[:samples], y[:samples]
    model = build_digits_mlp(hidden=(hidden,), seed=1)
    opt = make_optimizer(optimizer, lr)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for step in sorted(steps):
        shares = [ids for _, ids in sorted(steps[step].items())]
        grads = None
        for ids in shares:
            with tf.GradientTape() as tape:
                scaled = opt.scale_loss(loss_fn(y[ids], model(x[ids], training=True)))  # as the workers' step
            g = tape.gradient(scaled, model.trainable_variables)
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        opt.apply_gradients([(g / len(shares), v) for g, v in zip(grads, model.trainable_variables)])
    return model, opt


def final_weights(record_dir: Path, stem: str) -> list[np.ndarray]:
    with np.load(record_dir / f"{stem}.npz") as f:
        return [f[f"arr_{i}"] for i in range(len(f.files))]


def final_slots(record_dir: Path, stem: str) -> list[list[np.ndarray]]:
    """``slots[kind][variable]`` a worker of models/elastic_train.py --record-slots held at the end."""
    with np.load(record_dir / f"{stem}-slots.npz") as f:
        keys = sorted((tuple(int(n) for n in key.split("_")), key) for key in f.files)
        kinds = 1 + max((k for (k, _), _ in keys), default=-1)
        return [[f[key] for (k, _), key in keys if k == kind] for kind in range(kinds)]
