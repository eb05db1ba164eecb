"""The workload of the autoscaling tests and benchmark: an elastic job that may resize itself.

    kungfu-run --elastic --max-np 3 -np 1 python models/autoscale_train.py --policy autoscaling --samples 60000
    kungfu-run --elastic --max-np 3 -np 2 python models/autoscale_train.py --policy straggler --record /tmp/r.jsonl
    kungfu-run --elastic --max-np 4 -np 1 python models/autoscale_train.py --policy autoscaling \\
        --price 2.0 --utility linear --utility-value 1.0 --deadline 600

A custom loop inside ``kungfu_tf.elastic.run``: an MLP classifier on
synthetic data (generated from ``--seed``, no download) trained with
``SynchronousSGDOptimizer`` and a ``GradientMonitor(gns=False)`` (each
worker's compute time rides on the gradient all-reduce), driven by a
``PolicyRunner`` that ``ElasticState(policy=runner)`` carries to joiners.
Every worker keeps its ``--batch-size`` (the global batch grows with the
cluster, as in Or et al.), so the job trains ``--samples`` samples in fewer
steps on more workers. One TF thread per worker: a step uses one core,
which makes the throughput of k workers a question of how many cores
(or how much of a cgroup CPU quota) the job has. ``--wait-ms`` adds time
per step that uses no CPU (a stand-in for waiting on an accelerator or the
input), so a CPU quota of Q cores holds about Q / (1 - wait share) workers.

``--pace-step-ms T --pace-rate R`` instead fix the throughput curve by
construction, whatever the CPU: every step of every worker is padded to
``max(T, size * batch / R)`` seconds, so the job trains
``min(size * batch / T, R)`` samples/s at any size (as long as a step's own
work takes less than its period). The efficient size is then
``R * T / batch`` on an idle and on a loaded machine alike: the tests judge
the policies on that curve, the benchmarks on a real CPU quota.
``--after-settled N`` ends the job N steps after the policy settled and the
cluster reached the settled size (instead of after ``--samples``), so a
slow machine, where joiners take longer to start, still sees the job settle.

Policies (``--policy``): ``none``; ``autoscaling`` (``AutoscalingPolicy``:
add ``--scale-by`` workers every ``--scale-every`` steps while the scaling
efficiency stays above ``--efficiency-threshold`` and, with ``--price`` and
``--utility``, while the marginal utility exceeds the marginal cost);
``provisioning`` (``ResourceProvisioningPolicy``: KungFu Fig. 6, ``--alpha``);
``straggler`` (``StragglerPolicy``: ``--straggler-threshold``); ``schedule``
(``--resize-at STEP:SIZE,...``: fixed resizes, to test the workload itself).

``--record FILE``: every worker appends JSON lines to FILE (one ``write``
per line, O_APPEND): ``{"event": "step", "step", "t0", "t1", "size", "rank",
"peer", "samples", "throughput", "compute_time", "checksum"}`` per committed
step (``checksum``: the sum of the weights after it, equal on all workers),
``{"event": "decision", ...}`` for each of the runner's decisions and log
lines (rank 0), ``{"event": "change", ...}`` per membership change, and
``{"event": "end", "weights_sha256", ...}`` per worker that finished in the
cluster (detached workers write ``"detached": true``). Rank 0 prints a last
line ``[autoscale_train] done ...`` with the completion time and whether the
final weights are identical on all workers (a consensus over them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Any

# One thread per worker, before TensorFlow starts: a step uses one core.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import keras
import numpy as np
import tensorflow as tf

import kungfu_tf
from kungfu_tf import elastic, ops
from kungfu_tf.optimizers import GradientMonitor, SynchronousSGDOptimizer
from kungfu_tf.policy import BasePolicy, PolicyRunner

POLICIES = ("none", "autoscaling", "provisioning", "straggler", "schedule")
UTILITIES = ("none", "linear", "step")
CLASSES = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="none", choices=POLICIES)
    p.add_argument("--samples", type=int, default=40_000, help="train this many samples in all (the job's work)")
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps (before --samples if sooner)")
    p.add_argument("--batch-size", type=int, default=2048, help="per-worker batch size (the global batch is size x this)")
    p.add_argument("--features", type=int, default=64, help="input width of the synthetic data")
    p.add_argument("--hidden", type=int, default=512, help="width of each hidden layer")
    p.add_argument("--layers", type=int, default=3, help="hidden layers")
    p.add_argument("--bank", type=int, default=8192, help="synthetic samples generated (batches cycle over them)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--lr-rule", default=None, choices=("linear", "sqrt", "adascale"),
                   help="how the learning rate follows the global batch (a resize's change too)")
    p.add_argument("--on-resize", default="keep_local", choices=("keep_local", "keep_global"),
                   help="what a resize does to the batch (PolicyRunner(on_resize=))")
    p.add_argument("--max-global-batch", type=int, default=None,
                   help="keep_local: the largest global batch; past it the per-worker batch shrinks")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--wait-ms", type=float, default=0.0, help="time per step that uses no CPU (see the docstring)")
    p.add_argument("--pace-step-ms", type=float, default=0.0,
                   help="pad every step to at least this many ms (the fixed throughput curve; see the docstring)")
    p.add_argument("--pace-rate", type=float, default=0.0,
                   help="with --pace-step-ms: the job's samples/s cap (steps padded to size * batch / rate)")
    p.add_argument("--after-settled", type=int, default=None,
                   help="end this many steps after the policy settled at its size (instead of after --samples)")
    # Policy parameters.
    p.add_argument("--scale-every", type=int, default=10,
                   help="autoscaling/provisioning: steps measured per size; straggler: steps between checks")
    p.add_argument("--scale-by", type=int, default=1, help="autoscaling: workers added at a time (K)")
    p.add_argument("--efficiency-threshold", type=float, default=0.3, help="autoscaling: the scaling efficiency S")
    p.add_argument("--warmup-steps", type=int, default=2, help="steps after a size change left out of the statistics")
    p.add_argument("--price", type=float, default=None, help="autoscaling: price per worker-hour (with --utility)")
    p.add_argument("--utility", default="none", choices=UTILITIES, help="autoscaling: utility of the completion time")
    p.add_argument("--utility-value", type=float, default=1.0, help="utility of an instant job (linear) / of the first step")
    p.add_argument("--deadline", type=float, default=600.0, help="seconds at which the linear utility reaches 0 / the step's deadline")
    p.add_argument("--alpha", type=float, default=0.33, help="provisioning: keep a worker if throughput grew > 1 + alpha/size")
    p.add_argument("--straggler-threshold", type=float, default=0.8, help="straggler: fraction of the median")
    p.add_argument("--straggler-alpha", type=float, default=0.1, help="straggler: EWMA weight of the newest fraction")
    p.add_argument("--resize-at", default="", help="schedule: STEP:SIZE,... resize after that many steps")
    p.add_argument("--record", default=None, help="append JSON lines here (see the docstring)")
    p.add_argument("--log-dir", default=None, help="TensorBoard logs of the policy runner (rank 0)")
    p.add_argument("--quiet", action="store_true", help="the runner does not print its decisions")
    args = p.parse_args(argv)
    for name in ("samples", "batch_size", "features", "hidden", "layers", "bank", "scale_every", "scale_by"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be positive, got {args.steps}")
    for name in ("wait_ms", "pace_step_ms", "pace_rate"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.pace_rate and not args.pace_step_ms:
        p.error("--pace-rate needs --pace-step-ms (the step period below the cap)")
    if args.after_settled is not None and (args.after_settled < 1 or args.policy not in ("autoscaling", "provisioning",
                                                                                           "schedule")):
        p.error(f"--after-settled must be positive and needs --policy autoscaling, provisioning or schedule, got "
                f"{args.after_settled} with --policy {args.policy}")  # fmt: skip
    try:
        args.schedule = {int(a): int(b) for a, b in (part.split(":") for part in args.resize_at.split(",") if part)}
    except ValueError:
        p.error(f"--resize-at must be STEP:SIZE,... (e.g. 5:2,20:1), got {args.resize_at!r}")
    if (args.price is None) != (args.utility == "none"):
        p.error(f"--price and --utility go together (got --price {args.price}, --utility {args.utility})")
    return args


def make_utility(args: argparse.Namespace) -> Any:
    """The utility of the job's completion time that ``--utility`` names (None for "none")."""
    from kungfu_tf.policy import LinearUtility, StepUtility

    if args.utility == "linear":
        return LinearUtility(value=args.utility_value, deadline=args.deadline)
    if args.utility == "step":  # worth the full value by the deadline, half by twice it, nothing later
        return StepUtility([(args.deadline, args.utility_value), (2 * args.deadline, args.utility_value / 2)])
    return None


