"""Worker for tests/test_concurrency.py: hundreds of named collectives at once.

Usage: concurrency.py NP

(a) One tf.function holding N_OPS all-reduces with explicit names, created in
    a rank-specific random order: keys must match by name, not by creation
    order, and the ops must all be in flight together (an executor running
    them one at a time in creation order would deadlock, since every rank
    has a different order).
(b) The same number of named all-reduces issued eagerly from 8 Python threads
    per worker, each thread's share and start order chosen per rank.

Ends with "checked N results" (N = 3 * N_OPS + N_OPS + 1).
"""

from __future__ import annotations

import random
import sys
import threading
import time

import _setup
from _setup import Checker, make_input, np, ops, reduce_ref, tf

N_OPS = 320
STEPS = 3
THREADS = 8
SIZES = (1, 7, 64, 1001, 5000)
BIG = 300_000  # 1.2 MB of float32: several 1 MiB chunks
DTYPES = ("float32", "int32", "float64")


def spec(i: int) -> tuple[str, tuple[int, ...], str, str]:
    """(name, shape, dtype, op) of collective i (the same on every worker)."""
    size = BIG if i % 40 == 39 else SIZES[i % len(SIZES)]
    dtype = DTYPES[i % len(DTYPES)]
    op = "max" if i % 3 == 2 else "sum"
    return f"conc/{i:03d}", (size,), dtype, op


def inputs(tag: str, i: int, size: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Every rank's input of collective i and the expected result."""
    _, shape, dtype, op = spec(i)
    xs = [make_input(f"{tag}/{i}", r, shape, dtype, "small" if op == "sum" else "big") for r in range(size)]
    return xs, reduce_ref(xs, op, dtype)


def part_a(chk: Checker, rank: int, size: int) -> None:
    order = list(range(N_OPS))
    random.Random(1000 + rank).shuffle(order)

    @tf.function
    def step(xs):
        # Created in this rank's order; keys come from name=.
        out = {}
        for i in order:
            name, _, _, op = spec(i)
            out[name] = ops.all_reduce(xs[name], op=op, name=name)
        return out

    for s in range(STEPS):
        data = {spec(i)[0]: inputs(f"fn{s}", i, size) for i in range(N_OPS)}
        feed = {name: tf.constant(xs[rank]) for name, (xs, _) in data.items()}
        t = time.monotonic()
        got = step(feed)
        print(f"tf.function step {s}: {N_OPS} all-reduces in {time.monotonic() - t:.2f}s", flush=True)
        for name, (_, want) in sorted(data.items()):
            chk.equal(got[name].numpy(), want, f"tf.function step {s} {name}")
    if step.experimental_get_tracing_count() != 1:  # each trace has new keys
        chk.fail(f"step was traced {step.experimental_get_tracing_count()} times")


def part_b(chk: Checker, rank: int, size: int) -> None:
    # Thread t on every rank runs chain t's ops in one fixed order: eager
    # collectives block their thread, so a per-rank order *within* a thread
    # could leave every thread of two workers waiting on keys the other has
    # not reached (a deadlock by construction). What differs per rank is
    # which thread runs which chain, when each starts, and the pauses.
    rng = random.Random(2000 + rank)
    chains = [list(range(c, N_OPS, THREADS)) for c in range(THREADS)]
    rng.shuffle(chains)
    delays = [[rng.uniform(0, 0.003) for _ in chain] for chain in chains]
    lock = threading.Lock()
    state = {"in_flight": 0, "max_in_flight": 0}
    results: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    errors: list[BaseException] = []
    data = {i: inputs("eager", i, size) for i in range(N_OPS)}

    def worker(chain: list[int], pauses: list[float]) -> None:
        try:
            for i, pause in zip(chain, pauses):
                time.sleep(pause)
                name, _, _, op = spec(i)
                x = tf.constant(data[i][0][rank])
                with lock:
                    state["in_flight"] += 1
                    state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
                try:
                    y = ops.all_reduce(x, op=op, name=name).numpy()
                finally:
                    with lock:
                        state["in_flight"] -= 1
                with lock:
                    results[name] = (y, data[i][1])
        except tf.errors.OpError as e:  # reported by the main thread (others by threading)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(c, d)) for c, d in zip(chains, delays)]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    print(f"eager: {N_OPS} all-reduces from {THREADS} threads in {time.monotonic() - t:.2f}s, "
          f"at most {state['max_in_flight']} in flight", flush=True)
    if errors:
        chk.fail(f"eager thread failed: {errors[0]!r}")
    if any(th.is_alive() for th in threads):
        chk.fail("eager threads still running after 120s")
    if len(results) != N_OPS:
        chk.fail(f"only {len(results)} of {N_OPS} eager results")
    for name, (got, want) in sorted(results.items()):
        chk.equal(got, want, f"eager {name}")
    # The threads really overlapped inside the runtime (the GIL is released).
    chk.true(state["max_in_flight"] >= 2, f"at most {state['max_in_flight']} eager collectives in flight")


def main() -> None:
    size = int(sys.argv[1])
    rank = _setup.env_rank()
    chk = Checker(rank)
    part_a(chk, rank, size)
    part_b(chk, rank, size)
    chk.done()


if __name__ == "__main__":
    main()
