"""Errors of the policy runner, raised on every worker alike."""

from __future__ import annotations


class PolicyDisagreementError(RuntimeError):
    """Workers asked for different values of a shared setting (or run different policies).

    Nothing was changed on any worker. The message names the setting and
    what each rank asked for.

    Example:
        >>> raise PolicyDisagreementError("workers differ on batch_size: rank 0 asked 64, rank 1 asked 128")
        Traceback (most recent call last):
        ...
        kungfu_tf.policy.errors.PolicyDisagreementError: workers differ on batch_size: rank 0 asked 64, rank 1 asked 128
    """


class PeerPolicyError(RuntimeError):
    """A policy (or a request it made) failed on another worker.

    The worker where it failed raises the original exception; every other
    worker raises this one, naming the rank, the hook and the original
    message, instead of waiting for that worker until the timeout.
    """
