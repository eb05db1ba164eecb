"""Errors of elastic training, each naming its cause."""

from __future__ import annotations


class ElasticError(RuntimeError):
    """Elastic training cannot go on (the cluster fell below --min-np, nothing was committed in time, ...)."""


class StateMismatchError(ElasticError):
    """After a state sync the workers do not hold identical state (or models of different shapes)."""


class JoinerRejectedError(ElasticError):
    """The config service refused this joiner (its model differs from the job's)."""


class JobEndedError(ElasticError):
    """Members of this worker's cluster finished training (the job is ending) while this worker's step failed.

    ``kungfu_tf.elastic.run`` catches it and returns None: a finished member's
    goodbye is not a crash, and no new version will be committed without it.
    """
