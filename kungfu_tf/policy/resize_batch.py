"""``ResizeBatchRule``: what a change of the cluster size does to the batch size.

A job-level choice, made once (``PolicyRunner(on_resize=..., max_global_batch_size=...)``):

* ``"keep_local"`` (default; Or et al. §2.2): every worker keeps its
  per-worker batch, so the global batch grows and shrinks with the cluster,
  up to ``max_global_batch_size``; past it the per-worker batch shrinks to
  ``max_global_batch_size // size`` (at least 1), and grows back to the
  wanted per-worker batch when the cluster shrinks again;
* ``"keep_global"``: the global batch stays; each worker takes
  ``global // size`` (at least 1). Where the size does not divide it, the
  remainder is dropped: the job trains ``size * (global // size)`` samples
  per step (e.g. 96 at 5 workers: 19 each, 95 a step), and the wanted 96
  comes back at a size that divides it.

The wanted value (the per-worker batch for ``keep_local``, the global batch
for ``keep_global``) is what a batch policy's ``set_batch_size`` sets; the
rule derives each size's per-worker batch from it. The runner's
``lr_rule`` then follows every change of the global batch, whether a policy
or a resize caused it.

Example:
    >>> rule = ResizeBatchRule("keep_local", max_global_batch_size=256)
    >>> [rule.local_batch(size, wanted=64) for size in (1, 2, 4, 8)]
    [64, 64, 64, 32]
    >>> ResizeBatchRule("keep_global").local_batch(5, wanted=96)
    19
"""

from __future__ import annotations

from typing import Any

ON_RESIZE = ("keep_local", "keep_global")


class ResizeBatchRule:
    """The per-worker batch at each cluster size (see the module docstring).

    Args:
        mode: "keep_local" or "keep_global".
        max_global_batch_size: with "keep_local", the largest global batch
            (None: no cap).

    Raises:
        ValueError: an unknown mode, a cap that is not a positive int, or a
            cap with "keep_global".
    """

    def __init__(self, mode: str = "keep_local", max_global_batch_size: int | None = None):
        if mode not in ON_RESIZE:
            raise ValueError(f"on_resize must be one of {', '.join(ON_RESIZE)}, got {mode!r}")
        cap = max_global_batch_size
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
            raise ValueError(f"max_global_batch_size must be a positive int or None, got {cap!r}")
        if cap is not None and mode != "keep_local":
            raise ValueError(f"max_global_batch_size caps the growing global batch of on_resize='keep_local', not {mode!r}")
        self.mode, self.max_global_batch_size = mode, cap

    def wanted(self, global_batch: int, size: int) -> int:
        """The wanted value a global batch at ``size`` workers sets (per-worker for keep_local, else global)."""
        return global_batch // size if self.mode == "keep_local" else global_batch

    def local_batch(self, size: int, wanted: int) -> int:
        """The per-worker batch at ``size`` workers."""
        if self.mode == "keep_global":
            return max(1, wanted // size)
        if self.max_global_batch_size is not None and wanted * size > self.max_global_batch_size:
            return max(1, self.max_global_batch_size // size)
        return wanted

    def config(self) -> dict[str, Any]:
        return {"on_resize": self.mode, "max_global_batch_size": self.max_global_batch_size}


__all__ = ["ON_RESIZE", "ResizeBatchRule"]
