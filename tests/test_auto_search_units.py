"""The search of builders.Auto in one process: Algorithm 1's bookkeeping, the trials' failure rules, bad input.

The search model here is a stand-in with known "true" step times, so that
what the search must return is known independently of it: the fastest
strategy among those it tried, after exactly ``budget`` trials. The
multi-worker behaviour (agreement, switching, training equivalence) is in
tests/test_auto_search.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import tensorflow as tf

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy import StrategyError
from kungfu_tf.strategy.auto.builder import Auto, is_auto
from kungfu_tf.strategy.auto.search import Search, SearchBudget, check_searchable
from kungfu_tf.strategy.auto.trials import Trial, TrialResult, TrialRunner
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.source import check_source, resolve_strategy
from kungfu_tf.strategy.variable_info import VariableInfo

# The stand-in's candidates and the step time each "really" takes.
TRUE_SECONDS = {f"s{i}": 0.010 + 0.001 * ((7 * i) % 13) for i in range(13)}


def candidate(name: str) -> strategy_pb2.Strategy:
    """A strategy named ``name`` whose nodes differ from every other name's (the search ignores ids)."""
    s = strategy_pb2.Strategy(id=name)
    s.node_config.add(var_name=name).all_reduce.group = 0
    return s


class FakeModel:
    """Samples from TRUE_SECONDS (deterministic by seed), predicts a noisy time, records what it learned."""

    def __init__(self) -> None:
        self.learned: list[int] = []

    def sample(self, count, seed):
        ids = sorted(TRUE_SECONDS)
        return [candidate(ids[(seed * 5 + j) % len(ids)]) for j in range(count)]

    def predict(self, strategies):
        return [TRUE_SECONDS[s.id] * (1.5 if int(s.id[1:]) % 2 else 1.0) for s in strategies]

    def cost_model_predict(self, strategies):
        return [TRUE_SECONDS[s.id] * 2 for s in strategies]

    def learn(self, strategies, measured):
        self.learned.append(len(strategies))

    def fidelity(self):
        return 0.5

    def select(self, candidates, scores, k):
        return sorted(range(len(candidates)), key=lambda i: scores[i])[:k]


def run(search: Search, fail: set[str] = frozenset(), wall: float = 1.0) -> list[str]:
    tried = []
    while (c := search.next_candidate()) is not None:
        tried.append(c.id)
        seconds = math.inf if c.id in fail else TRUE_SECONDS[c.id]
        search.record(TrialResult(search.trials_done, c.id, seconds, wall, "boom" if c.id in fail else None))
    return tried


def test_search_spends_exactly_the_trial_budget_and_returns_the_fastest_tried(tmp_path):
    model = FakeModel()
    search = Search(model, SearchBudget(trials=7), candidates_per_round=4, trials_per_round=3,
                    log_path=tmp_path / "log.jsonl", show_progress=False)  # fmt: skip
    tried = run(search)
    search.close()
    assert len(tried) == 7 and len(set(tried)) == 7  # never the same candidate twice
    assert search.best.id == min(tried, key=TRUE_SECONDS.__getitem__)
    assert model.learned == [3, 6, 7]  # the ranker learns after each round, on every trial so far
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [x["strategy_id"] for x in lines] == tried
    for x in lines:
        assert x["measured_seconds"] == pytest.approx(TRUE_SECONDS[x["strategy_id"]])
        assert x["score"] > 0 and x["fidelity"] == 0.5
        assert x["predicted_seconds"] == pytest.approx(2 * TRUE_SECONDS[x["strategy_id"]])
    assert [x["round"] for x in lines] == [0, 0, 0, 1, 1, 1, 2]


def test_seconds_budget_counts_the_agreed_wall_time_of_trials():
    search = Search(FakeModel(), SearchBudget(seconds=2.5), show_progress=False)
    assert len(run(search, wall=1.0)) == 3  # 0, 1, 2 s spent before the 1st, 2nd, 3rd trial


def test_failed_trials_are_scored_infinitely_slow_and_the_search_goes_on(capsys):
    search = Search(FakeModel(), SearchBudget(trials=4), trials_per_round=4)
    first = search.next_candidate().id
    tried = run(search, fail={first})
    assert tried[0] == first and len(tried) == 4
    assert search.best.id != first
    out = capsys.readouterr().out
    assert out.count("kungfu auto: trial") == 4 and "measured failed" in out


