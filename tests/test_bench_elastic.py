"""benchmarks/elastic/run.py and benchmarks/elastic/idle.py: the idle-time definition, the schedule, and a toy run.

The analysis is checked on made-up step logs whose gaps are known by
construction (survivors only; no survivors = a restart; the crash's
detection time; a grow admitted in two versions; sizes that do not match the
labels); the harness once end to end at toy size (a shrink 2 -> 1 on the
digits MLP, elastic and by checkpoint-restart): the step counter continues
exactly on the survivor and through the checkpoint, the reported idle is the
logged gap minus the logged step time, and the restart is the slower one.
"""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks.elastic.idle import StepLog, read_logs, segments, transitions
from benchmarks.elastic.run import (
    check_schedule,
    elastic_schedule,
    measured_transitions,
    verdict,
)
from benchmarks.elastic.worker import parse_schedule


def steps(peers, times, job=0, version=1, size=None):
    """Step records: every peer ends each step at the given times (+1 ms per peer index)."""
    return [{"e": "step", "t": t + 0.001 * i, "job": job, "version": version, "peer": p, "size": size or len(peers)}
            for t in times for i, p in enumerate(peers)]  # fmt: skip


def test_shrink_idle_counts_only_the_survivors():
    # 4 workers until t=10; c, d detach (and log no more steps); a, b go on at 2 workers from t=10.5 with 0.2 s steps.
    recs = steps("abcd", [8, 9, 10]) + steps("ab", [10.5, 10.7, 10.9, 11.1], version=2)
    (tr,) = transitions(recs, ["shrink 4 -> 2"])
    assert tr.survivors == ["a", "b"]
    assert tr.t_before == pytest.approx(10.001) and tr.t_after == pytest.approx(10.501)
    assert tr.gap_s == pytest.approx(0.5) and tr.step_s == pytest.approx(0.2) and tr.idle_s == pytest.approx(0.3)
    assert (tr.size_before, tr.size_after, tr.steps_before, tr.steps_after) == (4, 2, 3, 4)


def test_a_grow_admitted_in_two_versions_sums_its_parts():
    # 2 workers; joiner c admitted at t=4 (one step at 3 workers), joiner d at t=5; 0.1 s steps at 4.
    recs = steps("ab", [1, 2, 3]) + steps("abc", [4], version=2) + steps("abcd", [5, 5.1, 5.2], version=3)
    (tr,) = transitions(recs, ["grow 2 -> 4"])
    assert tr.survivors == ["a", "b"] and (tr.size_before, tr.size_after) == (2, 4)
    # Each admission: 1 s gap minus one 0.1 s step (the 3-worker segment has one step: the 4-worker step time).
    assert [p["gap_s"] for p in tr.parts] == pytest.approx([1.0, 1.0])
    assert [p["idle_s"] for p in tr.parts] == pytest.approx([0.9, 0.9])
    assert tr.idle_s == pytest.approx(1.8) and tr.gap_s == pytest.approx(2.0) and tr.step_s == pytest.approx(0.1)
    # A shrink may not pass through sizes in between.
    with pytest.raises(ValueError, match=r"transition 'shrink 4 -> 2': the logs show 4 -> 3 there"):
        transitions(steps("abcd", [1, 2]) + steps("abc", [3, 4], version=2) + steps("ab", [5, 6], version=3),
                    ["shrink 4 -> 2"])  # fmt: skip


def test_restart_has_no_survivors_and_uses_the_jobs():
    # Job 0 (2 workers) ends at 5; job 1's workers (other peers) end their first step at 12.
    recs = steps(["job0/x", "job0/y"], [3, 4, 5]) + steps(["job1/x"], [12, 12.1, 12.2, 12.3], job=1)
    (tr,) = transitions(recs, ["shrink 2 -> 1"])
    assert tr.survivors == []
    assert tr.gap_s == pytest.approx(12 - 5.001) and tr.idle_s == pytest.approx(12 - 5.001 - 0.1)