def make_policy(args: argparse.Namespace) -> BasePolicy | None:
    """The ``--policy`` with its parameters (imported only when used)."""
    if args.policy == "autoscaling":
        from kungfu_tf.policy import AutoscalingPolicy

        utility = make_utility(args)
        return AutoscalingPolicy(scale_every=args.scale_every, scale_by=args.scale_by,
                                 efficiency_threshold=args.efficiency_threshold, warmup_steps=args.warmup_steps,
                                 utility=utility, price_per_worker_hour=args.price,
                                 total_samples=args.samples if utility else None)  # fmt: skip
    if args.policy == "provisioning":
        from kungfu_tf.policy import ResourceProvisioningPolicy

        return ResourceProvisioningPolicy(every=args.scale_every, alpha=args.alpha, warmup_steps=args.warmup_steps)
    if args.policy == "straggler":
        from kungfu_tf.policy import StragglerPolicy

        return StragglerPolicy(threshold=args.straggler_threshold, alpha=args.straggler_alpha, every=args.scale_every,
                               warmup_steps=args.warmup_steps)  # fmt: skip
    if args.policy == "schedule":
        return ScheduledResize(args.schedule)
    return None


class ScheduledResize(BasePolicy):
    """Asks for ``schedule[step]`` workers after that step (a growth is applied once joiners are ready)."""

    def __init__(self, schedule: dict[int, int]):
        self.schedule = dict(schedule)

    @property
    def settled(self) -> bool:
        """True once the last resize of the schedule was asked for (``--after-settled`` counts from there)."""
        return bool(self.schedule) and self._last_asked

    @property
    def settled_size(self) -> int | None:
        return self.schedule[max(self.schedule)] if self.schedule else None

    _last_asked = False

    def after_step(self, ctx: Any) -> None:
        size = self.schedule.get(ctx.step)
        if size is not None and size != ctx.size:
            ctx.resize(size, reason=f"--resize-at {ctx.step}:{size}")
        if self.schedule and ctx.step >= max(self.schedule):
            self._last_asked = True

    def state_dict(self) -> dict[str, Any]:
        return {"schedule": {str(k): v for k, v in self.schedule.items()}, "last_asked": self._last_asked}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.schedule = {int(k): v for k, v in state["schedule"].items()}
        self._last_asked = bool(state.get("last_asked", False))