def test_every_trial_failed_is_a_precise_error():
    search = Search(FakeModel(), SearchBudget(trials=2), show_progress=False)
    run(search, fail=set(TRUE_SECONDS))
    with pytest.raises(StrategyError, match="no trial of the search succeeded"):
        _ = search.best


def test_initial_candidates_come_first_and_the_search_stops_when_nothing_new_is_left():
    renamed = candidate("s2")
    renamed.id = "the same nodes as s2"

    class Few(FakeModel):
        def sample(self, count, seed):
            return [candidate("s1"), candidate("s2"), candidate("s1"), renamed]

    start = candidate("s3")
    search = Search(Few(), SearchBudget(trials=10), initial=[start], show_progress=False)
    tried = run(search)
    assert tried[0] == "s3" and sorted(tried[1:]) == ["s1", "s2"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"budget": 0}, "at least one trial, got trials=0"),
        ({"budget": None}, "needs a number of trials or of seconds"),
        ({"budget": None, "seconds": 0}, "must be > 0, got seconds=0"),
        ({"trial_steps": 0}, "trial_steps must be an int >= 1"),
        ({"warmup": -1}, "warmup must be an int >= 0"),
    ],
)
def test_auto_rejects_bad_settings(kwargs, message):
    with pytest.raises(StrategyError, match=message):
        Auto(**kwargs)


def test_no_variables_and_one_worker_are_precise_errors():
    with pytest.raises(StrategyError, match="no trainable variables"):
        Auto().build([], ClusterSpec(2))
    with pytest.raises(StrategyError, match="at least 2 workers"):
        check_searchable([VariableInfo("w", (2,))], 1)


def test_auto_by_name_and_its_starting_strategy():
    check_source("Auto")
    assert is_auto("Auto") and is_auto(Auto()) and not is_auto("AllReduce")
    s = resolve_strategy("Auto", [VariableInfo("w", (2,)), VariableInfo("b", (1,))], ClusterSpec(2))
    assert [n.WhichOneof("synchronizer") for n in s.node_config] == ["all_reduce", "all_reduce"]


def test_a_trial_that_raises_in_a_step_fails_without_running_the_rest():
    calls = []

    def step():
        calls.append(1)
        raise MemoryError("out of memory")

    result = TrialRunner(lambda s: None, step, warmup=2, trial_steps=3).run(0, strategy_pb2.Strategy(id="x"))
    assert result.failed and calls == [1] and result.error == "step 0: MemoryError: out of memory"


def test_the_end_of_the_input_goes_up_to_the_loop_and_the_trial_goes_on():
    # Keras fit ends an epoch of unknown length with OutOfRangeError: not the candidate's failure.
    trial = Trial(0, strategy_pb2.Strategy(id="s"), warmup=0, trial_steps=1)
    trial.begin(lambda s: None)

    def end_of_input():
        raise tf.errors.OutOfRangeError(None, None, "End of sequence")

    with pytest.raises(tf.errors.OutOfRangeError):
        trial.run_step(end_of_input)
    assert not trial.failed and trial.steps_run == 0 and not trial.done
    assert trial.run_step(lambda: 5) == (True, 5) and trial.done and not trial.result().failed


def test_a_plain_tf_function_step_under_auto_is_refused_naming_elastic_function():
    import keras

    from kungfu_tf.optimizers import SynchronousSGDOptimizer
    from kungfu_tf.strategy import builders, step_driver

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy=builders.Auto(budget=2))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    before = [v.numpy() for v in model.trainable_variables]
    try:
        # A StrategyError (not AutoGraph's StagingError) although it is raised while tf.function traces.
        with pytest.raises(StrategyError, match="kungfu_tf.elastic.function instead of tf.function"):
            step(np.ones((2, 3), "float32"))
    finally:
        step_driver.uninstall()
    for b, v in zip(before, model.trainable_variables, strict=True):
        np.testing.assert_array_equal(b, v.numpy())  # nothing trained without the search


def test_the_fit_callback_refuses_an_optimizer_without_auto():
    import keras

    import kungfu_tf.keras as kfk
    from kungfu_tf.optimizers import SynchronousSGDOptimizer

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy="AllReduce"), loss="mse")
    x = np.ones((4, 3), "float32")
    with pytest.raises(TypeError, match=r"AutoSearchCallback runs the search of .*builders.Auto.* with the strategy 'AllReduce'"):
        model.fit(x, x[:, :2], epochs=1, verbose=0, callbacks=[kfk.AutoSearchCallback()])


