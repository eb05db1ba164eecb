"""Worker for tests/test_collectives.py: the collective matrix on one job.

Usage: collectives.py NP

For each mode (eager, tf.function, tf.compat.v1 Graph + Session) and each
topology (switched with set_topology in that mode) it runs every collective
on every dtype and shape and checks every output against numpy. It also
checks the configuration ops, a timed barrier, mean on integers, and one
64 MiB all-reduce and broadcast. Ends with "checked N results"; the test
knows N (see expected_checks() in test_collectives.py).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import _setup
from _setup import (
    DTYPES,
    FLOAT_DTYPES,
    TOPOLOGIES,
    Checker,
    make_input,
    np,
    ops,
    reduce_ref,
    tf,
    tolerance,
)

import kungfu_tf

SHAPES = ((0,), (), (7, 11, 13))  # sizes 0, 1 and the odd 1001
REDUCE_OPS = ("sum", "min", "max", "prod", "mean")
INPUT_KIND = {"sum": "real", "mean": "real", "prod": "small", "min": "big", "max": "big"}
BIG_ELEMS = 64 * 1024 * 1024 // 4  # 64 MiB of float32


@dataclass
class Case:
    label: str
    kind: str
    op: str = ""
    root: int = 0
    inputs: list[np.ndarray] = field(default_factory=list)  # this rank's, one per member
    expected: list[object] = field(default_factory=list)  # one per output
    atol: list[float | None] = field(default_factory=list)  # None: exact


def build_cases(rank: int, size: int) -> list[Case]:
    """Every collective x dtype x shape, with this rank's inputs and expectations."""
    cases: list[Case] = []
    ranks = range(size)
    for dt in DTYPES:
        for shape in SHAPES:
            for op in REDUCE_OPS:
                if op == "mean" and dt not in FLOAT_DTYPES:
                    continue
                label = f"all_reduce/{op}/{dt}/{shape}"
                xs = [make_input(label, r, shape, dt, INPUT_KIND[op]) for r in ranks]
                inexact = dt in FLOAT_DTYPES and op in ("sum", "mean")
                cases.append(
                    Case(label, "all_reduce", op, inputs=[xs[rank]], expected=[reduce_ref(xs, op, dt)],
                         atol=[tolerance(dt, size) if inexact else None])
                )
            for root in ranks:
                label = f"broadcast/{root}/{dt}/{shape}"
                xs = [make_input(label, r, shape, dt, "real") for r in ranks]
                cases.append(Case(label, "broadcast", root=root, inputs=[xs[rank]], expected=[xs[root]], atol=[None]))
            label = f"all_gather/{dt}/{shape}"
            xs = [make_input(label, r, shape, dt, "real") for r in ranks]
            cases.append(Case(label, "all_gather", inputs=[xs[rank]], expected=[np.stack(xs)], atol=[None]))

            label = f"consensus/agree/{dt}/{shape}"
            same = make_input(label, 0, shape, dt, "real")
            cases.append(Case(label, "consensus", inputs=[same], expected=[np.bool_(True)], atol=[None]))
            # Only the last rank differs: one element, or (no elements) the shape.
            label = f"consensus/differ/{dt}/{shape}"
            mine = make_input(label, 0, shape, dt, "real")
            if rank == size - 1 and size > 1:
                if mine.size:
                    flat = mine.reshape(-1)
                    flat[0] = np.asarray(2 if flat[0] != 2 else 3).astype(mine.dtype)
                else:
                    mine = mine.reshape((0, 2))
            cases.append(Case(label, "consensus", inputs=[mine], expected=[np.bool_(size == 1)], atol=[None]))

    for op in REDUCE_OPS:  # one group of mixed dtypes per op
        label = f"group/{op}"
        case = Case(label, "group", op)
        for dt in DTYPES:
            if op == "mean" and dt not in FLOAT_DTYPES:
                continue
            for shape in SHAPES:
                xs = [make_input(f"{label}/{dt}/{shape}", r, shape, dt, INPUT_KIND[op]) for r in ranks]
                case.inputs.append(xs[rank])
                case.expected.append(reduce_ref(xs, op, dt))
                inexact = dt in FLOAT_DTYPES and op in ("sum", "mean")
                case.atol.append(tolerance(dt, size) if inexact else None)
        cases.append(case)

    # Same bytes, different shapes: consensus must include the shape.
    data = np.arange(6, dtype=np.float32)
    cases.append(
        Case("consensus/shape", "consensus", inputs=[data.reshape((2, 3) if rank == 0 else (3, 2))],
             expected=[np.bool_(size == 1)], atol=[None])
    )
    cases.append(Case("barrier", "barrier", expected=[np.bool_(True)], atol=[None]))
    return cases