def synthetic_data(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """``--bank`` samples: Gaussian inputs labelled by a random two-layer teacher (learnable, not trivial)."""
    rng = np.random.default_rng(args.seed)
    x = rng.normal(size=(args.bank, args.features)).astype(np.float32)
    w1 = rng.normal(size=(args.features, 32)) / np.sqrt(args.features)
    w2 = rng.normal(size=(32, CLASSES))
    y = np.argmax(np.tanh(x @ w1) @ w2, axis=1).astype(np.int32)
    return x, y


def build_model(args: argparse.Namespace) -> keras.Model:
    """The MLP, with the same initial weights on every worker (seeded)."""
    keras.utils.set_random_seed(args.seed)
    layers = [keras.Input((args.features,))]
    layers += [keras.layers.Dense(args.hidden, activation="relu") for _ in range(args.layers)]
    layers.append(keras.layers.Dense(CLASSES))
    return keras.Sequential(layers)


class Record:
    """JSON lines appended to ``--record`` by every worker (one ``os.write`` per line, so lines never mix)."""

    def __init__(self, path: str | None):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if path else None
        self.peer = os.environ.get("KUNGFU_SELF", "local")

    def write(self, event: str, **fields: Any) -> None:
        if self.fd is not None:
            line = json.dumps({"event": event, "peer": self.peer, "pid": os.getpid(), **fields}) + "\n"
            os.write(self.fd, line.encode())

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Workload:
    """Model, data, runner and elastic state of one worker; :meth:`train` is the elastic training function."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.x, self.y = synthetic_data(args)
        self.model = build_model(args)
        self.monitor = GradientMonitor(batch_size=args.batch_size, gns=False)
        self.optimizer = SynchronousSGDOptimizer(keras.optimizers.SGD(args.lr), monitor=self.monitor)
        self.optimizer.build(self.model.trainable_variables)
        policy = make_policy(args)
        self.policy = policy
        self.runner = PolicyRunner([policy] if policy else [], batch_size=args.batch_size * kungfu_tf.size(),
                                   optimizer=self.optimizer, log_dir=args.log_dir, verbose=not args.quiet,
                                   lr_rule=args.lr_rule, on_resize=args.on_resize,
                                   max_global_batch_size=args.max_global_batch)  # fmt: skip
        self.state = elastic.ElasticState(lambda: self.model.variables + list(self.optimizer.variables),
                                          policy=self.runner, samples=0, settled_step=-1)  # fmt: skip
        self.record = Record(args.record)
        self.decisions_written = 0
        self.log_lines_written = 0
        self.seen_change: Any = None
        loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model, optimizer = self.model, self.optimizer

        @tf.function(input_signature=(tf.TensorSpec([None, args.features]), tf.TensorSpec([None], tf.int32)))
        def train_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = loss_object(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        self.train_step = train_step

    def checksum(self) -> float:
        """Sum of all weights in float64: equal on every worker after each step iff they stayed in sync (~1 ms)."""
        return float(sum(np.sum(w.numpy(), dtype=np.float64) for w in self.model.trainable_weights))

    def local_batch(self) -> int:
        """This step's per-worker batch: the runner's (``--on-resize`` decides how it follows the cluster)."""
        return int(self.runner.local_batch_size.numpy())

    def batch(self, samples: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """This worker's share of the global batch that starts at sample ``samples`` (cycling over the bank)."""
        b = self.local_batch()
        ids = (samples + rank * b + np.arange(b)) % self.args.bank
        return self.x[ids], self.y[ids]

    def finished(self) -> bool:
        s = self.state
        if self.args.after_settled is not None:
            return s.settled_step >= 0 and s.step - s.settled_step >= self.args.after_settled
        return s.samples >= self.args.samples or (self.args.steps is not None and s.step >= self.args.steps)

    def step_period(self, size: int, local: int) -> float:
        """Seconds a step is padded to (``--pace-step-ms``/``--pace-rate``): the fixed throughput curve."""
        period = self.args.pace_step_ms / 1000
        if self.args.pace_rate:
            period = max(period, size * local / self.args.pace_rate)
        return period

    def note_settled(self, size: int) -> None:
        """Marks the first step at which the policy has settled and the cluster has its settled size (all workers)."""
        policy = self.policy
        if self.state.settled_step < 0 and getattr(policy, "settled", False) and policy.settled_size == size:
            self.state.settled_step = self.state.step

    def warm_up(self, state: elastic.ElasticState) -> None:
        """A joiner traces the step alone before it is admitted (no peers yet: the all-reduce is local)."""
        self.train_step(*self.batch(0, 0))

    def note_change(self) -> bool:
        """Records a membership change applied since the last call; True if there was one."""
        change = self.state.last_change
        if change is None or change is self.seen_change:
            return False
        self.seen_change = change
        self.record.write("change", step=self.state.step, t=time.time(), old_size=len(change.old_peers),
                          new_size=len(change.new_peers), peers=list(change.new_peers), lost=list(change.lost),
                          detached=bool(change.detached))  # fmt: skip
        return True

    def write_decisions(self) -> None:
        """Rank 0 records the runner's decisions and its policies' log lines that are new."""
        history = self.runner.history
        lines = getattr(self.runner, "log_lines", [])
        # A rank 0 that a resize has just removed reads rank 0 too: the new rank 0 writes the lines of that step.
        if kungfu_tf.rank() == 0 and not self.runner.detached:
            for d in history[self.decisions_written :]:
                self.record.write("decision", step=d.step, t=time.time(), name=d.name, old=d.old, new=d.new,
                                  by=d.requested_by, reason=d.reason, refused=d.refused, text=str(d))  # fmt: skip
            decided = {str(d) for d in history}  # the runner logs its decisions too
            for line in lines[self.log_lines_written :]:
                if str(line) in decided:
                    continue
                self.record.write("decision", step=self.state.step, t=time.time(), name="log", text=str(line))
        self.decisions_written, self.log_lines_written = len(history), len(lines)

    def restart_runner(self) -> None:
        """Every member starts the runner again together (its setup round is a collective).

        The runner already follows the new cluster (it listens to applied
        membership changes), and ``before_train`` entered again in the same
        process keeps its counters; a joiner adopts the state the sync gave it.
        """
        self.runner.before_train()

    def train(self, state: elastic.ElasticState) -> bool:
        """Trains until ``--samples``; True if this worker left the cluster (detached)."""
        # Entered at the start, after a join and after a recovery: every member
        # starts the runner again together (as the Keras PolicyCallback does when
        # elastic_fit re-enters fit); a restored runner adopts the synced state.
        self.note_change()
        self.restart_runner()
        while not self.finished():
            rank, size, local = kungfu_tf.rank(), kungfu_tf.size(), self.local_batch()
            xb, yb = self.batch(state.samples, rank)
            with self.runner.step():
                t0, started = time.time(), time.perf_counter()
                self.train_step(xb, yb)
                if self.args.wait_ms:
                    time.sleep(self.args.wait_ms / 1000)
                period = self.step_period(size, local)
                if period:
                    time.sleep(max(0.0, started + period - time.perf_counter()))
                t1 = time.time()
                state.samples += local * size
                state.commit()
            metrics = self.runner.context.metrics
            self.record.write("step", step=state.step - 1, t0=t0, t1=t1, size=size, rank=rank, local_batch=local,
                              learning_rate=float(self.optimizer.learning_rate.numpy()),
                              samples=state.samples, throughput=local * size / (t1 - t0),
                              compute_time=_number(metrics.get("compute_time")),
                              checksum=self.checksum())  # fmt: skip
            self.write_decisions()
            if self.runner.detached:
                return True
            self.note_settled(size)
            state.check()
            if self.note_change():  # a joiner admitted by check(), a shrink the policy applied, ...
                self.restart_runner()
        self.runner.after_train()
        self.write_decisions()
        return False

    def end(self, detached: bool, start: float) -> bool:
        """Writes the end record; rank 0 prints the summary. True if the final weights agree."""
        weights = [w.numpy() for w in self.model.trainable_weights]
        flat = np.concatenate([w.reshape(-1) for w in weights]).astype(np.float32)
        digest = hashlib.sha256(flat.tobytes()).hexdigest()
        same = True
        if not detached:
            same = bool(ops.consensus(tf.constant(flat), name="autoscale_train/final-weights"))
        self.record.write("end", step=self.state.step, samples=self.state.samples, t=time.time(), detached=detached,
                          weights_sha256=digest, same=same, size=None if detached else kungfu_tf.size())  # fmt: skip
        self.record.close()
        if not detached and kungfu_tf.rank() == 0:
            print(f"[autoscale_train] done: policy {self.args.policy}  workers {kungfu_tf.size()}  steps {self.state.step}  "
                  f"samples {self.state.samples}  {time.time() - start:.1f} s  "
                  f"identical weights on all workers: {same}", flush=True)  # fmt: skip
        return same


def _number(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    start = time.time()
    work = Workload(args)
    detached = bool(elastic.run(work.train, warm_up=work.warm_up)(work.state))
    return 0 if work.end(detached, start) else 1


if __name__ == "__main__":
    sys.exit(main())
