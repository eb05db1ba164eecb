"""Worker for tests/test_auto_sampled_training.py: sampled hybrid strategies train like one process.

Usage: auto_sampled_equivalence.py PER_MODEL

For the MLP, BERT-small and NCF of strategy_equivalence.py (small
configurations), the sampler's first PER_MODEL hybrid candidates (some
variables all-reduced, some on PS owners, at least one partitioned; small
thresholds so that the tiny variables are cut) train STEPS steps in a
tf.function loop, each worker on its shard of every global batch; every
worker must hold the same weights, equal on rank 0 to one process trained on
the union of the batches. Ends with "checked N results".
"""

from __future__ import annotations

import sys

import _setup
import strategy_equivalence as eq
from _setup import Checker

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy.auto.sampler import SamplerOptions, sample_strategies
from kungfu_tf.strategy.builders.base import StrategyBuilder
from kungfu_tf.strategy.validation import effective_nodes

MODELS = ("mlp", "bert-small", "ncf")
OPTIONS = SamplerOptions(min_partition_bytes=64, always_partition_bytes=4096, include_builders=False)
SEED = 3


def hybrids(variables, cluster) -> list:
    """Sampled candidates mixing all-reduce and PS with at least one partitioned variable, in sampled order."""
    out = []
    for s in sample_strategies(variables, cluster, 40, SEED, OPTIONS):
        nodes = effective_nodes(s, variables, cluster.replicas)
        if {n.kind for n in nodes} == {"all_reduce", "ps"} and any(n.is_shard for n in nodes):
            out.append(s)
    return out


class Sampled(StrategyBuilder):
    """The ``pick``-th hybrid candidate the sampler makes for the model (every worker makes the same)."""

    name = "sampled"

    def __init__(self, pick: int) -> None:
        self.pick = pick

    def nodes(self, variables, cluster):  # build() is overridden: the sampler writes whole strategies
        raise NotImplementedError

    def build(self, variables, cluster):
        found = hybrids(variables, cluster)
        if self.pick >= len(found):
            raise RuntimeError(f"the sampler made only {len(found)} hybrid candidates")
        print(f"strategy {found[self.pick].id}", flush=True)
        return found[self.pick]


def main() -> None:
    per_model = int(sys.argv[1])
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    for model_name in MODELS:
        x, y = eq.MODELS[model_name][2](eq.STEPS * size * eq.B, 9)
        xs, ys = eq.shard(x, rank, size), eq.shard(y, rank, size)
        reference = None
        if rank == 0:
            ref = eq.train_function(model_name, eq.sgd(), x, y, size * eq.B)
            reference = [v.numpy() for v in ref.trainable_variables]
        for pick in range(per_model):
            what = f"{model_name}/sampled{pick}"
            opt = SynchronousSGDOptimizer(eq.sgd(), strategy=Sampled(pick), name=f"auto/{what}")
            model = eq.train_function(model_name, opt, xs, ys, eq.B)
            got = [v.numpy() for v in model.trainable_variables]
            eq.agree(chk, got, what)
            if rank == 0:
                eq.close(chk, got, reference, what)
            print(f"ran {what}", flush=True)
    chk.done()


if __name__ == "__main__":
    main()