def issue(case: Case, xs: list[tf.Tensor]) -> list[tf.Tensor]:
    """Runs (eager) or adds (graph) the collective of ``case``; its outputs."""
    if case.kind == "all_reduce":
        return [ops.all_reduce(xs[0], op=case.op)]
    if case.kind == "group":
        return ops.group_all_reduce(xs, op=case.op)
    if case.kind == "broadcast":
        return [ops.broadcast(xs[0], root=case.root)]
    if case.kind == "all_gather":
        return [ops.all_gather(xs[0])]
    if case.kind == "consensus":
        return [ops.consensus(xs[0])]
    if case.kind == "barrier":
        b = ops.barrier()
        if b is None:  # eager: it has already completed
            return [tf.constant(True)]
        with tf.control_dependencies([b]):
            return [tf.identity(tf.constant(True))]
    raise AssertionError(case.kind)


def check_case(chk: Checker, case: Case, got: list[object], where: str) -> None:
    if len(got) != len(case.expected):
        chk.fail(f"{where} {case.label}: {len(got)} outputs, expected {len(case.expected)}")
    for i, (g, want, atol) in enumerate(zip(got, case.expected, case.atol)):
        what = f"{where} {case.label}[{i}]"
        g = np.asarray(g)
        if case.kind not in ("consensus", "barrier") and g.dtype != case.inputs[min(i, len(case.inputs) - 1)].dtype:
            chk.fail(what, f"dtype {g.dtype}")
        if atol is None:
            chk.equal(g, want, what)
        else:
            chk.close(g, want, atol, what)


def check_config(chk: Checker, values: dict[str, object], rank: int, size: int, where: str) -> None:
    want = {"rank": rank, "cluster_size": size, "local_rank": rank, "local_size": size, "cluster_version": 0}
    for k, v in want.items():
        chk.equal(int(values[k]), v, f"{where} config {k}")


def config_tensors() -> dict[str, tf.Tensor]:
    return {
        "rank": ops.rank(),
        "cluster_size": ops.cluster_size(),
        "local_rank": ops.local_rank(),
        "local_size": ops.local_size(),
        "cluster_version": ops.cluster_version(),
    }


def run_eager(chk: Checker, cases: list[Case], rank: int, size: int) -> None:
    check_config(chk, {k: v.numpy() for k, v in config_tensors().items()}, rank, size, "eager")
    consts = [[tf.constant(x) for x in c.inputs] for c in cases]
    for topo in TOPOLOGIES:
        chk.true(bool(ops.set_topology(topo).numpy()), f"eager set_topology({topo}) returned False")
        chk.equal(ops.topology().numpy().decode(), topo, "eager topology()")
        for case, xs in zip(cases, consts):
            check_case(chk, case, [o.numpy() for o in issue(case, xs)], f"eager/{topo}")


def run_function(chk: Checker, cases: list[Case], rank: int, size: int) -> None:
    # autograph=False: converting ~200 issue() calls costs seconds and there is
    # no Python control flow on tensors here.
    @tf.function(autograph=False)
    def step():
        outs = [issue(c, [tf.constant(x) for x in c.inputs]) for c in cases]
        return outs, ops.topology(), config_tensors()

    @tf.function
    def switch(name):
        return ops.set_topology(name)

    for topo in TOPOLOGIES:
        chk.true(bool(switch(tf.constant(topo)).numpy()), f"tf.function set_topology({topo}) returned False")
        outs, current, cfg = step()
        chk.equal(current.numpy().decode(), topo, "tf.function topology()")
        for case, got in zip(cases, outs):
            check_case(chk, case, [o.numpy() for o in got], f"function/{topo}")
    check_config(chk, {k: v.numpy() for k, v in cfg.items()}, rank, size, "tf.function")


