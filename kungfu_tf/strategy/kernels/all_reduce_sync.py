"""All-reduce synchronizer kernel with the merge-group fuser.

Dense gradients of one merge group become one ``group_all_reduce`` over one
fused buffer (one collective per group, reduction and wire dtype: compressed
shares are summed, other gradients averaged), on the group's
topology; sparse gradients are all-gathered (indices and values of every
worker), so that only touched rows travel.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.strategy.kernels.all_reduce_sync import GroupedAllReduce
    >>> ar = GroupedAllReduce("doc")
    >>> ar.add("a", tf.ones([2]), group=0, topology="AUTO")
    >>> ar.add("b", tf.ones([3]), group=0, topology="AUTO")
    >>> {k: v.numpy().tolist() for k, v in ar.run().items()}  # one worker: unchanged
    {'a': [1.0, 1.0], 'b': [1.0, 1.0, 1.0]}
"""

from __future__ import annotations

from collections.abc import Hashable

import tensorflow as tf

from kungfu_tf import ops


class GroupedAllReduce:
    """Collects dense tensors by merge group, then averages each group with one collective.

    Args:
        prefix: message-key prefix, unique per traced step and identical on
            every worker.

    Example:
        >>> GroupedAllReduce("p").run()
        {}
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        # (merge group, reduction) -> queued (key, tensor)
        self._groups: dict[tuple[int, str], list[tuple[Hashable, tf.Tensor]]] = {}
        self._topology: dict[int, str] = {}

    def add(self, key: Hashable, tensor: tf.Tensor, group: int, topology: str, op: str = "mean") -> None:
        """Queues ``tensor`` (already encoded for the wire) in merge group ``group``.

        ``op``: "mean" for a gradient, "sum" for a share that is already
        divided by the cluster size (see :class:`~kungfu_tf.strategy.kernels.compressor.Compressor`);
        each reduction of a group is its own collective.
        """
        if op not in ("mean", "sum"):
            raise ValueError(f"op must be 'mean' or 'sum', got {op!r}")
        self._groups.setdefault((group, op), []).append((key, tensor))
        # Validation guarantees one topology per group.
        self._topology[group] = topology

    def run(self) -> dict[Hashable, tf.Tensor]:
        """Reduces every queued tensor over all workers; returns key -> average (or sum of shares)."""
        out: dict[Hashable, tf.Tensor] = {}
        for group, op in sorted(self._groups):
            items = self._groups[(group, op)]
            topology = self._topology[group]
            reduced = ops.group_all_reduce(
                [t for _, t in items],
                op=op,
                name=f"{self.prefix}/group{group}" + ("" if op == "mean" else f"/{op}"),
                topology=None if topology in ("", "AUTO") else topology,
            )
            out.update((key, r) for (key, _), r in zip(items, reduced))
        return out
