"""S-SGD driven by a strategy: the Keras 3 and v1 optimizer glue around :class:`StrategyPlan`.

The plan is made when the optimizer first sees the model's variables (Keras:
``build``; v1: ``apply_gradients``), from the strategy source given to
``SynchronousSGDOptimizer(opt, strategy=...)``. The wrapped optimizer is then
built on the plan's *targets* — the variables this rank updates — so a
parameter-server variable has optimizer slots only on its owner.

Example:
    >>> import keras
    >>> from kungfu_tf.optimizers import SynchronousSGDOptimizer
    >>> opt = SynchronousSGDOptimizer(keras.optimizers.Adam(0.01), strategy="PSLoadBalancing")
    >>> opt.build([keras.Variable([1.0, 2.0], name="w")])
    >>> len(opt._kungfu_plan.targets)   # one worker owns everything
    1
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import keras
import tensorflow as tf

from kungfu_tf.ops import elastic_membership as em
from kungfu_tf.ops.resize import add_growth_check, add_shrink_preparation
from kungfu_tf.optimizers._wrapping import wrap_keras
from kungfu_tf.optimizers.auto_search import start_auto_search
from kungfu_tf.optimizers.gradient_order import after_gradients
from kungfu_tf.optimizers.keras_build import build_as_apply_would
from kungfu_tf.optimizers.loss_scale_guard import (
    refuse_inside_loss_scale,
    refuse_loss_scale_with_servers,
)
from kungfu_tf.optimizers.norm_clipping import clipping_by_norm_off, norm_clip_of
from kungfu_tf.optimizers.optimizer_step_state import (
    advance_step_state,
    mark_step_state,
)
from kungfu_tf.optimizers.strategy_replan import (
    finalize_moving_averages,
    keep_slot_replicas,
)
from kungfu_tf.optimizers.strategy_resize import (
    is_builder,
    prepare_shrink,
    rebuild_for_cluster,
    refuse_fixed_replicas,
)
from kungfu_tf.optimizers.weight_decay_exclusion import decay_parts_as_their_variables
from kungfu_tf.strategy.auto.builder import Auto, is_auto
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.compiler import StrategyPlan
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.remap import remap_owners
from kungfu_tf.strategy.source import StrategySource, resolve_strategy
from kungfu_tf.strategy.variable_info import describe_variables


def make_plan(source: StrategySource, variables: list[Any], name: str, make_variable: Any = None) -> StrategyPlan:
    """The plan for ``variables`` on the running cluster.

    A joiner warms up alone (a cluster of one) before it is admitted: a
    written strategy's owners are re-mapped to it then, and the members'
    strategy replaces that plan when it joins (kungfu_tf/optimizers/strategy_resize.py).
    """
    kwargs: dict[str, Any] = {} if make_variable is None else {"make_variable": make_variable}
    if em.is_elastic() and em.is_joiner():
        # Its runtime is a cluster of one (kungfu_tf.size() counts the members it will join).
        strategy = resolve_strategy(source, describe_variables(variables), ClusterSpec(1))
        if not is_builder(source):
            strategy = remap_owners(strategy, (), (em.self_peer(),))
        return StrategyPlan(strategy, variables, name=name, rank=0, size=1, **kwargs)
    strategy = resolve_strategy(source, describe_variables(variables), ClusterSpec.current())
    return StrategyPlan(strategy, variables, name=name, **kwargs)


def _keras_variable(initial_value: tf.Tensor, name: str) -> keras.Variable:
    return keras.Variable(initial_value, trainable=True, name=name)


def wrap_keras_with_strategy(opt: keras.optimizers.Optimizer, source: StrategySource, name: str) -> keras.optimizers.Optimizer:
    """A copy of ``opt`` whose ``build``/``apply`` follow the strategy."""
    if is_auto(source) and not isinstance(source, Auto):
        source = Auto()  # the name "Auto": one search, with the defaults, for this optimizer

    def methods(base: type) -> dict[str, Any]:
        def build(self: keras.optimizers.Optimizer, var_list: Any) -> None:
            refuse_inside_loss_scale(self, "SynchronousSGDOptimizer")
            var_list = list(var_list)
            first_build = self.__dict__.get("_kungfu_plan") is None
            if first_build:
                plan = make_plan(self._kungfu_strategy, var_list, self._kungfu_name, _keras_variable)
                if self.kungfu_monitor is not None:
                    check_monitorable(plan)
                refuse_loss_scale_with_servers(self, plan.server_variables)
                # Bypass Keras' attribute tracking: the plan is not a layer or variable.
                object.__setattr__(self, "_kungfu_plan", plan)
                object.__setattr__(self, "_kungfu_model_variables", var_list)
                decay_parts_as_their_variables(self, [(var_list[vi], t) for vi, _, t in plan.placements() if t is not None])
                # A joiner's warm-up plan (a cluster of one) held no state of the job's.
                object.__setattr__(self, "_kungfu_warm_up_plan", em.is_elastic() and em.is_joiner())
                # What exists before the slots (iterations, learning rate): the same on every rank.
                object.__setattr__(self, "_kungfu_fixed_variable_ids", {id(v) for v in self.variables})
                if em.is_elastic():
                    # A strategy is a function of the cluster: re-built at every change, before the state syncs.
                    this = weakref.ref(self)

                    def rebuild(change: em.Change) -> None:
                        opt = this()
                        if opt is not None:
                            rebuild_for_cluster(opt, change)

                    def prepare(old_peers: tuple[str, ...], new_peers: tuple[str, ...], version: int) -> None:
                        opt = this()
                        if opt is not None:
                            prepare_shrink(opt, old_peers, new_peers, version)

                    def check_growth(new_size: int) -> None:
                        opt = this()
                        if opt is not None:
                            refuse_fixed_replicas(opt, new_size)

                    em.add_apply_listener(rebuild, first=True)
                    add_shrink_preparation(prepare)
                    add_growth_check(check_growth)
                if isinstance(self._kungfu_strategy, Auto) and not self._kungfu_warm_up_plan:
                    # The first steps of training are the search's trials (auto_search.py).
                    start_auto_search(self, self._kungfu_strategy)
            base.build(self, self._kungfu_plan.targets)
            if first_build:
                mark_step_state(self)  # Nadam's u_product: replicated as the step counter is
                # An elastic job's PS slots survive a crashed owner (strategy_replan.py). Only once: a
                # second build (compile_from_config) would replace the replicas the traced step writes.
                try:
                    keep_slot_replicas(self)
                except StrategyError as e:
                    # Built and planned by now: a caller that caught this must not train on in the next step.
                    object.__setattr__(self, "_kungfu_refused", str(e))
                    raise

        def apply(self: keras.optimizers.Optimizer, grads: Any, trainable_variables: Any = None) -> Any:
            refuse_inside_loss_scale(self, "SynchronousSGDOptimizer")
            refused = self.__dict__.get("_kungfu_refused")
            if refused is not None:
                raise StrategyError(refused)
            if trainable_variables is not None:
                trainable_variables = list(trainable_variables)
                # As Keras's apply builds (in the optimizer's name scope): a worker whose ElasticState built it
                # (keras_build.py) and a joiner whose warm-up step did must hold variables of the same names.
                build_as_apply_would(self, trainable_variables)
            elif not self.built:
                raise ValueError("call apply() with the variables the first time (the optimizer is not built)")
            session = self.__dict__.get("_kungfu_auto_session")
            if session is not None:
                session.check_driven()  # builders.Auto: refuse a step the search would never see

            grads = list(grads)
            # Under parameter servers the plan clips by norm (no worker holds every averaged gradient).
            clip = None if self._kungfu_plan.replicated else norm_clip_of(self)

            def apply_fn(gs: list[Any], vs: list[Any]) -> Any:
                # The counters have no data edge to the gradients: the plan runs this after the step's
                # synchronisation completed on every rank (StrategyPlan._completed_everywhere); the local
                # gradients are waited for too, for a stale plan's ranks that own nothing, where the step
                # whose input ran out (fit's end of an epoch of unknown length) would still count itself.
                if not vs:
                    # Nothing owned here this step; count the step anyway so that
                    # schedules, `iterations` and the step state agree on every rank.
                    with after_gradients(grads):
                        advance_step_state(self)  # as the owners' apply does (Nadam's u_product)
                        return self._iterations.assign_add(1)  # not `iterations`: it is a tensor when gradients accumulate
                with after_gradients(grads), clipping_by_norm_off(self) if clip else contextlib.nullcontext():
                    return base.apply(self, gs, vs)

            monitor = self.kungfu_monitor
            if monitor is None:
                return self._kungfu_plan.step(grads, apply_fn, clip=clip)
            local = monitor.local_statistics(grads)

            def observe(averaged: list[Any], rider: tf.Tensor) -> Any:
                return monitor.update(local, rider, grads, averaged, self._kungfu_name)

            return self._kungfu_plan.step(grads, apply_fn, rider=local.rider, observe=observe)

        def replicated_variables(self: keras.optimizers.Optimizer) -> list[Any]:
            # Slots of PS variables exist only on their owners: then only what
            # the optimizer held before its slots (step counter, learning
            # rate) is the same on every rank.
            plan = self.__dict__.get("_kungfu_plan")
            if plan is None or plan.replicated:
                return list(self.variables)
            return [v for v in self.variables if id(v) in self._kungfu_fixed_variable_ids]

        def add_variable_from_reference(
            self: keras.optimizers.Optimizer, reference_variable: Any, name: Any = None, initializer: Any = "zeros"
        ) -> Any:
            # Records which target each slot belongs to: moving slots to a new plan needs it (strategy_replan.py).
            slot = base.add_variable_from_reference(self, reference_variable, name=name, initializer=initializer)
            self.__dict__.setdefault("_kungfu_slot_targets", {})[id(slot)] = id(reference_variable)
            return slot

        def finalize_variable_values(self: keras.optimizers.Optimizer, var_list: Any) -> None:
            # fit's end with use_ema=True: under parameter servers only the owners hold the averages.
            plan = self.__dict__.get("_kungfu_plan")
            if not self.use_ema or plan is None or plan.replicated:
                return base.finalize_variable_values(self, var_list)
            finalize_moving_averages(self, list(var_list))

        def build_base(self: keras.optimizers.Optimizer, targets: list[Any]) -> None:
            # The wrapped optimizer's own build (its slots) on a new plan's targets (strategy_replan.py), named as
            # its first step named them: a joiner that kept its warm-up's must hold the same names.
            with keras.name_scope(self.name, caller=self):
                base.build(self, targets)

        def switch(self: keras.optimizers.Optimizer, strategy: StrategySource, model: Any = None) -> Any:
            """:func:`kungfu_tf.optimizers.switch_strategy` of this optimizer."""
            from kungfu_tf.optimizers.strategy_switch import switch_strategy

            return switch_strategy(self, strategy, model=model)

        return {
            "build": build,
            "apply": apply,
            "_kungfu_replicated_variables": replicated_variables,
            "_kungfu_build_base": build_base,
            "finalize_variable_values": finalize_variable_values,
            "add_variable_from_reference": add_variable_from_reference,
            "kungfu_switch_strategy": switch,
        }

    return wrap_keras(
        opt,
        methods,
        f"{type(opt).__name__} synchronised by a kungfu_tf strategy.",
        "SynchronousSGDOptimizer",
        _kungfu_strategy=source,
        _kungfu_name=name,
        _kungfu_plan=None,
        _kungfu_make_variable=staticmethod(_keras_variable),
        kungfu_monitor=None,
    )


def check_monitorable(plan: StrategyPlan) -> None:
    """``ValueError`` if ``plan`` puts variables on parameter servers, which a GradientMonitor cannot observe."""
    if not plan.replicated:
        raise ValueError(
            "SynchronousSGDOptimizer(monitor=...) needs the averaged gradient of every variable on every "
            f"worker, but the strategy updates {plan.server_variables} on parameter servers (only their owner "
            "sees their averaged gradient); use an all-reduce strategy ('AllReduce', 'PartitionedAR') or no monitor"
        )
