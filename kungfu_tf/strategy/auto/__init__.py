"""AutoStrategy's search model: candidate sampler, link calibration, cost model and learned ranker.

AutoDist §2.4 (papers/autodist-composable-sync.md): a guided sampler proposes
strategies under three constraints, a cost model calibrated on the cluster's
measured links scores them, and a ranker trained on trial runs refines the
scores. The trial runs (trials.py), the search of Algorithm 1 (search.py,
over search_model.py) and the ``Auto`` builder (builder.py: ``builders.Auto``,
``kungfu-strategy search``) sit on top of these modules.

Example:
    >>> from kungfu_tf.strategy.auto.sampler import sample_strategies
    >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
    >>> from kungfu_tf.strategy.variable_info import VariableInfo
    >>> len(sample_strategies([VariableInfo("w", (4, 4))], ClusterSpec(2), count=3, seed=0))
    3
"""
