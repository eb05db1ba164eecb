"""Worker of the elastic-transition benchmark (benchmarks/elastic/run.py).

Trains an MLP on scikit-learn's digits with ``SynchronousSGDOptimizer`` (SGD
with momentum, so the optimizer has state to carry) in a ``tf.function``
step, at a fixed global batch split over the current workers, and logs
every committed step's end time (elastic_idle.StepLog) for the idle-time
analysis. Two modes:

* ``--mode restart`` — one job of a checkpoint-restart chain: restore the
  checkpoint (``--restore``) or start from rank 0's weights, train
  ``--steps`` steps, rank 0 writes a ``tf.train.Checkpoint`` of the model,
  the optimizer and the step counter (``--save``), and every process exits.
  With ``--crash-rank R`` that worker SIGKILLs itself after the save instead
  (the others are then inside the next step's all-reduce and the launcher
  stops the job): the "stop every process" of a crash.
* ``--mode elastic`` — one ``kungfu-run --elastic`` job that runs the whole
  ``--schedule`` (e.g. ``shrink:2,grow:4,shrink:1,grow:4,crash:3,replace:4``:
  kind and size after, see run_elastic) with ``--steps`` steps between
  transitions, through kungfu_tf.elastic.

The global sample order is a seeded permutation; the data position is the
step counter (global batch fixed), so it is part of the checkpoint and of
the elastic state.
"""

from __future__ import annotations

import time

T_START = time.time()  # before the heavy imports: the restart break-down counts them

import argparse
import os
import signal
import statistics
import sys
import threading
from pathlib import Path

import numpy as np

from benchmarks.elastic.idle import StepLog

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))

# Hidden layers of the models: the digits MLP of the other benchmarks, a wide
# one whose state (8.5 M parameters + momentum = 68 MB) makes the transfer to
# joiners and the checkpoint matter, and one of ResNet-50's size (26 M
# parameters, 208 MB with momentum).
MODELS = {"digits-mlp": (256, 256), "wide-mlp": (2048, 2048, 2048), "resnet50-size-mlp": (3584, 3584, 3584)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", required=True, choices=("restart", "elastic"))
    p.add_argument("--model", default="digits-mlp", choices=sorted(MODELS))
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=8, help="steps per segment (between two transitions)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--log-dir", required=True, help="where each process writes its step log")
    # restart mode
    p.add_argument("--job-index", type=int, default=0, help="restart: position of this job in the chain")
    p.add_argument("--restore", help="restart: checkpoint prefix to restore")
    p.add_argument("--save", help="restart: checkpoint prefix rank 0 writes after the last step")
    p.add_argument("--crash-rank", type=int, help="this rank SIGKILLs itself (restart: after the save)")
    # elastic mode
    p.add_argument("--schedule", default="", help="elastic: comma-separated transitions (elastic.py)")
    p.add_argument("--wait-timeout", type=float, default=180.0, help="elastic: longest wait for joiners (s)")
    return p.parse_args(argv)


