"""Markdown rendering of the all-reduce benchmark results (for the README)."""

from __future__ import annotations

from typing import Any

from benchmarks.harness.units import format_rate, format_ratio, format_size, format_time

MWMS_COLUMN = "MWMS (TF gRPC ring)"
MPI_COLUMN = "Open MPI (MPI_Allreduce)"
# Our AUTO time over Open MPI's at the same point: how far from the anchor.
MPI_RATIO_COLUMN = "AUTO ÷ MPI (time)"
# AUTO once more with same-host peers on Unix sockets (KUNGFU_SHM=0).
UNIX_COLUMN = "AUTO over Unix sockets (KUNGFU_SHM=0)"


def _table(header: list[str], align: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table; ``align`` entries are ``l`` or ``r``."""
    sep = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(r) + " |" for r in (header, sep, *rows)]
    return "\n".join(lines)


def _cell(point: dict[str, Any] | None) -> str:
    """``time · bus bandwidth`` of one point (AUTO's: and its choice), or a dash if not measured."""
    if point is None:
        return "–"
    chose = point.get("auto_choice")
    return f"{format_time(point['median_s'])} · {format_rate(point['busbw'])}" + (
        f" ({chose})" if chose else ""
    )


def _ratio_cell(ours: dict[str, Any] | None, anchor: dict[str, Any] | None) -> str:
    """``ours`` time / ``anchor`` time, or a dash if either is missing."""
    if ours is None or anchor is None:
        return "–"
    return format_ratio(ours["median_s"] / anchor["median_s"])


def allreduce_tables(
    points: list[dict[str, Any]],
    nps: list[int],
    sizes: list[int],
    topologies: list[str],
    with_mwms: bool,
    with_mpi: bool = False,
    mpi_note: str | None = None,
) -> str:
    """One table per np: rows are sizes, columns implementations/topologies.

    With ``with_mpi``, Open MPI's column follows MWMS's and, if AUTO was
    measured, a ratio column compares the two; ``mpi_note`` (why Open MPI was
    not measured) then fills its cells instead of numbers.
    """
    index = {(p["impl"], p["topology"], p["np"], p["size"]): p for p in points}
    columns = [("kungfu", t, t) for t in topologies]
    if any(p["impl"] == "kungfu_unix" for p in points):
        columns.append(("kungfu_unix", "AUTO", UNIX_COLUMN))
    if with_mwms:
        columns.append(("mwms", "RING", MWMS_COLUMN))
    with_ratio = with_mpi and "AUTO" in topologies
    parts: list[str] = []
    for n in nps:
        rows = []
        for s in sizes:
            row = [format_size(s)]
            row += [_cell(index.get((impl, topo, n, s))) for impl, topo, _ in columns]
            mpi = index.get(("mpi", "MPI", n, s))
            if with_mpi:
                row.append(f"not run: {mpi_note}" if mpi_note else _cell(mpi))
            if with_ratio:
                row.append(_ratio_cell(index.get(("kungfu", "AUTO", n, s)), mpi))
            rows.append(row)
        header = ["size"] + [title for _, _, title in columns]
        header += [MPI_COLUMN] if with_mpi else []
        header += [MPI_RATIO_COLUMN] if with_ratio else []
        parts.append(
            f"**np = {n}** — median time per all-reduce · bus bandwidth\n\n"
            + _table(header, ["r"] * len(header), rows)
        )
    return "\n\n".join(parts)


def _runtime_cell(point: dict[str, Any] | None) -> str:
    """A median time; for AUTO also the topology its probe chose."""
    if point is None:
        return "–"
    chose = point.get("auto_choice")
    return format_time(point["median_s"]) + (f" ({chose})" if chose else "")


def runtime_table(
    points: list[dict[str, Any]], nps: list[int], topologies: list[str]
) -> str:
    """Median all-reduce time through the runtime alone, per np, size, transport and topology.

    Points without a ``transport`` are from before the shared-memory
    transport: Unix sockets.
    """
    by_key = {
        (p["np"], p["size"], p.get("transport", "unix"), p["topology"]): p
        for p in points
    }
    sizes = sorted({p["size"] for p in points})
    transports = [
        t for t in ("shm", "unix") if any(k[2] == t for k in by_key)
    ]
    rows = []
    for n in nps:
        for size in sizes:
            for tr in transports:
                cells = [_runtime_cell(by_key.get((n, size, tr, t))) for t in topologies]
                rows.append([str(n), format_size(size), tr, *cells])
    header = ["np", "size", "transport", *topologies]
    return _table(header, ["r", "r", "l", *["r"] * len(topologies)], rows)


def raw_table(raw: dict[str, Any]) -> str:
    """Raw transport limits: exchange rate each way and ping-pong RTTs."""
    names = {
        "tcp": "TCP loopback",
        "unix": "Unix socket",
        "shm": "shared-memory ring (ours, shm_ring.h)",
    }

    def rtt(rec: dict[str, Any] | None) -> str:
        return format_time(rec["rtt_median_s"]) if rec else "–"

    rows: list[list[str]] = []
    for key, title in names.items():
        r = raw.get(key)
        if not r:
            continue
        ex = r.get("exchange")
        pp = r.get("pingpong")
        rows.append(
            [
                title,
                format_rate(ex["bytes_per_s_each_way"]) if ex else "–",
                # Without two CPUs the reference is an unpinned run: say so.
                rtt(pp)
                + (
                    f" ({pp['placement']})" if pp and pp["placement"] != "split" else ""
                ),
                rtt(r.get("pingpong_same_cpu")),
            ]
        )
    header = [
        "transport",
        "64 MiB exchange, each way",
        "4 B ping-pong RTT, cross-CPU (median)",
        "same CPU (median)",
    ]
    memcpy = raw.get("shm", {}).get("memcpy")
    if memcpy:
        rows.append(
            ["memcpy, one thread (memory bandwidth)", format_rate(memcpy["bytes_per_s"]), "–", "–"]
        )
    text = _table(header, ["l", "r", "r", "r"], rows)
    floor = raw.get("tf_function_floor")
    if floor:
        text += (
            "\n\nFloor for the latency targets: calling a tf.function that "
            "communicates nothing (4 B identity, 1 thread, one process) takes "
            f"{format_time(floor['median_s'])}"
        )
        ratios = [
            f"{floor['median_s'] / rtt:.1f}× the cross-CPU {name} RTT"
            for name, rtt in (
                (title, raw.get(key, {}).get("pingpong", {}).get("rtt_median_s"))
                for key, title in (("tcp", "TCP"), ("unix", "Unix-socket"), ("shm", "ring"))
            )
            if rtt
        ]
        if ratios:
            text += " = " + " and ".join(ratios)
        text += "."
    return text


def _verdict(e: dict[str, Any]) -> str:
    """``MET 0.93`` / ``NOT MET 0.41`` (+ topology for the best-topology row)."""
    if e["ratio"] is None:
        return "n/a (not measured)"
    if e["kind"] == "bandwidth":
        value = f"{e['ratio']:.0%} of the {e['yardstick']}"
    else:
        value = f"{format_ratio(e['ratio'])} RTT"  # Open MPI's is far below 0.1×
    topo = f" ({e['topology']})" if e["contender"] == "best topology" else ""
    return f"{'MET' if e['met'] else 'NOT MET'}: {value}{topo}"


def targets_table(evals: list[dict[str, Any]]) -> str:
    """Targets as rows, contenders (AUTO / best topology / MWMS) as columns."""
    contenders: list[str] = []
    by_target: dict[str, dict[str, dict[str, Any]]] = {}
    for e in evals:
        if e["contender"] not in contenders:
            contenders.append(e["contender"])
        by_target.setdefault(e["target"], {})[e["contender"]] = e
    titles = {"AUTO": "ours, AUTO", "best topology": "ours, best topology"}
    header = ["target"] + [titles.get(c, c) for c in contenders]
    rows = [
        [target] + [_verdict(cs[c]) if c in cs else "–" for c in contenders]
        for target, cs in by_target.items()
    ]
    return _table(header, ["l"] * len(header), rows)


def shm_targets_table(evals: list[dict[str, Any]]) -> str:
    """One row per target of the shared-memory transport: both sides and the verdict."""
    rows = []
    for e in evals:
        if e["ours"] is None or e["reference"] is None:
            verdict = "n/a (not measured)"
        else:
            verdict = f"{'MET' if e['met'] else 'NOT MET'}: {e['value']}"
        rows.append([e["target"], e["ours_text"], e["reference_text"], verdict])
    header = ["target", "ours", "reference (same run)", "verdict"]
    return _table(header, ["l", "r", "r", "l"], rows)


def auto_table(evals: list[dict[str, Any]]) -> str:
    """AUTO against the best fixed topology of the same run (issue 23 §2), a row per path, np and size."""
    from benchmarks.allreduce.targets import AUTO_VS_BEST

    rows = []
    for e in evals:
        verdict = f"{'MET' if e['met'] else 'NOT MET'}: {e['ratio']:.2f}"
        choice = "–" if e.get("choice_ratio") is None else f"{e['choice_ratio']:.2f}"
        rows.append([
            e["path"], str(e["np"]), format_size(e["size"]), f"{e['best']} {format_time(e['best_s'])}",
            format_time(e["auto_s"]) + (f" ({e['chose']})" if e["chose"] else ""), choice, verdict,
        ])  # fmt: skip
    header = [
        "path", "np", "size", "best fixed topology", "AUTO (its choice)", "the choice held fixed ÷ best",
        f"AUTO ÷ best ≤ {AUTO_VS_BEST:g}",
    ]  # fmt: skip
    return _table(header, ["l", "r", "r", "l", "r", "r", "l"], rows)
