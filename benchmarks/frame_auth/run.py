"""All-reduce with frame authentication off and on (benchmarks/allreduce/runtime_allreduce.cc).

Runs the runtime-only all-reduce benchmark for each size with
KUNGFU_AUTHENTICATE_FRAMES=0 and =1, alternating the settings round by round
so that a change in machine load hits both alike, and prints the median over
rounds of each run's median time per all-reduce, as a README table.

Usage (from the repository root; build/bench/runtime_allreduce must exist,
built as the Makefile's bench targets build it):

    python -m benchmarks.frame_auth [--rounds 3] [--np 2] [--topology RING]
    python -m benchmarks.frame_auth --netns kfa,kfb --addresses 10.9.0.1,10.9.0.2

With --netns, rank r runs in network namespace r (``ip netns exec``, root)
and listens on address r, so the frames cross the veth between them, as
between two hosts. ``--variant NAME=EXE`` adds another binary (for example one
built from an older commit), run with KUNGFU_AUTHENTICATE_FRAMES=1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.harness.paths import BUILD_DIR

EXE = BUILD_DIR / "runtime_allreduce"
KiB = 1024
MiB = 1024 * KiB
# size -> (iterations per sample, samples per run)
SIZES = {64 * KiB: (200, 3), 1 * MiB: (40, 3), 16 * MiB: (4, 3), 64 * MiB: (2, 3)}


def run_once(exe: str, auth: str, size: int, args: argparse.Namespace, round_no: int) -> float:
    """One benchmark run; returns its median seconds per all-reduce."""
    iters, samples = SIZES[size]
    env = {**os.environ, "KUNGFU_AUTHENTICATE_FRAMES": auth}
    base = [exe, str(args.np), args.topology, str(size), str(iters), str(samples)]
    if not args.netns:
        out = subprocess.run(base, env=env, capture_output=True, text=True, timeout=600, check=True).stdout
    else:
        namespaces = args.netns.split(",")
        port = 23000 + (round_no * 7 + size // KiB) % 20000
        peers = ",".join(f"{a}:{port}" for a in args.addresses.split(","))
        procs = [
            subprocess.Popen(
                ["ip", "netns", "exec", ns, *base, peers, str(r)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for r, ns in enumerate(namespaces)
        ]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        if any(p.returncode != 0 for p in procs):
            raise RuntimeError(f"{exe} failed: {outs}")
        out = outs[0]
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    return float(json.loads(line[len("RESULT ") :])["median_s"])


def fmt(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f} ms" if ms < 1 else f"{ms:.3g} ms"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--topology", default="RING")
    p.add_argument("--netns", default="", help="comma-separated namespaces, one per rank")
    p.add_argument("--addresses", default="", help="comma-separated addresses, one per rank (with --netns)")
    p.add_argument("--variant", action="append", default=[], help="NAME=EXE, run with authentication on")
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.netns and len(args.netns.split(",")) != args.np or bool(args.netns) != bool(args.addresses):
        p.error("--netns and --addresses need one entry per rank (--np)")
    variants = [("off", str(EXE), "0"), ("on", str(EXE), "1")]
    for v in args.variant:
        name, _, exe = v.partition("=")
        if not name or not exe:
            p.error(f"--variant must be NAME=EXE, got {v!r}")
        variants.append((name, exe, "1"))
    times: dict[tuple[int, str], list[float]] = {}
    for size in SIZES:
        for round_no in range(args.rounds):
            for name, exe, auth in variants:
                times.setdefault((size, name), []).append(run_once(exe, auth, size, args, round_no))
        print(f"# {size // KiB} KiB done", file=sys.stderr, flush=True)
    names = [v[0] for v in variants]
    print("| all-reduce | " + " | ".join(names) + " | " + " | ".join(f"{n} ÷ off" for n in names[1:]) + " |")
    print("| ---: " * (2 * len(names)) + "|")
    for size in SIZES:
        med = {n: statistics.median(times[(size, n)]) for n in names}
        label = f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"
        cells = [fmt(med[n]) for n in names] + [f"{med[n] / med['off']:.2f}×" for n in names[1:]]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
