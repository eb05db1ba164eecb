"""Elastic training of the digits MLP: workers join, leave and crash while it trains.

    kungfu-run --elastic --max-np 3 -np 2 python models/elastic_train.py --resize-at 20:1,40:3
    kungfu-run --elastic -np 3 python models/elastic_train.py --api keras --crash-at 15 --crash-rank 1
    kungfu-run --elastic -np 2 python models/elastic_train.py --api v1 --record-dir /tmp/rec

Each API trains the same way: an ``ElasticSampler`` splits every global batch
(the next ``size * --batch-size`` ids of the epoch's seeded order) among the
workers of the step, ``SynchronousSGDOptimizer`` averages the gradients, and
an ``ElasticState`` holds the model, the optimizer, the step, the epoch and
the data position:

* ``--api function``: a ``tf.function`` step in a custom loop inside
  ``kungfu_tf.elastic.run`` (``state.check()`` between steps);
* ``--api keras``: ``model.fit`` through ``kungfu_tf.keras.elastic_fit``
  (an ``ElasticCallback`` stops and re-enters ``fit`` after a change);
* ``--api v1``: a ``tf.compat.v1`` graph under ``MonitoredSession`` with
  ``ElasticSessionCreator`` and ``ElasticHook`` (the hook feeds each step).

``--optimizer momentum|adam|nadam|lossscale|adafactor|muon`` trains with a Keras optimizer that builds its
slots in its first step, as users write it (``lossscale``: Keras's ``LossScaleOptimizer``
around SGD with momentum, whose loss scale and counter are variables of its own; the
step scales the loss, as ``fit`` does; ``nadam``: Keras's Nadam, whose ``u_product`` is one
scalar for all variables, advanced every step; ``adafactor``: Keras's Adafactor, whose factored
slots do not have the variables' shapes; ``muon``: Keras's Muon, one slot for matrices and two
for the rest); ``--state-form`` picks how the
``ElasticState`` is given the variables (``model``: ``ElasticState(model=,
optimizer=)``, the README's; ``callable``; ``list``).

``--switch-at STEP:STRATEGY,...`` (``--api function``, with ``--strategy``)
switches every worker to that builder after that many steps
(``kungfu_tf.optimizers.switch_strategy``; recorded as ``event="switch"``).

``--resize-at STEP:SIZE,...`` resizes after that many steps (every member
calls ``kungfu_tf.ops.resize(SIZE)``; a growth is admitted once the
launcher's joiners are warm, at a later step, or at once with
``--resize-wait``). ``--crash-at STEP --crash-rank R``: the worker
of rank R (in the initial cluster) kills itself with SIGKILL when STEP steps are done, as its step
begins (its peers are then inside the step, waiting for it); a replacement
the launcher starts does not crash again. With ``--record-dir`` every worker
writes ``<peer>-<pid>.jsonl``: one line per committed step (step, epoch,
wall-clock start and end, this worker's sample ids, rank, size, cluster
version), one per membership change, one per call of the ``--policy-resize-at``
policy (with its state), for ``--api v1`` one with the sessions created and the
graph's size, and one at the end with a digest of
the final weights (the weights themselves go to ``<peer>-<pid>.npz``) and
(function and keras APIs) a digest of every variable the ``ElasticState``
holds (model and optimizer: slots, counters, the loss scale); with
``--record-slots`` every optimizer slot of every variable (the worker's own
replicas, or gathered from the owners of parameter-server variables) goes to ``<peer>-<pid>-slots.npz`` (``slots_sha256``
in the end record). The run is deterministic for a given schedule: seeded order and initial
weights, one TF thread per worker.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from typing import Any

# One thread per worker, before TensorFlow starts: cheap and deterministic.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from digits import build_digits_mlp, load_digits_split

import kungfu_tf
from kungfu_tf import (
    elastic,
    ops,
)
from kungfu_tf.data import ElasticSampler
from kungfu_tf.optimizers import (
    SynchronousSGDOptimizer,
    switch_strategy,
    sync_stale_copies,
)
from kungfu_tf.optimizers.strategy_replan import gather_slots, slot_table
from kungfu_tf.policy import BasePolicy

APIS = ("function", "keras", "v1")
STALE_BUILDERS = ("PS", "PSLoadBalancing", "PartitionedPS", "UnevenPartitionedPS")
OPTIMIZERS = ("sgd", "momentum", "adam", "nadam", "lossscale", "adafactor", "muon")
# --optimizer lossscale: the loss scale doubles every this many finite steps (Keras's default, 2000, would
# leave it unchanged in a short run: its own variables must change to show that they travel with the state).
LOSS_SCALE_GROWTH_STEPS = 3
STATE_FORMS = ("model", "callable", "list")
SEED = 1


class ResizeAt(BasePolicy):
    """A policy that resizes at fixed steps (``--policy-resize-at``): ``ctx.resize(size)`` after that many steps.

    Its state (the entries already asked for, and how many times the job
    called it) travels to joiners with the runner's
    (``ElasticState(policy=runner)``): a joiner admitted later neither asks
    again nor disagrees with the members. With ``--record-dir`` each call is
    recorded (``event="policy"``): the tests see who called it when.

    Example:
        >>> ResizeAt({12: 2}).state_dict()
        {'asked': [], 'calls': 0}
    """

    def __init__(self, schedule: dict[int, int], record: Any = None):
        self.schedule = dict(schedule)
        self.asked: list[int] = []
        self.calls = 0  # after_step calls in the job so far (a joiner starts from the members' count)
        self.record = record  # record(step, rank, size, state_dict) after every call (--record-dir), or None

    def after_step(self, ctx: Any) -> None:
        self.calls += 1
        if self.record is not None:
            self.record(ctx.step, ctx.rank, ctx.size, self.state_dict())
        step = ctx.step + 1  # steps done once this one ends, as --resize-at counts
        size = self.schedule.get(step)
        if size is not None and step not in self.asked:
            self.asked.append(step)
            ctx.resize(size, reason=f"--policy-resize-at {step}:{size}")

    def config(self) -> dict[str, Any]:
        return {"schedule": {str(k): v for k, v in sorted(self.schedule.items())}}

    def state_dict(self) -> dict[str, Any]:
        return {"asked": list(self.asked), "calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.asked = [int(s) for s in state.get("asked", [])]
        self.calls = int(state.get("calls", 0))


def make_optimizer(name: str, lr: float) -> keras.optimizers.Optimizer:
    """The Keras optimizer ``--optimizer`` names (not built: momentum and Adam build their slots in the first step).

    Example:
        >>> make_optimizer("adam", 0.01).built
        False
    """
    if name == "momentum":
        return keras.optimizers.SGD(lr, momentum=0.9)
    if name == "adam":
        return keras.optimizers.Adam(lr)
    if name == "nadam":
        # Beside its slots, one scalar for all variables (u_product, advanced every step): step state.
        return keras.optimizers.Nadam(lr)
    if name == "adafactor":
        # Factored slots, not of the variables' shapes (a matrix's row and column sums; int32 placeholders for a
        # bias). epsilon_1: with Keras's 1e-30 the factored second moment of a weight whose gradient is always 0
        # (the digits' blank pixels) underflows to 0 in float32, and 0 / sqrt(0) makes every weight NaN.
        return keras.optimizers.Adafactor(lr, epsilon_1=1e-8)
    if name == "muon":
        # One slot for matrices (Newton-Schulz orthogonalised momentum), two for the rest (Adam's).
        return keras.optimizers.Muon(lr)
    if name == "lossscale":
        inner = keras.optimizers.SGD(lr, momentum=0.9)
        return keras.mixed_precision.LossScaleOptimizer(inner, dynamic_growth_steps=LOSS_SCALE_GROWTH_STEPS)
    return keras.optimizers.SGD(lr)


def make_state(form: str, model: keras.Model, optimizer: keras.optimizers.Optimizer, **kwargs: Any) -> elastic.ElasticState:
    """``--state-form``: ``model`` (``ElasticState(model=, optimizer=)``, the README's), ``callable`` (variables
    read at each sync; slots built lazily join the signature after the first step) or ``list`` (a fixed list:
    the optimizer is built first, so that its slots are in it)."""
    if form == "model":
        return elastic.ElasticState(model=model, optimizer=optimizer, **kwargs)
    if form == "callable":
        return elastic.ElasticState(lambda: model.variables + list(optimizer.variables), **kwargs)
    optimizer.build(model.trainable_variables)
    return elastic.ElasticState(model.variables + list(optimizer.variables), **kwargs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--api", default="function", choices=APIS)
    p.add_argument("--epochs", type=int, default=2, help="passes over the training samples")
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps (before --epochs if sooner)")
    p.add_argument("--samples", type=int, default=1438, help="training samples used (digits has 1438)")
    p.add_argument("--batch-size", type=int, default=16, help="per-worker batch size")
    p.add_argument("--hidden", type=int, default=32, help="width of the hidden layer")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate")
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS,
                   help="sgd, momentum (SGD with momentum 0.9), adam, or lossscale (a LossScaleOptimizer around "
                        "momentum); their slots are built in the first step")
    p.add_argument("--state-form", default="model", choices=STATE_FORMS,
                   help="how the ElasticState is given the variables (function and keras APIs; see make_state)")
    p.add_argument("--resize-at", default="", help="STEP:SIZE,...: resize after that many steps")
    p.add_argument("--resize-wait", action="store_true",
                   help="a growth blocks until the joiners are admitted (deterministic runs)")
    p.add_argument("--crash-at", type=int, default=None, help="the --crash-rank worker dies when this many steps are done")
    p.add_argument("--crash-rank", type=int, default=1)
    p.add_argument("--policy-resize-at", default="",
                   help="STEP:SIZE,...: a policy (PolicyCallback in elastic_fit, --api keras; PolicyHook beside "
                        "ElasticHook, --api v1) resizes after that many steps")
    p.add_argument("--strategy", default=None,
                   help="a strategy builder's name (e.g. PSLoadBalancing) or a strategy file for "
                        "SynchronousSGDOptimizer(strategy=...); --api function and keras")
    p.add_argument("--staleness", type=int, default=None,
                   help="with --strategy PS, PSLoadBalancing, PartitionedPS or UnevenPartitionedPS: the builder with "
                        "staleness=K (K > 0: stale synchronous parameter servers; -1: asynchronous, sync=False; "
                        "partitioned: min_partition_bytes=64, every kernel cut); every worker's copies are made the "
                        "owners' values at the end (sync_stale_copies)")
    p.add_argument("--auto-budget", type=int, default=None,
                   help="with --strategy Auto: a short search, builders.Auto(budget=N, trial_steps=1, warmup=1, "
                        "probe_wait_steps=0, confirm_top=0)")
    p.add_argument("--auto-research", type=int, default=None,
                   help="with --auto-budget: builders.Auto(research_budget=N), a search of N (>= 2) trials on "
                        "each new cluster after a membership change")
    p.add_argument("--switch-at", default="",
                   help="STEP:BUILDER,...: switch the strategy after that many steps (--api function, --strategy)")
    p.add_argument("--plain-tf-function", action="store_true",
                   help="trace the step with tf.function instead of kungfu_tf.elastic.function (which traces it "
                        "again after a change re-built the strategy)")
    p.add_argument("--check-every", type=int, default=1, help="membership check every this many steps")
    p.add_argument("--record-dir", default=None, help="write per-step records here (one file per worker)")
    p.add_argument("--record-slots", action="store_true",
                   help="with --record-dir and --strategy (--api function): every optimizer slot of every variable "
                        "goes to <peer>-<pid>-slots.npz at the end")
    p.add_argument("--record-owned-slots", action="store_true",
                   help="with --record-dir and --strategy (--api function): the values and optimizer slots of the "
                        "parameter-server parts this worker owns go to <peer>-<pid>-owned-step<N>.npz after each step and to "
                        "<peer>-<pid>-owned-v<V>.npz after each change to cluster version V")
    args = p.parse_args(argv)
    try:
        args.schedule = parse_schedule(args.resize_at)
        args.policy_schedule = parse_schedule(args.policy_resize_at)
    except ValueError as e:
        p.error(str(e))
    args.switches = {}
    for part in filter(None, (q.strip() for q in args.switch_at.split(","))):
        step, _, builder = part.partition(":")
        if not step.isdigit() or not builder:
            p.error(f"--switch-at: {part!r} is not STEP:BUILDER (e.g. 10:AllReduce)")
        args.switches[int(step)] = builder
    if args.switches and (args.api != "function" or args.strategy is None):
        p.error("--switch-at is for --api function with --strategy")
    if args.record_slots and (args.api != "function" or args.strategy is None or args.record_dir is None):
        p.error("--record-slots is for --api function with --strategy and --record-dir")
    if args.policy_schedule and args.api == "function":
        p.error("--policy-resize-at is for --api keras (a PolicyCallback inside elastic_fit) and v1 (a PolicyHook)")
    if args.staleness is not None and args.strategy not in STALE_BUILDERS:
        p.error(f"--staleness is for --strategy {', '.join(STALE_BUILDERS)}")
    if args.auto_budget is not None and args.strategy != "Auto":
        p.error("--auto-budget is for --strategy Auto")
    if args.auto_research is not None and args.auto_budget is None:
        p.error("--auto-research is for --auto-budget")
    if args.strategy is not None and args.api == "v1":
        p.error("--strategy is for --api function and keras")
    if args.api == "v1" and args.optimizer != "sgd":
        p.error(f"--optimizer {args.optimizer} is for --api function and keras (v1 trains with GradientDescentOptimizer)")
    if args.epochs < 1 or args.batch_size < 1 or args.samples < 1 or (args.steps is not None and args.steps < 1):
        p.error("--epochs, --batch-size, --samples and --steps must be positive")
    return args


def strategy_source(args: argparse.Namespace) -> Any:
    """What ``--strategy`` (and ``--auto-budget``, ``--staleness``) ask ``SynchronousSGDOptimizer`` for."""
    from kungfu_tf.strategy import builders

    if args.staleness is not None:
        stale: dict[str, Any] = {"sync": False} if args.staleness < 0 else {"staleness": args.staleness}
        if "Partitioned" in args.strategy:
            stale["min_partition_bytes"] = 64  # the digits MLP's kernels are cut in every cluster
        return builders.BUILDERS[args.strategy](**stale)
    if args.auto_budget is None:
        return args.strategy

    return builders.Auto(budget=args.auto_budget, trial_steps=1, warmup=1, probe_wait_steps=0, confirm_top=0,
                         show_progress=False, research_budget=args.auto_research)  # fmt: skip


def parse_schedule(text: str) -> dict[int, int]:
    """``"20:2,40:3"`` -> {20: 2, 40: 3} (after 20 steps resize to 2, after 40 to 3).

    Example:
        >>> parse_schedule("20:2, 40:3")
        {20: 2, 40: 3}
    """
    schedule = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            step, size = (int(v) for v in part.split(":"))
        except ValueError:
            raise ValueError(f"--resize-at: {part!r} is not STEP:SIZE (e.g. 20:2)") from None
        if step < 1 or size < 1:
            raise ValueError(f"--resize-at: {part!r}: STEP and SIZE must be positive")
        schedule[step] = size
    return schedule


class Recorder:
    """Per-worker JSON lines: committed steps, membership changes, the end (see the module docstring)."""

    def __init__(self, directory: str | None):
        self.file = None
        if directory:
            os.makedirs(directory, exist_ok=True)
            peer = os.environ.get("KUNGFU_SELF", "local")  # host:port; a replacement gets a new pid
            self.stem = os.path.join(directory, f"{peer.replace(':', '_')}-{os.getpid()}")
            self.file = open(self.stem + ".jsonl", "a", buffering=1)  # noqa: SIM115 -- open for the whole run

    def write(self, **fields: Any) -> None:
        if self.file is not None:
            self.file.write(json.dumps(fields) + "\n")

    def step(self, step: int, epoch: int, ids: np.ndarray, t0: float, t1: float, rank: int, size: int) -> None:
        """Step ``step`` (0-based) of ``epoch`` trained ``ids`` here, from ``t0`` to ``t1`` (time.time())."""
        self.write(event="step", step=step, epoch=epoch, t0=t0, t1=t1, ids=[int(i) for i in ids],
                   rank=rank, size=size)  # fmt: skip

    def change(self, change: Any, step: int) -> None:
        self.write(event="change", step=step, old_version=change.old_version, new_version=change.new_version,
                   old_size=len(change.old_peers), new_size=len(change.new_peers), lost=list(change.lost),
                   detached=change.detached, joined=change.joined, t=time.time())  # fmt: skip

    def policy_call(self, step: int, rank: int, size: int, state: dict[str, Any]) -> None:
        """A policy's ``after_step`` ran at ``step`` (0-based); ``state``: its state_dict() after the call."""
        self.write(event="policy", step=step, rank=rank, size=size, state=state, t=time.time())

    def owned_slots(self, tag: str, slots: dict[str, np.ndarray]) -> None:
        """--record-owned-slots: ``slots`` (see :func:`owned_slots`) as <stem>-owned-<tag>.npz."""
        if self.file is not None:
            np.savez(f"{self.stem}-owned-{tag}.npz", **slots)

    def end(self, weights: list[np.ndarray], state: elastic.ElasticState, detached: bool, api: str,
            slots: list[list[np.ndarray | None]] | None = None) -> None:  # fmt: skip
        """The end: digests of what this worker holds; the weights (and ``slots[kind][variable]``) as .npz files."""
        flat = b"".join(np.ascontiguousarray(w, np.float32).tobytes() for w in weights)
        held: dict[str, Any] = {}
        if slots is not None:
            held["slots_sha256"] = hashlib.sha256(b"".join(s.tobytes() for kind in slots for s in kind
                                                           if s is not None)).hexdigest()  # fmt: skip
        if api != "v1":  # a tf.compat.v1 graph's variables are read through its session
            variables = state.variables()
            held["state_sha256"] = hashlib.sha256(b"".join(np.asarray(v.numpy()).tobytes() for v in variables)).hexdigest()
            # Keras's step counters: a step run again after a failure must not have been counted twice.
            held["optimizer_iterations"] = [
                int(v.numpy()) for v in variables if getattr(v, "path", "").endswith("/iteration")
            ]
            scales = [float(v.numpy()) for v in variables if getattr(v, "path", "").endswith("/dynamic_scale")]
            if scales:  # a LossScaleOptimizer's
                held["loss_scale"] = scales[0]
        self.write(event="end", step=state.step, epoch=state.epoch, detached=detached,
                   weights_sha256=hashlib.sha256(flat).hexdigest(), t=time.time(), **held)  # fmt: skip
        if self.file is not None:
            np.savez(self.stem + ".npz", *weights)
            if slots is not None:
                np.savez(self.stem + "-slots.npz", **{f"{k}_{i}": s for k, kind in enumerate(slots)
                                                      for i, s in enumerate(kind) if s is not None})  # fmt: skip
            self.file.close()