def test_crash_detection_is_kill_to_the_survivors_failure():
    recs = steps("abcd", [1, 2, 3]) + steps("abc", [6, 6.5, 7], version=2)
    # d SIGKILLs itself at 3.5; the survivors' steps fail 0.4, 0.5 and 0.6 s later.
    recs += [{"e": "kill", "t": 3.5, "peer": "d"}] + [
        {"e": "step_failed", "t": 3.5 + dt, "peer": p} for p, dt in (("a", 0.4), ("b", 0.5), ("c", 0.6))]
    (tr,) = transitions(sorted(recs, key=lambda r: r["t"]), ["crash 4 -> 3"])
    assert tr.detection_s == pytest.approx(0.5) and tr.survivors == ["a", "b", "c"]
    assert tr.idle_s == pytest.approx((6.002 - 3.002) - 0.5)  # latest survivor ends; the victim d is none


def test_a_crash_whose_replacement_came_first_is_one_transition():
    # d crashes after t=3; the replacement e is in before the survivors' next step (t=9): 4 -> 4.
    recs = steps("abcd", [1, 2, 3]) + steps("abce", [9, 9.5, 10], version=3) + steps("abe", [11, 11.5, 12], version=4)
    trs, why = measured_transitions(recs, ["crash 4 -> 3", "replace 3 -> 4", "shrink 4 -> 3"])
    assert why is None and [(t.label, t.merged) for t in trs] == [("crash 4 -> 3", True), ("shrink 4 -> 3", False)]
    assert trs[0].idle_s == pytest.approx(9.002 - 3.002 - 0.5) and trs[0].survivors == ["a", "b", "c"]


def test_sizes_that_do_not_match_the_labels_are_an_error():
    recs = steps("abcd", [1, 2, 3]) + steps("ab", [4, 5, 6], version=2)
    with pytest.raises(ValueError, match=r"transition 'shrink 4 -> 1': the logs show 4 -> 2"):
        transitions(recs, ["shrink 4 -> 1"])
    with pytest.raises(ValueError, match="expected 2 transitions"):
        transitions(recs, ["shrink 4 -> 2", "grow 2 -> 4"])
    # The harness reports the transitions that did happen and why not all.
    trs, why = measured_transitions(recs, ["shrink 4 -> 2", "grow 2 -> 4"])
    assert [t.label for t in trs] == ["shrink 4 -> 2"] and why == "the logs show 1 of the 2 transitions"
    with pytest.raises(ValueError, match="steps at sizes 4 and 3"):
        segments(recs + steps("abc", [7], version=1))


def test_schedule_checks_and_worker_spelling():
    assert elastic_schedule(["shrink 4 -> 2", "grow 2 -> 4", "crash 4 -> 3", "replace 3 -> 4"]) == (
        "shrink:2,grow:4,crash:3,replace:4")  # fmt: skip
    assert parse_schedule(elastic_schedule(["shrink 4 -> 1", "grow 1 -> 3"])) == [("shrink", 1), ("grow", 3)]
    with pytest.raises(ValueError, match="item 'shrink:0' is not"):
        parse_schedule("grow:4,shrink:0")
    with pytest.raises(ValueError, match="starts at 3 workers, the one before it ends at 2"):
        check_schedule(["shrink 4 -> 2", "grow 3 -> 4"])
    with pytest.raises(ValueError, match="sizes do not fit a crash"):
        check_schedule(["crash 4 -> 2"])
    with pytest.raises(ValueError, match="is not '<kind> <size> -> <size>'"):
        check_schedule(["shrink 4 to 2"])
    assert verdict("shrink 4 -> 1", 0.2, 40.0, None) == ("<= 0.3 s and >= 50x", False)
    assert verdict("grow 2 -> 4", 0.1, 60.0, None) == (">= 50x", True)
    assert verdict("grow 2 -> 4", 0.8, None, None) == (">= 50x", None)  # no checkpoint-restart to compare with
    assert verdict("crash 4 -> 3", 1.4, 50.0, 0.5) == ("<= detection + 1 s and >= 50x", True)
    assert verdict("crash 4 -> 3", 1.6, 50.0, 0.5)[1] is False
    assert verdict("crash 4 -> 3", 0.6, 20.0, 0.5)[1] is False


def probed(recs, counts):
    """``recs`` with AUTO's probe-sample count after each step: ``counts[k]`` for every peer's k-th step."""
    seen: dict[str, int] = {}
    for r in recs:
        k = seen[r["peer"]] = seen.get(r["peer"], -1) + 1
        r["probe"] = counts[k]
    return recs