@pytest.mark.parametrize("auto", [Auto(budget=2), "Auto"])
def test_a_v1_optimizer_refuses_auto_naming_the_search_command(auto):
    from kungfu_tf.optimizers import SynchronousSGDOptimizer

    with pytest.raises(StrategyError, match=r"a v1 graph cannot switch strategy .*\(kungfu-strategy search\)"):
        SynchronousSGDOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), strategy=auto)


def test_auto_with_one_worker_is_a_precise_error_at_the_first_searching_step():
    import keras

    from kungfu_tf.elastic import function as step_function
    from kungfu_tf.optimizers import SynchronousSGDOptimizer
    from kungfu_tf.strategy import builders, step_driver

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy=builders.Auto(budget=2))

    @step_function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    x = np.ones((2, 3), "float32")
    step(x)  # builds the optimizer on the starting all-reduce strategy
    with pytest.raises(StrategyError, match="needs at least 2 workers .* the job has 1"):
        step(x)
    assert step_driver.installed() is None  # the search left: training can go on
    step(x)


def test_auto_on_a_model_without_trainable_variables_is_a_precise_error():
    import keras

    from kungfu_tf.optimizers import SynchronousSGDOptimizer
    from kungfu_tf.strategy import builders

    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy=builders.Auto(budget=2))
    with pytest.raises(StrategyError, match="no trainable variables"):
        opt.build([])


def test_confirmation_re_measures_the_fastest_and_chooses_by_the_mean(tmp_path, capsys):
    # A lucky first trial (s1 measured at a third of its time) wins a search without confirmation;
    # with it, the fastest two run once more and the truly fastest of them wins on the mean.
    model = FakeModel()
    search = Search(model, SearchBudget(trials=4), trials_per_round=4, confirm_top=2,
                    log_path=tmp_path / "log.jsonl")  # fmt: skip
    tried, lucky = [], None
    while (c := search.next_candidate()) is not None:
        tried.append(c.id)
        seconds = TRUE_SECONDS[c.id]
        if lucky is None:
            lucky = c.id
            seconds /= 3
        search.record(TrialResult(search.trials_done, c.id, seconds, 1.0))
    search.close()
    explored = tried[:4]
    assert len(tried) == 6 and len(set(explored)) == 4  # the budget, then 2 confirmation trials beyond it
    second = min((i for i in explored if i != lucky), key=TRUE_SECONDS.__getitem__)
    assert tried[4:] == [lucky, second]  # the fastest measured first
    expected = min(explored, key=lambda i: TRUE_SECONDS[i] * (2 / 3 if i == lucky else 1))
    assert search.best.id == expected
    assert search.best_seconds == pytest.approx(TRUE_SECONDS[expected] * (2 / 3 if expected == lucky else 1))
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [x["confirmation"] for x in lines] == [False] * 4 + [True] * 2
    out = capsys.readouterr().out
    assert out.count("kungfu auto: trial") == 4 and out.count("kungfu auto: confirmation") == 2


def test_confirmation_changes_the_choice_when_the_first_measurement_was_luck():
    # s0 truly 10 ms; s3 truly 13 ms but measured 9 ms once: without confirmation s3 wins, with it s0.
    class Two(FakeModel):
        def sample(self, count, seed):
            return [candidate("s0"), candidate("s3")]

    def run_with(confirm_top):
        search, first = Search(Two(), SearchBudget(trials=2), confirm_top=confirm_top, show_progress=False), {}
        while (c := search.next_candidate()) is not None:
            seconds = 0.009 if c.id == "s3" and c.id not in first else 0.010 if c.id == "s0" else 0.013
            first[c.id] = True
            search.record(TrialResult(search.trials_done, c.id, seconds, 1.0))
        return search

    assert run_with(0).best.id == "s3" and run_with(0).trials_done == 2
    confirmed = run_with(2)
    assert confirmed.best.id == "s0" and confirmed.trials_done == 4
    assert confirmed.best_seconds == pytest.approx(0.010)


