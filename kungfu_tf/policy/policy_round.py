"""The round after a hook phase: agree on the outcome, then check and apply the requests together.

The rounds themselves are :class:`~kungfu_tf.policy.agreement.Agreement`'s
collectives; here is what the runner does with their answers:

1. every worker says whether its phase failed, asked for changes, or neither
   (one all-reduce); nothing happens when all were idle;
2. when one failed, every worker raises: the failing one its own error, the
   others :class:`PeerPolicyError` naming rank and hook;
3. otherwise every worker checks with consensus that all asked for the same
   (:func:`require_agreement`; else all raise
   :class:`PolicyDisagreementError` naming the setting and each rank's value),
   applies the requests, and waits at a barrier, so that every worker runs
   the next step with the same settings.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from kungfu_tf.policy.agreement import CHANGES, FAILED, IDLE, Agreement
from kungfu_tf.policy.base_policy import BasePolicy
from kungfu_tf.policy.errors import PeerPolicyError, PolicyDisagreementError

# The adaptable settings, in the order they are applied (the learning rate
# may follow the batch size; the topology is independent; the cluster size
# last, since a shrink may detach this worker).
SETTINGS = ("batch_size", "learning_rate", "topology", "size")

Failure = tuple[str, BaseException]  # (where: "<Policy>.<hook>", the error)


def settle(
    agreement: Agreement,
    requests: dict[str, Any],
    failure: Failure | None,
    rank: int,
    apply: Callable[[], None],
    detached: Callable[[], bool],
) -> None:
    """One round over this worker's outcome of a phase: ``failure``, or the ``requests`` it made (see the module).

    ``apply()`` applies the agreed requests; ``detached()`` says whether that
    took this worker out of the cluster (then it skips the barrier: its
    collectives with the old peers would fail). ``requests`` is cleared.
    """
    mine = FAILED if failure else (CHANGES if requests else IDLE)
    status = agreement.status(mine)
    if status == IDLE:
        return
    if status == FAILED:
        text = "" if failure is None else f"{failure[0]} failed on rank {rank}: {type(failure[1]).__name__}: {failure[1]}"
        texts = [t for t in agreement.gather_text(text) if t]
        requests.clear()
        if failure is not None:
            raise failure[1]
        raise PeerPolicyError("; ".join(texts))
    require_agreement(agreement, {name: requests.get(name) for name in SETTINGS}, "the requested changes", requests)
    apply()
    requests.clear()
    if detached():
        return
    agreement.barrier()


def require_agreement(agreement: Agreement, values: dict[str, Any], what: str, requests: dict[str, Any]) -> None:
    """Consensus on ``values``; on a difference clears ``requests`` and raises naming each differing key.

    Raises:
        PolicyDisagreementError: on every worker, with each rank's value of each key that differs.
    """
    payload = json.dumps(values, sort_keys=True)
    if agreement.agree(payload.encode()):
        return
    by_rank = [json.loads(t) if t else {} for t in agreement.gather_text(payload)]
    differing = [k for k in values if len({json.dumps(r.get(k)) for r in by_rank}) > 1]
    detail = "; ".join(
        f"{k}: " + ", ".join(f"rank {r} {_shown(v.get(k))}" for r, v in enumerate(by_rank)) for k in differing
    )
    requests.clear()
    raise PolicyDisagreementError(
        f"workers differ on {what} ({', '.join(differing)}): {detail}; nothing was changed on any worker"
    )


def agree_on_setup(
    agreement: Agreement, setup: dict[str, Any], policies: Sequence[BasePolicy], requests: dict[str, Any]
) -> None:
    """Checks that every worker runs the same ``setup`` and the same policies with the same parameters.

    Workers running different policies (or settings) would issue different
    collectives and hang; this says so instead, naming the setting.
    """
    setup = dict(setup)
    # Parameters too, one key each (the error names the one that differs):
    # AdaptiveTopologyPolicy(window=4) against window=5 would hang.
    for i, policy in enumerate(policies):
        for key, value in _config_of(policy, i).items():
            setup[f"policies[{i}] {type(policy).__qualname__}.{key}"] = value
    require_agreement(agreement, setup, "the policy runner's setup", requests)


def _config_of(policy: BasePolicy, index: int) -> Any:
    config = policy.config()
    try:
        json.dumps(config, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"policies[{index}] {type(policy).__name__}.config() must be JSON-able: {e}") from None
    return config


def _shown(value: Any) -> str:
    return "no change" if value is None else repr(value)
