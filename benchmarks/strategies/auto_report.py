"""The Auto part of the strategy benchmark's report: Auto against the hand builders, search cost, ranking accuracy, plot.

* Auto against the hand builders, per (setting, model): its chosen
  strategy's time beside the best and the median hand builder's, timed in
  the same rounds; the issue's targets (within 5 % of the best, ahead of the
  median, faster than the best somewhere) and the search's cost (seconds,
  and as a share of a 30-minute run).
* Ranking accuracy by performance bucket (AutoDist Fig. 4): the trials of
  every ranker search, sorted by measured time into four buckets (1 =
  fastest quarter); for each trial of a bucket and every other trial of the
  same search, a predictor is right when it orders the pair as the
  measurements do. Compared on the same trials: the cost model alone, and
  the search model's prediction when it chose the trial (the ranker, from
  the second round on, trained on the rounds before).
* Plot (matplotlib): the best measured so far against trials, as speed
  relative to the best hand builder, for the search with the ranker and the
  search with the cost model alone (AutoDist Fig. 9).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness.units import format_time
from benchmarks.strategies.auto_searches import AUTO, SEARCH_MODES

RUN_SECONDS = 30 * 60  # the reference training run
BUCKETS = 4


def _measured(trials: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in _exploring(trials) if t.get("measured_seconds") is not None]


def _exploring(trials: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trials the search model chose (not the confirmation trials of the fastest, after the budget)."""
    return [t for t in trials if not t.get("confirmation")]