def test_steps_that_carry_probe_samples_are_not_the_normal_step():
    # 2 workers; after the shrink to 1, AUTO probes the new layout during steps 1-3 after the first (0.5 s
    # each), then the step is 0.1 s. The normal step is 0.1 s (the median of all intervals would be 0.3 s).
    before = steps("ab", [1, 2, 3])
    after = steps("a", [4.0, 4.5, 5.0, 5.5, 5.6, 5.7, 5.8], version=2)
    recs = probed(before, [10, 10, 10]) + probed(after, [11, 12, 13, 14, 14, 14, 14])
    (tr,) = transitions(sorted(recs, key=lambda r: r["t"]), ["shrink 2 -> 1"])
    assert tr.step_s == pytest.approx(0.1) and tr.idle_s == pytest.approx(1.0 - 0.1)
    assert not tr.probing_before and tr.first_step_probed
    assert tr.probe_steps_after == 3 and tr.probe_extra_s == pytest.approx(3 * 0.4)
    # A layout still probed when the transition came: flagged; without counts (older logs) nothing is.
    recs = probed(steps("ab", [1, 2, 3]), [1, 2, 3]) + probed(steps("a", [4, 4.1, 4.2], version=2), [3, 3, 3])
    (tr,) = transitions(sorted(recs, key=lambda r: r["t"]), ["shrink 2 -> 1"])
    assert tr.probing_before and not tr.first_step_probed and tr.probe_steps_after == 0
    (tr,) = transitions(steps("ab", [1, 2, 3]) + steps("a", [4, 4.5, 5.0, 5.1], version=2), ["shrink 2 -> 1"])
    assert (tr.probing_before, tr.first_step_probed, tr.probe_steps_after) == (False, False, 0)
    assert tr.step_s == pytest.approx(0.5)  # the median of every interval, as before the counts were logged


def test_steps_after_the_next_request_are_not_the_normal_step():
    # After the shrink, 0.1 s steps; at t=4.35 the grow is asked for and the joiners' start slows the members
    # to 0.3 s steps, for longer than before. The normal step is 0.1 s (the median of all would be 0.3 s).
    recs = steps("ab", [1, 2, 3]) + steps("a", [4.0, 4.1, 4.2, 4.3, 4.6, 4.9, 5.2, 5.5, 5.8, 6.1], version=2)
    recs.append({"e": "transition", "t": 4.35, "job": 0, "version": 2, "peer": "a", "kind": "grow"})
    (tr,) = transitions(sorted(recs, key=lambda r: r["t"]), ["shrink 2 -> 1"])
    assert tr.step_s == pytest.approx(0.1) and tr.idle_s == pytest.approx(1.0 - 0.1)
    # A request right after the first step leaves too few steps before it: then every step counts.
    recs[-1]["t"] = 4.05
    (tr,) = transitions(sorted(recs, key=lambda r: r["t"]), ["shrink 2 -> 1"])
    assert tr.step_s == pytest.approx(0.3)


def test_the_gap_splits_where_the_first_step_after_began():
    # 0.1 s steps at 2 workers until t=3; the survivor "a" begins its first step at 1 worker at t=3.6 (the pause:
    # the change and the sync) and ends it at t=4.0; older logs without t0 give no split.
    before = [dict(r, t0=r["t"] - 0.1) for r in steps("ab", [2.9, 3.0])]
    after = [dict(r, t0=r["t"] - (0.4 if r["t"] == 4.0 else 0.1)) for r in steps("a", [4.0, 4.1, 4.2], version=2)]
    (tr,) = transitions(before + after, ["shrink 2 -> 1"])
    assert tr.pause_s == pytest.approx(0.6) and tr.first_step_s == pytest.approx(0.4)
    assert tr.gap_s == pytest.approx(tr.pause_s + tr.first_step_s)
    (tr,) = transitions(steps("ab", [2.9, 3.0]) + steps("a", [4.0, 4.1, 4.2], version=2), ["shrink 2 -> 1"])
    assert tr.pause_s is None and tr.first_step_s is None