class Script:
    """What every API shares: data, sampler, schedule, crash, records."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        x, y, self.x_test, self.y_test = load_digits_split(test_fraction=0.2, seed=0)
        self.x, self.y = x[: args.samples], y[: args.samples]
        self.sampler = ElasticSampler(len(self.x), args.batch_size, seed=SEED)
        self.record = Recorder(args.record_dir)
        self.done_resizes: set[int] = set()
        self.joiner = elastic.is_joiner()  # a replacement never crashes again
        self.initial_rank = kungfu_tf.rank()  # --crash-rank names a rank of the initial cluster
        self._seen: Any = None
        self.slots: list[list[np.ndarray | None]] | None = None  # --record-slots: slots[kind][variable], at the end
        self.optimizer: Any = None  # --strategy: the SynchronousSGDOptimizer (its plan is reported at the end)

    def finished(self, state: elastic.ElasticState) -> bool:
        return state.epoch >= self.args.epochs or (self.args.steps is not None and state.step >= self.args.steps)

    def maybe_crash(self, state: elastic.ElasticState, rank: int) -> None:
        if self.args.crash_at == state.step and self.initial_rank == self.args.crash_rank and not self.joiner:
            print(f"[elastic_train] rank {rank} crashes at step {state.step} (SIGKILL)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def scheduled_size(self, state: elastic.ElasticState) -> int | None:
        """The size to resize to after this step, once per schedule entry (step = steps committed)."""
        size = self.args.schedule.get(state.step)
        if size is None or state.step in self.done_resizes:
            return None
        self.done_resizes.add(state.step)
        return size

    def note_change(self, state: elastic.ElasticState) -> None:
        """Records the last change applied, once."""
        change, seen = state.last_change, self._seen
        self._seen = change
        if change is not None and change is not seen:
            self.record.change(change, state.step)
            if self.args.record_owned_slots and not change.detached:
                self.record.owned_slots(f"v{change.new_version}", owned_slots(self.optimizer))
            if not change.detached and kungfu_tf.rank() == 0:
                print(f"[elastic_train] step {state.step}: cluster v{change.new_version}, "
                      f"{len(change.old_peers)} -> {len(change.new_peers)} workers", flush=True)  # fmt: skip


def build_model(args: argparse.Namespace) -> keras.Model:
    return build_digits_mlp(hidden=(args.hidden,), seed=SEED)


def loss_fn() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def held_slots(optimizer: keras.optimizers.Optimizer) -> list[list[np.ndarray | None]]:
    """``slots[kind][variable]``: this worker's own where it holds every slot (the records compare the workers),
    else gathered from the owners of the variables and shards (collective over the final workers)."""
    plan, variables = optimizer._kungfu_plan, list(optimizer._kungfu_model_variables)
    if plan.replicated and [id(t) for t in plan.targets] == [id(v) for v in variables]:
        table = slot_table(optimizer, optimizer._kungfu_fixed_variable_ids, plan.targets)
        return [[None if slot is None else slot.numpy() for slot in kind] for kind in table]
    _, full = gather_slots(optimizer, plan, contributes=True, first=kungfu_tf.rank() == 0, prefix="elastic_train/slots")
    return full


def owned_slots(optimizer: keras.optimizers.Optimizer) -> dict[str, np.ndarray]:
    """The slots (and values: kind -1) of the parameter-server parts this worker owns, keyed
    ``v<variable>_k<kind>_a<axis>_<start>_<stop>`` (a shard's bounds on its axis; a whole variable's: axis -1, 0_0)."""
    plan = optimizer._kungfu_plan
    table = slot_table(optimizer, optimizer._kungfu_fixed_variable_ids, plan.targets)
    index = {id(t): i for i, t in enumerate(plan.targets)}
    out = {}
    for vi, node, target in plan.placements():
        if node.kind != "ps" or target is None:
            continue
        axis, (start, stop) = (node.axis, node.bounds) if node.is_shard else (-1, (0, 0))
        out[f"v{vi}_k-1_a{axis}_{start}_{stop}"] = np.asarray(target.numpy())
        for k, row in enumerate(table):
            slot = row[index[id(target)]]
            if slot is not None:
                out[f"v{vi}_k{k}_a{axis}_{start}_{stop}"] = np.asarray(slot.numpy())
    return out


def train_function_api(script: Script) -> tuple[list[np.ndarray], elastic.ElasticState, bool]:
    args = script.args
    model = build_model(args)
    optimizer = SynchronousSGDOptimizer(make_optimizer(args.optimizer, args.lr), strategy=strategy_source(args))
    script.optimizer = optimizer
    loss_object = loss_fn()
    spec = (tf.TensorSpec([None, 64], tf.float32), tf.TensorSpec([None], tf.int32))

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_object(yb, model(xb, training=True))
            scaled = optimizer.scale_loss(loss)  # a LossScaleOptimizer's scale (as fit does); the identity for the others
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    # elastic.function: traced again after a change re-built a --strategy (a tf.function without one).
    trace = tf.function if args.plain_tf_function else elastic.function
    train_step = trace(step, input_signature=spec)

    state = make_state(args.state_form, model, optimizer, sampler=script.sampler, check_every=args.check_every)

    def warm_up(state: elastic.ElasticState) -> None:
        train_step(script.x[: args.batch_size], script.y[: args.batch_size])  # trace and run alone

    @elastic.run(warm_up=warm_up)
    def train(state: elastic.ElasticState) -> bool:
        while not script.finished(state):
            script.note_change(state)  # e.g. the recovery run() did before calling train again
            rank, size = kungfu_tf.rank(), kungfu_tf.size()
            ids = script.sampler.next_indices(rank, size)
            script.maybe_crash(state, rank)
            t0 = time.time()
            train_step(script.x[ids], script.y[ids])
            t1 = time.time()
            script.record.step(state.step, state.epoch, ids, t0, t1, rank, size)
            script.sampler.commit(size)
            state.epoch = script.sampler.epoch
            state.commit()
            if args.record_owned_slots:
                script.record.owned_slots(f"step{state.step}", owned_slots(optimizer))
            target = script.scheduled_size(state)
            if target is not None:
                _, detached = ops.resize(target, wait=args.resize_wait)
                script.note_change(state)
                if bool(detached):
                    return True
            state.check()
            script.note_change(state)
            builder = args.switches.pop(state.step, None)
            if builder is not None:
                report = switch_strategy(optimizer, builder)
                script.record.write(event="switch", step=state.step, old=report.old_id, new=report.new_id,
                                    size=kungfu_tf.size(), seconds=report.seconds)  # fmt: skip
        return False

    detached = bool(train(state))
    if args.staleness is not None and not detached:
        sync_stale_copies(optimizer)  # the copies of a stale parameter server's variables differ until now
    if args.record_slots and not detached:
        script.slots = held_slots(optimizer)
    if hasattr(train_step, "traces"):  # elastic.function: how many times the step was traced (--record-dir)
        script.record.write(event="traces", traces=train_step.traces)
    return [w.numpy() for w in model.trainable_weights], state, detached


class ScheduleCallback(keras.callbacks.Callback):
    """Records each step and runs the scheduled resizes (after the ElasticCallback committed the step)."""

    def __init__(self, script: Script, state: elastic.ElasticState):
        super().__init__()
        self.script, self.state = script, state
        self.detached = False

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.script.note_change(self.state)
        self.rank, self.size = kungfu_tf.rank(), kungfu_tf.size()
        self.step, self.epoch = self.state.step, self.state.epoch
        self.ids = self.script.sampler.next_indices(self.rank, self.size)  # what the dataset feeds this step
        self.script.maybe_crash(self.state, self.rank)
        self.t0 = time.time()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.script.record.step(self.step, self.epoch, self.ids, self.t0, time.time(), self.rank, self.size)
        target = self.script.scheduled_size(self.state)  # the step is committed: state.step counts it
        if target is not None:
            _, detached = ops.resize(target, wait=self.script.args.resize_wait)
            self.detached = bool(detached)


def train_keras_api(script: Script) -> tuple[list[np.ndarray], elastic.ElasticState, bool]:
    from kungfu_tf.keras import elastic_fit

    args = script.args
    model = build_model(args)
    optimizer = SynchronousSGDOptimizer(make_optimizer(args.optimizer, args.lr), strategy=strategy_source(args))
    script.optimizer = optimizer
    model.compile(optimizer=optimizer, loss=loss_fn())
    extra: dict[str, Any] = {}
    policies: list[keras.callbacks.Callback] = []
    if args.policy_schedule:
        from kungfu_tf.keras import PolicyCallback

        policies.append(PolicyCallback([ResizeAt(args.policy_schedule, script.record.policy_call)], verbose=True))
        extra["policy"] = policies[0].runner  # joiners get the policy's state
    state = make_state(args.state_form, model, model.optimizer, sampler=script.sampler, check_every=args.check_every,
                       **extra)  # fmt: skip
    schedule = ScheduleCallback(script, state)
    total = min(args.epochs, 10**9)

    def warm_up(state: elastic.ElasticState) -> None:
        model.train_on_batch(script.x[: args.batch_size], script.y[: args.batch_size])

    @elastic.run(warm_up=warm_up)
    def train(state: elastic.ElasticState) -> bool:
        history = elastic_fit(model, state, script.sampler, (script.x, script.y), epochs=total,
                              callbacks=[schedule, *policies], check_every=args.check_every, verbose=0)  # fmt: skip
        script.note_change(state)
        detached_by_policy = any(cb.runner.detached for cb in policies)
        return history is None and (schedule.detached or detached_by_policy
                                    or bool(getattr(state.last_change, "detached", False)))  # fmt: skip

    if args.steps is not None:
        raise SystemExit("--steps is not supported with --api keras (fit runs whole epochs); use --epochs")
    detached = bool(train(state))
    return [w.numpy() for w in model.trainable_weights], state, detached


def train_v1_api(script: Script) -> tuple[list[np.ndarray], elastic.ElasticState, bool]:
    from kungfu_tf.optimizers import SynchronousSGDOptimizerV1
    from kungfu_tf.v1 import (
        ElasticHook,
        ElasticSessionCreator,
        PolicyHook,
        session_variables,
    )

    args = script.args
    with tf.Graph().as_default() as graph:
        model = build_model(args)
        x_in = tf.compat.v1.placeholder(tf.float32, [None, 64], name="features")
        y_in = tf.compat.v1.placeholder(tf.int32, [None], name="labels")
        loss = loss_fn()(y_in, model(x_in, training=True))
        optimizer = SynchronousSGDOptimizerV1(tf.compat.v1.train.GradientDescentOptimizer(args.lr))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = optimizer.minimize(loss, global_step=global_step, var_list=[v.value for v in model.trainable_variables])
        extra: dict[str, Any] = {}
        policy_hook = None
        if args.policy_schedule:  # before the state: its graph variables are global variables too
            policy_hook = PolicyHook([ResizeAt(args.policy_schedule, script.record.policy_call)], verbose=True)
            extra["policy"] = policy_hook.runner  # joiners get the policy's state
        state = elastic.ElasticState(session_variables(tf.compat.v1.global_variables()), sampler=script.sampler,
                                     check_every=args.check_every, **extra)  # fmt: skip
        feed = lambda ids: {x_in: script.x[ids], y_in: script.y[ids]}
        warm = lambda session: session.run(train_op, feed(np.arange(args.batch_size)))
        hook = ElasticHook(state, script.sampler, feed, check_every=args.check_every, warm_up=warm)
        hooks = [hook] + ([policy_hook] if policy_hook is not None else [])
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
        sessions = SessionCount(tf.compat.v1.train.ChiefSessionCreator(config=config))
        creator = ElasticSessionCreator(session_creator=sessions)
        detached = False
        with tf.compat.v1.train.MonitoredSession(creator, hooks=hooks) as sess:
            ops_at_start = len(graph.get_operations())
            while not script.finished(state) and not sess.should_stop():
                script.maybe_crash(state, hook.rank)
                t0, epoch = time.time(), state.epoch
                sess.run(train_op)  # the hook feeds this worker's share, commits the step and checks
                ids, rank, size = hook.fed
                script.record.step(state.step - 1, epoch, ids, t0, time.time(), rank, size)
                script.note_change(state)
                target = script.scheduled_size(state)
                if target is not None:
                    _, d = hook.eagerly(lambda target=target: ops.resize(target, wait=args.resize_wait))
                    detached = bool(d)
                    script.note_change(state)
                    if detached:
                        break
            detached = detached or hook.detached or (policy_hook is not None and policy_hook.runner.detached)
            weights = None if detached else sess.run_step_fn(
                lambda step_context: step_context.session.run([v.value for v in model.trainable_weights]))  # fmt: skip
        # Recoveries reuse the session, and nothing is added to the graph once training started.
        script.record.write(event="graph", sessions_created=sessions.created, sessions_asked=creator.sessions_created,
                            ops_at_start=ops_at_start, ops_at_end=len(graph.get_operations()))  # fmt: skip
    return weights or [], state, detached


class SessionCount(tf.compat.v1.train.SessionCreator):
    """Counts the sessions a creator really creates (``ElasticSessionCreator`` keeps one through recoveries)."""

    def __init__(self, inner: tf.compat.v1.train.SessionCreator):
        self.inner = inner
        self.created = 0

    def create_session(self) -> tf.compat.v1.Session:
        self.created += 1
        return self.inner.create_session()


def accuracy(weights: list[np.ndarray], script: Script) -> float:
    model = build_model(script.args)
    model.set_weights(weights)
    return float(np.mean(model.predict(script.x_test, verbose=0).argmax(axis=1) == script.y_test))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(SEED)
    script = Script(args)
    train = {"function": train_function_api, "keras": train_keras_api, "v1": train_v1_api}[args.api]
    start = time.time()
    weights, state, detached = train(script)
    script.record.end(weights, state, detached, args.api, script.slots)
    plan = getattr(script.optimizer, "_kungfu_plan", None)
    if plan is not None and not detached:
        results = getattr(getattr(script.optimizer, "_kungfu_strategy", None), "results", [])
        found = ", ".join(f"{r.best.id!r} for {r.cluster.replicas} workers" for r in results)
        print(f"[elastic_train] strategy {plan.strategy.id!r} at {kungfu_tf.size()} workers; Auto's results: "
              f"{found or 'none'}", flush=True)  # fmt: skip
    if detached:
        print(f"[elastic_train] {os.environ.get('KUNGFU_SELF', 'local')} detached at step {state.step}", flush=True)
        return 0
    flat = np.concatenate([w.reshape(-1) for w in weights]).astype(np.float32)
    same = bool(ops.consensus(tf.constant(flat), name="elastic_train/final-weights"))
    if kungfu_tf.rank() == 0:
        print(f"[elastic_train] api {args.api}  workers {kungfu_tf.size()}  steps {state.step}  epochs {state.epoch}  "
              f"{time.time() - start:.1f} s  held-out accuracy {accuracy(weights, script):.3f}  "
              f"identical weights on all workers: {same}", flush=True)  # fmt: skip
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