def pair_accuracy(trials: Sequence[dict[str, Any]], key: str, scored: Sequence[dict[str, Any]] | None = None) -> list[tuple[int, int]]:
    """(right, pairs) per bucket: how often ``key`` orders a trial of the bucket against the others as measured.

    ``scored``: the trials whose pairs count (default all); every measured
    trial of the search is the other side of a pair.

    Example:
        >>> ts = [{"measured_seconds": m, "p": p} for m, p in [(1, 1), (2, 3), (3, 2), (4, 4)]]
        >>> pair_accuracy(ts, "p")
        [(3, 3), (2, 3), (2, 3), (3, 3)]
    """
    done = sorted(_measured(trials), key=lambda t: t["measured_seconds"])
    counts = [(0, 0)] * BUCKETS
    keep = {id(t) for t in (scored if scored is not None else done)}
    for i, t in enumerate(done):
        if id(t) not in keep:
            continue
        b = min(BUCKETS - 1, i * BUCKETS // len(done))
        right, pairs = counts[b]
        for u in done:
            if u is t or u["measured_seconds"] == t["measured_seconds"]:
                continue
            pairs += 1
            right += (t[key] - u[key]) * (t["measured_seconds"] - u["measured_seconds"]) > 0
        counts[b] = (right, pairs)
    return counts


def _fastest_single_trial(trials: Sequence[dict[str, Any]]) -> str | None:
    """What the search would have chosen without its confirmation trials: the fastest exploring trial."""
    done = _measured(trials)
    return min(done, key=lambda t: t["measured_seconds"])["strategy_id"] if done else None


def auto_rows(points: Sequence[dict[str, Any]], hand_builders: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (setting, model) that has an Auto result."""
    rows = []
    for p in points:
        if p["builder"] != AUTO or "auto" not in p:
            continue
        hand = {q["builder"]: q["step_s"] for q in points
                if q["setting"] == p["setting"] and q["model"] == p["model"] and q["builder"] in hand_builders}  # fmt: skip
        if not hand:
            continue
        best = min(hand, key=hand.get)
        search = p["auto"]["ranker"]
        rows.append({
            "setting": p["setting"], "model": p["model"], "chosen": search["chosen"], "auto_s": p["step_s"],
            "best_builder": best, "best_s": hand[best], "median_s": statistics.median(hand.values()),
            "search_s": search["search_s"], "trials": len(_exploring(search["trials"])),
            # The search's steps train the model too: what it cost is its time beyond those steps on Auto's choice.
            "overhead_s": search["search_s"] - search.get("steps", 0) * p["step_s"],
            "unconfirmed": _fastest_single_trial(search["trials"]),
            "confirmations": len(search["trials"]) - len(_exploring(search["trials"])),
            "waited_steps": sum(t.get("waited_steps", 0) for t in search["trials"]),
        })  # fmt: skip
    return rows


def print_auto_report(points: Sequence[dict[str, Any]], hand_builders: Sequence[str], plot: Path | None) -> None:
    """The Auto tables (markdown) on stdout, and the plot."""
    rows = auto_rows(points, hand_builders)
    if not rows:
        return
    print("### Auto against the hand builders (same run, same rounds)\n")
    print("| setting | model | Auto's strategy | Auto | best hand builder | its time | median builder | "
          "best / Auto | within 5 % of best | ahead of median | search (s) | % of 30 min | overhead (s) | % of 30 min |")  # fmt: skip
    print("|---|---|---|---:|---|---:|---:|---:|---|---|---:|---:|---:|---:|")
    for r in rows:
        ratio = r["best_s"] / r["auto_s"]
        print(
            f"| {r['setting']} | {r['model']} | {r['chosen']} | {format_time(r['auto_s'])} | {r['best_builder']} | "
            f"{format_time(r['best_s'])} | {format_time(r['median_s'])} | {ratio:.2f} | "
            f"{'yes' if r['auto_s'] <= 1.05 * r['best_s'] else 'no'} | {'yes' if r['auto_s'] < r['median_s'] else 'no'} | "
            f"{r['search_s']:.0f} | {100 * r['search_s'] / RUN_SECONDS:.1f} | "
            f"{r['overhead_s']:.0f} | {100 * r['overhead_s'] / RUN_SECONDS:.1f} |"
        )
    changed = [r for r in rows if r["confirmations"] and r["unconfirmed"] != r["chosen"]]
    if any(r["confirmations"] for r in rows):
        hand = {(q["setting"], q["model"], q["builder"]): q["step_s"] for q in points}
        lines = [
            f"{r['model']} ({r['setting']}): {r['unconfirmed']}"
            + (f", timed at {format_time(hand[(r['setting'], r['model'], r['unconfirmed'])])}"
               if (r["setting"], r["model"], r["unconfirmed"]) in hand else "")
            + f", instead of {r['chosen']} ({format_time(r['auto_s'])})"
            for r in changed
        ]  # fmt: skip
        print(f"\nThe confirmation trials changed the choice in {len(changed)} of {len(rows)} rows"
              + (": without them the search would have chosen " + "; ".join(lines) if lines else "") + ".")  # fmt: skip
    beats = [f"{r['model']} ({r['setting']})" for r in rows if r["auto_s"] < r["best_s"]]
    print(f"\nAuto faster than every hand builder: {', '.join(beats) or 'nowhere'}. "
          f"Search = the ranker search's trials ({rows[0]['trials']} per row, then "
          f"{rows[0]['confirmations']} confirmation trials of the fastest) on the workers, wall time; steps the "
          f"trials waited for AUTO's probes, per row: {', '.join(str(r['waited_steps']) for r in rows)}. "
          "Overhead = the search's wall time less its steps at Auto's timed step time (the trials train the "
          "model: the overhead is what training on Auto's choice from the start would have saved).\n")  # fmt: skip
    print_ranking_accuracy(points)
    if plot is not None:
        plot_searches(points, rows, plot)


def print_ranking_accuracy(points: Sequence[dict[str, Any]]) -> None:
    """AutoDist Fig. 4 as a table: pairwise ranking accuracy by performance bucket, cost model vs ranker."""
    cost = [(0, 0)] * BUCKETS
    ranker = [(0, 0)] * BUCKETS
    scored_trials = 0
    for p in points:
        if p["builder"] != AUTO or "auto" not in p:
            continue
        trials = p["auto"]["ranker"]["trials"]
        later = [t for t in _measured(trials) if t["round"] > 0]  # chosen by a ranker trained on earlier rounds
        scored_trials += len(later)
        for acc, key in ((cost, "predicted_seconds"), (ranker, "score")):
            for b, (right, pairs) in enumerate(pair_accuracy(trials, key, later)):
                acc[b] = (acc[b][0] + right, acc[b][1] + pairs)
    print("### Ranking accuracy by performance bucket (AutoDist Fig. 4)\n")
    print("| predictor | " + " | ".join(f"bucket {b + 1}" for b in range(BUCKETS)) + " |")
    print("|---|" + "---:|" * BUCKETS)
    for name, acc in (("cost model alone", cost), ("ranker (at selection)", ranker)):
        cells = [f"{100 * r / n:.0f} % ({n})" if n else "—" for r, n in acc]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\n{scored_trials} trials of rounds after the first (the ranker had learned from the rounds before); "
          "bucket 1 = the fastest quarter of each search's trials; in brackets the pairs compared.\n")  # fmt: skip


def plot_searches(points: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Best measured so far (speed relative to the best hand builder) against trials, both searches."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("_matplotlib is not installed: no plot_\n")
        return
    best_hand = {(r["setting"], r["model"]): r["best_s"] for r in rows}
    searched = [p for p in points if p["builder"] == AUTO and (p["setting"], p["model"]) in best_hand]
    fig, axes = plt.subplots(1, len(searched), figsize=(4 * len(searched), 3.2), squeeze=False)
    for ax, p in zip(axes[0], searched, strict=True):
        hand = best_hand[(p["setting"], p["model"])]
        for mode in SEARCH_MODES:
            best, ys = float("inf"), []
            for t in _exploring(p["auto"][mode]["trials"]):
                if t["measured_seconds"] is not None:
                    best = min(best, t["measured_seconds"])
                ys.append(hand / best if best < float("inf") else 0.0)
            ax.plot(range(1, len(ys) + 1), ys, marker="o", label="with ranker" if mode == "ranker" else "cost model alone")
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_title(f"{p['model']}, {p['setting']}", fontsize=9)
        ax.set_xlabel("trials")
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0][0].set_ylabel("best found / best hand builder (speed)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"Plot: {path}\n")