class Trainer:
    """The model, optimizer, data and traced step every mode shares."""

    def __init__(self, args: argparse.Namespace) -> None:
        import keras
        import tensorflow as tf
        from digits import build_digits_mlp, load_digits_split

        from kungfu_tf.optimizers import SynchronousSGDOptimizer

        keras.utils.set_random_seed(args.seed)
        self.x, self.y, _, _ = load_digits_split(test_fraction=0.2, seed=0)
        self.order = np.random.default_rng(args.seed).permutation(len(self.y))
        self.global_batch = args.global_batch
        self.model = build_digits_mlp(hidden=MODELS[args.model], seed=args.seed)
        self.optimizer = SynchronousSGDOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9))
        self.optimizer.build(self.model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model, optimizer = self.model, self.optimizer

        # One trace for every local batch size: a resize changes the batch, never the graph.
        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32), tf.TensorSpec([None], tf.int32)])
        def train_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        self.train_step = train_step

    @property
    def variables(self) -> list:
        """Everything a restarted or joining worker must receive: weights and optimizer slots."""
        return list(self.model.variables) + list(self.optimizer.variables)

    def batch(self, step: int, rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        """This worker's contiguous share of global batch ``step`` (lower ranks take the extra sample)."""
        ids = self.order[(step * self.global_batch + np.arange(self.global_batch)) % len(self.order)]
        mine = np.array_split(ids, size)[rank]
        return self.x[mine], self.y[mine]

    def run_step(self, step: int, rank: int, size: int) -> float:
        """One synchronous step on global batch ``step``; returns once its result exists."""
        return float(self.train_step(*self.batch(step, rank, size)))


def probe_samples() -> int:
    """AUTO's probe samples started on this worker so far (a step whose count grew carried some).

    Logged with every step: the analysis (benchmarks/elastic/idle.py) keeps
    steps that carry probe samples out of the normal step time and reports
    them apart, since they are AUTO measuring a new layout, not the transition.
    """
    from kungfu_tf.ops import auto_probe_samples

    return int(auto_probe_samples())


def configure_tf() -> None:
    import tensorflow as tf

    # 2 cores shared by 4 workers: one thread each keeps them from fighting.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)


# --------------------------------------------------------------------------- restart
def run_restart(args: argparse.Namespace) -> None:
    """One job of the checkpoint-restart chain (module docstring)."""
    configure_tf()
    import tensorflow as tf

    import kungfu_tf
    from kungfu_tf import ops

    rank, size = kungfu_tf.rank(), kungfu_tf.size()
    # Ports are picked afresh per job and may repeat: the job index keeps peers of different jobs apart.
    peer = f"job{args.job_index}/{os.environ.get('KUNGFU_SELF', 'local')}"
    log = StepLog(args.log_dir, f"restart-job{args.job_index}", job=args.job_index, version=1, peer=peer, rank=rank)
    log.event("start", t=T_START)
    trainer = Trainer(args)
    step = tf.Variable(0, dtype=tf.int64, name="global_step")
    checkpoint = tf.train.Checkpoint(model=trainer.model, optimizer=trainer.optimizer, step=step)
    if args.restore:
        t0 = time.time()
        checkpoint.read(args.restore).assert_consumed()
        log.event("restore", t0=t0, step=int(step))
    else:
        kungfu_tf.broadcast_variables(trainer.variables, root=0, name="init/state")
    log.event("ready", step=int(step))
    for _ in range(args.steps):
        trainer.run_step(int(step), rank, size)
        step.assign_add(1)
        log.event("step", step=int(step), size=size, probe=probe_samples())
    if args.save:
        if rank == 0:
            t0 = time.time()
            checkpoint.write(args.save)
            log.event("save", t0=t0, step=int(step))
        ops.barrier()  # the checkpoint is complete before anyone stops (or crashes)
    if args.crash_rank is not None:
        if rank == args.crash_rank:
            log.event("kill")
            os.kill(os.getpid(), signal.SIGKILL)
        # The others wait in the next step's all-reduce until the launcher stops them.
        trainer.run_step(int(step), rank, size)
        raise SystemExit(f"rank {rank}: the step after rank {args.crash_rank}'s crash completed")
    log.event("exit", step=int(step))


# --------------------------------------------------------------------------- elastic
def parse_schedule(text: str) -> list[tuple[str, int]]:
    """``"shrink:2,grow:4,crash:3,replace:4"`` -> [(kind, size after), ...]; ValueError naming a bad item.

    Example:
        >>> parse_schedule("shrink:2,grow:4")
        [('shrink', 2), ('grow', 4)]
    """
    out = []
    for item in filter(None, text.split(",")):
        kind, _, size = item.partition(":")
        if kind not in ("shrink", "grow", "crash", "replace") or not size.isdigit() or int(size) < 1:
            raise ValueError(f"--schedule item {item!r} is not shrink|grow|crash|replace:<size>")
        out.append((kind, int(size)))
    return out


def run_elastic(args: argparse.Namespace) -> None:
    """The whole schedule in one elastic job (module docstring); joiners enter through elastic.run.

    The schedule position (``segment``, ``seg_steps``, ``waiting_for``) is
    part of the synced elastic state, so every member, joiners included,
    takes the same decision at the same step:

    * ``shrink:n`` — every member calls ``resize(n)`` after ``--steps`` steps;
      ranks >= n are detached and end;
    * ``grow:n`` — ``resize(n)`` asks for n workers and returns at once; the
      members go on training while the launcher's joiners warm up, and
      ``state.check()`` admits them when they are ready;
    * ``crash:n`` — rank ``--crash-rank`` SIGKILLs itself half a step into the
      next step; the others' step fails and elastic.run recovers without it;
    * ``replace:n`` — wait (training) until the launcher's replacement joined.
    """
    configure_tf()
    import logging

    import tensorflow as tf

    from kungfu_tf import elastic

    # Each sync's duration and sources in the worker's log (kungfu-run --logdir), to explain the idle times.
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("kungfu_tf.elastic").setLevel(logging.INFO)
    from kungfu_tf.ops import config

    schedule = parse_schedule(args.schedule)
    me = os.environ.get("KUNGFU_SELF", "local")
    joiner = elastic.is_joiner()
    log = StepLog(args.log_dir, "elastic", job=0, peer=me)
    log.event("start", t=T_START, joiner=joiner)
    trainer = Trainer(args)
    # waiting_for: the size a grow/replace waits for; past_version: a crash waits for a version after it.
    state = elastic.ElasticState(trainer.variables, segment=0, seg_steps=0, waiting_for=0, past_version=0)
    recent: list[float] = []  # this worker's last step times (for the crash's timing)
    waiting_since: list[float] = []

    def warm_up(_state: elastic.ElasticState) -> None:
        # Alone (a one-worker cluster): trace the step and run it once; the sync overwrites the result.
        t0 = time.time()
        trainer.run_step(0, 0, 1)
        log.event("warm", t0=t0)

    def crash_soon() -> None:
        delay = 0.5 * (statistics.median(recent) if recent else 0.01)

        def kill() -> None:
            log.event("kill")
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(delay, kill).start()

    @elastic.run(warm_up=warm_up)
    def train(state: elastic.ElasticState) -> None:
        while True:
            state.check()
            rank, size = int(config.rank()), int(config.cluster_size())
            version = int(config.cluster_version())
            kind, target = schedule[state.segment] if state.segment < len(schedule) else ("end", size)
            if state.waiting_for or state.past_version:
                # Joiners admitted / the crashed worker gone (its replacement may be in already).
                if size == state.waiting_for or (state.past_version and version > state.past_version):
                    state.segment, state.seg_steps, state.waiting_for, state.past_version = state.segment + 1, 0, 0, 0
                    waiting_since.clear()
                    continue
                if not waiting_since:
                    waiting_since.append(time.time())
                elif time.time() - waiting_since[0] > args.wait_timeout:
                    raise SystemExit(f"{kind}: the cluster did not reach {target} workers in {args.wait_timeout:g} s")
            elif state.seg_steps >= args.steps:
                if kind == "end":  # --steps steps after the last transition, as in the restart chain
                    return
                log.event("transition", kind=kind, target=target, size=size, version=version)
                if kind == "shrink":
                    _, detached = elastic.resize(target)
                    if bool(detached):
                        log.event("detached")
                        return
                    state.segment, state.seg_steps = state.segment + 1, 0
                    continue
                if kind == "grow":
                    elastic.resize(target)  # asynchronous: returns before the joiners are admitted
                if kind == "crash":
                    state.past_version = version
                    if rank == args.crash_rank:
                        crash_soon()
                else:
                    state.waiting_for = target
            t0 = time.time()
            try:
                trainer.run_step(state.step, rank, size)
            except tf.errors.OpError as e:
                log.event("step_failed", error=" ".join(str(e.message).split())[:300])
                raise
            state.commit()
            state.seg_steps += 1
            t1 = time.time()
            recent[:] = [*recent[-4:], t1 - t0]
            log.event("step", t=t1, t0=t0, step=state.step, size=size, version=version, rank=rank,
                      probe=probe_samples())  # fmt: skip

    train(state)
    log.event("exit", step=state.step)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.mode == "restart":
        run_restart(args)
    else:
        run_elastic(args)


if __name__ == "__main__":
    main()