def run_session(chk: Checker, cases: list[Case], rank: int, size: int) -> None:
    with tf.Graph().as_default() as g:
        name = tf.compat.v1.placeholder(tf.string, [])
        changed = ops.set_topology(name)
        outs = [issue(c, [tf.constant(x) for x in c.inputs]) for c in cases]
        current = ops.topology()
        cfg = config_tensors()
        with tf.compat.v1.Session(graph=g, config=_setup.session_config()) as sess:
            for topo in TOPOLOGIES:
                chk.true(bool(sess.run(changed, {name: topo})), f"session set_topology({topo}) returned False")
                got_all, cur = sess.run([outs, current])
                chk.equal(cur.decode(), topo, "session topology()")
                for case, got in zip(cases, got_all):
                    check_case(chk, case, got, f"session/{topo}")
            check_config(chk, sess.run(cfg), rank, size, "session")


def run_extras(chk: Checker, rank: int, size: int) -> None:
    # Python-int helpers.
    for fn, want in ((kungfu_tf.rank, rank), (kungfu_tf.size, size), (kungfu_tf.local_rank, rank),
                     (kungfu_tf.local_size, size)):
        chk.equal(fn(), want, f"kungfu_tf.{fn.__name__}()")
    # mean needs a floating dtype: refused before anything is sent.
    for dt in ("int32", "int64", "uint8"):
        try:
            ops.all_reduce(tf.zeros([2], DTYPES[dt]), op="mean")
        except ValueError:
            chk.true(True, "")
        else:
            chk.fail(f"all_reduce(mean) on {dt} did not raise ValueError")
    # A barrier releases nobody before the last worker arrived.
    time.sleep(0.1 * rank)
    arrived = time.time()
    ops.barrier(name="timed_barrier")
    left = time.time()
    arrivals = ops.all_gather(tf.constant(arrived, tf.float64), name="barrier_arrivals").numpy()
    chk.true(left >= arrivals.max(), f"barrier returned at {left} before rank {arrivals.argmax()} arrived "
                                     f"at {arrivals.max()}")
    # 64 MiB of exact, integer-valued float32 data: rank r's element i is
    # (7 i + 13 r) mod 1021. The period 1021 is prime, so it is no divisor of
    # any chunk size and a misplaced chunk shows.
    def big(r: int) -> np.ndarray:
        period = ((np.arange(1021) * 7 + r * 13) % 1021).astype(np.float32)
        return np.resize(period, BIG_ELEMS)

    mine = big(rank)
    want = np.resize(sum(((np.arange(1021) * 7 + r * 13) % 1021) for r in range(size)).astype(np.float32), BIG_ELEMS)
    t = time.monotonic()
    got = ops.all_reduce(tf.constant(mine), op="sum", name="big_all_reduce").numpy()
    print(f"64 MiB all_reduce took {time.monotonic() - t:.2f}s", flush=True)
    chk.equal(got, want, "64 MiB all_reduce")
    del got, want
    root = size - 1
    t = time.monotonic()
    got = ops.broadcast(tf.constant(mine), root=root, name="big_broadcast").numpy()
    print(f"64 MiB broadcast took {time.monotonic() - t:.2f}s", flush=True)
    chk.equal(got, big(root), "64 MiB broadcast")
    # Traffic monitor: one rate per worker, none for ourselves, some traffic seen.
    rates = ops.comm_rates().numpy()
    ok = rates.shape == (size,) and rates[rank] == 0 and (rates >= 0).all() and (size == 1 or rates.max() > 0)
    chk.true(bool(ok), f"comm_rates() = {rates}")


def main() -> None:
    size = int(sys.argv[1])
    rank = _setup.env_rank()
    chk = Checker(rank)
    t0 = time.monotonic()
    cases = build_cases(rank, size)
    print(f"built {len(cases)} cases in {time.monotonic() - t0:.1f}s", flush=True)
    for mode, fn in (("eager", run_eager), ("function", run_function), ("session", run_session)):
        fn(chk, cases, rank, size)
        print(f"{mode} done at {time.monotonic() - t0:.1f}s, {chk.count} checks", flush=True)
    run_extras(chk, rank, size)
    print(f"extras done at {time.monotonic() - t0:.1f}s", flush=True)
    chk.done()


if __name__ == "__main__":
    main()