def test_no_confirmation_with_one_strategy_measured_and_a_failed_confirmation_loses():
    search = Search(FakeModel(), SearchBudget(trials=2), confirm_top=2, show_progress=False)
    first = search.next_candidate().id
    tried = run(search, fail={c for c in TRUE_SECONDS if c != first})
    assert tried[1:2] != [first] and len(tried) == 2  # the other failed: nothing to compare, no confirmation

    search = Search(FakeModel(), SearchBudget(trials=3), trials_per_round=3, confirm_top=2, show_progress=False)
    explored = [search.next_candidate().id]
    search.record(TrialResult(0, explored[0], TRUE_SECONDS[explored[0]], 1.0))
    while len(explored) < 3:
        explored.append(search.next_candidate().id)
        search.record(TrialResult(len(explored) - 1, explored[-1], TRUE_SECONDS[explored[-1]], 1.0))
    fastest = search.next_candidate().id
    assert fastest == min(explored, key=TRUE_SECONDS.__getitem__)
    search.record(TrialResult(3, fastest, math.inf, 1.0, "boom"))  # its second trial failed
    runner_up = search.next_candidate().id
    search.record(TrialResult(4, runner_up, TRUE_SECONDS[runner_up], 1.0))
    assert search.next_candidate() is None and search.best.id == runner_up


@pytest.mark.parametrize("confirm_top", [1, -1, True, 2.0])
def test_confirm_top_must_be_zero_or_a_comparison(confirm_top):
    with pytest.raises(StrategyError, match="confirm_top must be 0"):
        Search(FakeModel(), SearchBudget(trials=2), confirm_top=confirm_top)
    with pytest.raises(StrategyError, match="confirm_top must be 0"):
        Auto(confirm_top=confirm_top)


def test_a_sampled_id_tried_before_under_other_nodes_is_renamed():
    class SameNames(FakeModel):
        def sample(self, count, seed):
            s = candidate(f"s{seed}")
            s.id = "auto-1"  # a sampler that names by index: the same id in every round
            return [s]

        def predict(self, strategies):
            return [1.0 for _ in strategies]

        cost_model_predict = predict

    search = Search(SameNames(), SearchBudget(trials=3), trials_per_round=1, show_progress=False)
    tried = []
    while (c := search.next_candidate()) is not None:
        tried.append(c.id)
        search.record(TrialResult(search.trials_done, c.id, 0.01, 1.0))
    assert tried == ["auto-1", "auto-1-r1", "auto-1-r2"]


class Counter:
    """A stand-in for the runtime's probe-sample count: grows by ``grow[i]`` during step i."""

    def __init__(self, grow):
        self.grow, self.value, self.steps = list(grow), 0, 0

    def read(self):
        return self.value

    def step(self):
        self.value += self.grow[self.steps] if self.steps < len(self.grow) else 0
        self.steps += 1


@pytest.mark.parametrize("grow, wait, expected_waited", [
    ([0, 0, 0, 0], 5, 0),        # nothing probed in the warm-up's last step: timing starts at once
    ([0, 3, 2, 1, 0, 0], 5, 3),  # probing in the warm-up's last step and the two after it: the 3rd after is timed
    ([0, 3, 2, 1, 1, 1, 1], 2, 2),  # still probing: at most the wait, then timed anyway
    ([0, 3, 2, 1, 1], 0, 0),     # no wait asked for
])  # fmt: skip
def test_a_trial_times_no_step_in_which_auto_probed(grow, wait, expected_waited):
    counter = Counter(grow)
    times = iter(range(100))
    trial = Trial(0, strategy_pb2.Strategy(id="s"), warmup=2, trial_steps=2, probe_wait_steps=wait,
                  probe_samples=counter.read)  # fmt: skip
    trial.begin(lambda s: None)
    timed_from = None
    while not trial.done:
        before = trial.timed_steps
        trial.run_step(lambda: (counter.step(), next(times)))
        if trial.timed_steps > before and timed_from is None:
            timed_from = counter.steps - 1
    assert trial.waited_steps == expected_waited
    assert trial.steps_run == 2 + expected_waited + 2 and timed_from == 2 + expected_waited
    assert not trial.result().failed


