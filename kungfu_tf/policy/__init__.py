"""Adaptation policies (KungFu §3): change batch size, learning rate, topology and cluster size while training runs.

Example:
    >>> import kungfu_tf.policy as kfp
    >>> class DoubleAtEpoch2(kfp.BasePolicy):
    ...     def after_epoch(self, ctx):
    ...         if ctx.epoch == 2:
    ...             ctx.set_batch_size(2 * ctx.batch_size)
    >>> runner = kfp.PolicyRunner([DoubleAtEpoch2()], batch_size=64)
"""

from kungfu_tf.policy.adaptive_topology import AdaptiveTopologyPolicy
from kungfu_tf.policy.autoscaling import AutoscalingPolicy
from kungfu_tf.policy.base_policy import BasePolicy
from kungfu_tf.policy.context import PolicyContext
from kungfu_tf.policy.errors import PeerPolicyError, PolicyDisagreementError
from kungfu_tf.policy.gns_batch_size import GNSBatchSizePolicy
from kungfu_tf.policy.gns_resize import GNSResizePolicy
from kungfu_tf.policy.goodput_batch_size import GoodputBatchSizePolicy
from kungfu_tf.policy.hysteresis import Hysteresis
from kungfu_tf.policy.learning_rate_rule import LR_RULES, scaled_learning_rate
from kungfu_tf.policy.policy_state import PolicyState
from kungfu_tf.policy.resource_provisioning import ResourceProvisioningPolicy
from kungfu_tf.policy.runner import Decision, PolicyRunner
from kungfu_tf.policy.scaling_search import ScalingSearch
from kungfu_tf.policy.straggler import StragglerPolicy
from kungfu_tf.policy.strategy_policy import StrategyPolicy
from kungfu_tf.policy.strategy_scoring import CostModelScorer
from kungfu_tf.policy.utility import (
    ConcaveUtility,
    LinearUtility,
    StepUtility,
    check_utility,
)

__all__ = [
    "LR_RULES",
    "AdaptiveTopologyPolicy",
    "AutoscalingPolicy",
    "BasePolicy",
    "ConcaveUtility",
    "CostModelScorer",
    "Decision",
    "GNSBatchSizePolicy",
    "GNSResizePolicy",
    "GoodputBatchSizePolicy",
    "Hysteresis",
    "LinearUtility",
    "PeerPolicyError",
    "PolicyContext",
    "PolicyDisagreementError",
    "PolicyRunner",
    "PolicyState",
    "ResourceProvisioningPolicy",
    "ScalingSearch",
    "StepUtility",
    "StragglerPolicy",
    "StrategyPolicy",
    "check_utility",
    "scaled_learning_rate",
]