def test_worker_env_passes_only_what_was_asked(monkeypatch):
    from benchmarks.elastic.run import parse_args, worker_env

    monkeypatch.setenv("KUNGFU_AUTO_PROBES", "0")  # the caller's own: not passed on
    assert "KUNGFU_AUTO_PROBES" not in worker_env()
    assert worker_env(["KUNGFU_AUTO_PROBES=1", "A_B="])["KUNGFU_AUTO_PROBES"] == "1"
    for bad in ("NOEQUALS", "=1", "1X=2", "A-B=1"):
        with pytest.raises(SystemExit):
            parse_args(["--worker-env", bad])


def test_step_log_survives_a_cut_last_line(tmp_path):
    log = StepLog(tmp_path, "w", job=0)
    log.event("step", t=2.0, step=1)
    log.event("start", t=1.0)
    with open(log.path, "a") as f:
        f.write('{"e": "step", "t": 3')  # what a SIGKILL mid-write leaves
    assert [(r["e"], r["t"], r["job"]) for r in read_logs(tmp_path)] == [("start", 1.0, 0), ("step", 2.0, 0)]


def test_benchmark_smoke(tmp_path):
    """The harness end to end at toy size, both ways: an elastic shrink 2 -> 1 and a checkpoint-restart 2 -> 1."""
    import subprocess

    from conftest import REPO_ROOT, worker_env

    out = tmp_path / "elastic.md"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.elastic", "--models", "digits-mlp",
                           "--transitions", "shrink 2 -> 1", "--repeats", "1", "--steps", "3",
                           "--work-dir", str(tmp_path / "work"), "--out", str(out)],
                          check=False, cwd=REPO_ROOT, env=worker_env(), capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    work = tmp_path / "work" / "digits-mlp"
    res = json.loads(out.with_suffix(".json").read_text())["models"]["digits-mlp"]
    for mode in ("elastic", "restart"):
        assert res[mode]["error"] is None, res[mode]["error"] + "\n" + (work / mode / "job.out").read_text()[-6000:]
        (t,) = res[mode]["transitions"]
        assert t["label"] == "shrink 2 -> 1" and t["idle_s"] == pytest.approx(t["gap_s"] - t["step_s"]), t
        assert t["step_s"] > 0, t
    elastic, restart = res["elastic"]["transitions"][0], res["restart"]["transitions"][0]
    # Elastic: the same process (rank 0) trains before and after. Restart: no process survives, and it
    # re-imports TensorFlow, which alone takes longer than the elastic shrink.
    assert len(elastic["survivors"]) == 1 and restart["survivors"] == []
    assert restart["idle_s"] > max(1.0, elastic["idle_s"]), (elastic, restart)
    # The step counter continues exactly: on the elastic survivor, and through the checkpoint (steps 1-3, 4-6).
    steps_of: dict[str, list[int]] = {}
    for r in read_logs(work / "elastic" / "logs"):
        if r["e"] == "step":
            steps_of.setdefault(r["peer"], []).append(r["step"])
    assert steps_of[elastic["survivors"][0]] == [1, 2, 3, 4, 5, 6], steps_of
    probes = [r["probe"] for r in read_logs(work / "elastic" / "logs") if r["e"] == "step"]
    assert all(isinstance(c, int) and c >= 0 for c in probes), probes  # AUTO's count, logged with every step
    recs = read_logs(work / "restart" / "logs")
    by_job: dict[int, set[int]] = {}
    for r in recs:
        if r["e"] == "step":
            by_job.setdefault(r["job"], set()).add(r["step"])
    assert by_job == {0: {1, 2, 3}, 1: {4, 5, 6}}
    assert [r["step"] for r in recs if r["e"] == "restore"] == [3]
    assert len(res["restart"]["breakdown"]) == 1 and res["restart"]["breakdown"][0]["start_s"] > 0
    table = out.read_text()
    assert f"| shrink 2 -> 1 | {elastic['idle_s']:.3f} s | {elastic['idle_s']:.3f} | " in table
    # The ratio where the elastic idle is measurable; a load spike can make a 0.05 s idle read <= 0 (gap - step).
    ratio = f"{restart['idle_s'] / elastic['idle_s']:.0f}x" if elastic["idle_s"] > 0 else "–"
    assert f"| {ratio} |" in table and "checkpoint-restart break-down" in table