def test_a_joiner_adopts_the_members_result_and_builds_what_they_build():
    from kungfu_tf.strategy import builders
    from kungfu_tf.strategy.auto.builder import AutoResult
    from kungfu_tf.strategy.format import canonical_bytes
    from kungfu_tf.strategy.source_record import source_record

    variables = [VariableInfo("w", (64, 8)), VariableInfo("b", (8,))]
    three, two = ClusterSpec(3, (0, 0, 0)), ClusterSpec(2, (0, 0))
    members = Auto()
    members.result = AutoResult(builders.PS().build(variables, three), three, 0.02, search_seconds=3.0)
    record = json.loads(json.dumps(source_record(members)))  # as the first member broadcasts it
    joiner = Auto()
    assert canonical_bytes(joiner.build(variables, three)) != canonical_bytes(members.build(variables, three))
    assert record["auto"]["settings"] == joiner.search_settings()
    joiner.adopt_results(record["auto"]["results"])
    for cluster in (three, two):  # the searched best for its cluster, the all-reduce strategy for another
        assert canonical_bytes(joiner.build(variables, cluster)) == canonical_bytes(members.build(variables, cluster))
    assert [n.WhichOneof("synchronizer") for n in joiner.build(variables, three).node_config] == ["ps", "ps"]
    # Results for several clusters: each builds its own best; a second search of one cluster replaces its first.
    members.result = AutoResult(builders.PartitionedPS().build(variables, two), two, 0.01)
    members.result = AutoResult(builders.PSLoadBalancing().build(variables, two), two, 0.01)
    assert [r.cluster.replicas for r in members.results] == [3, 2]
    joiner.adopt_results(json.loads(json.dumps(source_record(members)))["auto"]["results"])
    for cluster in (three, two, ClusterSpec(4)):
        assert canonical_bytes(joiner.build(variables, cluster)) == canonical_bytes(members.build(variables, cluster))
    assert members.build(variables, two).id == "PSLoadBalancing"
    joiner.adopt_results(json.loads(json.dumps(source_record(Auto())))["auto"]["results"])  # the members had none
    assert joiner.result is None and joiner.results == []
    with pytest.raises(StrategyError, match="the members' Auto search results cannot be read here"):
        joiner.adopt_results([{"best": "zz"}])


def test_a_joiner_with_other_auto_settings_is_refused():
    from types import SimpleNamespace

    from kungfu_tf.optimizers.strategy_resize import _adopt_auto_result
    from kungfu_tf.strategy.source_record import source_record

    members = Auto(budget=4, research_budget=2)
    record = source_record(members)["auto"]
    same = SimpleNamespace(_kungfu_strategy=Auto(budget=4, research_budget=2))
    assert _adopt_auto_result(same, record, joined=True, prefix="t/same") is same._kungfu_strategy
    # A joiner that would not search where the members do (or with other trials) would leave them waiting.
    other = SimpleNamespace(_kungfu_strategy=Auto(budget=4))
    with pytest.raises(StrategyError, match="the joiner's script must make the same Auto"):
        _adopt_auto_result(other, record, joined=True, prefix="t/other")
    with pytest.raises(StrategyError, match="this joiner runs PS"):
        _adopt_auto_result(SimpleNamespace(_kungfu_strategy=builders_ps()), record, joined=True, prefix="t/ps")


def builders_ps():
    from kungfu_tf.strategy import builders

    return builders.PS()


@pytest.mark.parametrize("kwargs, message", [
    ({"research_budget": 1}, "research_budget must allow at least 2 trials"),
    ({"research_budget": 0}, "the search budget must allow at least one trial"),
    ({"research_budget": 2, "cluster": ClusterSpec(2)}, "pass one or the other"),
])  # fmt: skip
def test_research_budget_rejects_what_cannot_search(kwargs, message):
    with pytest.raises(StrategyError, match=message):
        Auto(**kwargs)


def test_a_change_stops_a_search_session_that_has_not_started():
    # A session installed (the optimizer built with Auto) but not started when the cluster changes: left
    # installed, it would start its search at the next step on the members only (a joiner has none) or, at one
    # worker, fail the step. The change stops it on every worker; with research_budget a new one replaces it.
    import keras

    from kungfu_tf.ops.elastic_membership import Change
    from kungfu_tf.optimizers import SynchronousSGDOptimizer
    from kungfu_tf.optimizers.strategy_resize import _search_again_if_asked
    from kungfu_tf.strategy import step_driver

    for research, peers, replaced in ((None, ("h:1", "h:2"), False), (2, ("h:1",), False), (2, ("h:1", "h:2"), True)):
        opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy=Auto(budget=2, research_budget=research))
        opt.build([keras.Variable([1.0, 2.0], name="w")])
        first = opt._kungfu_auto_session
        assert step_driver.installed() is first and not first.finished
        _search_again_if_asked(opt, Change(1, 2, ("h:1", "h:2", "h:3"), peers, "h:1"))
        assert first.finished
        now = step_driver.installed()
        assert (now is not None and now is opt._kungfu_auto_session and now.research) == replaced, (research, peers)
        step_driver.uninstall()
