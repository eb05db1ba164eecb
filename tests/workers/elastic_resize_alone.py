"""Worker for test_elastic.py: resize on a one-worker elastic job (max 3 workers), every form.

Checks what needs the config service but no second worker: errors after the
agreement (out of range, unknown peers) that change nothing, no-op resizes,
a growth request that waits in vain (target size set, timeout, then
cancelled), and the symbolic forms (tf.function, v1 graph). Prints
``checked N results``.
"""

from __future__ import annotations

import os

import _setup
from _setup import Checker, tf

from kungfu_tf import elastic
from kungfu_tf.ops import elastic_membership as em


def main() -> None:
    chk = Checker(0)
    me = os.environ["KUNGFU_SELF"]
    client = em.config_client()
    state = elastic.ElasticState([tf.Variable([1.0, 2.0])])
    state.sync()  # one worker: its own state; sets the job's signature
    chk.true(client.get_job_state().signature == "Variable:0 (2,) float32", "signature set by the first sync")
    chk.true(state.check() is None, "nothing to adopt")

    def refused(call, error, text):
        try:
            call()
        except error as e:
            chk.true(text in str(e), f"{text!r} in {e}")
        else:
            chk.fail(f"no {error.__name__} ({text})")
        chk.true(em.current()[0] == 1 and client.get_job_state().target_size == 1, "nothing changed")

    refused(lambda: elastic.resize(4), ValueError, "new_size=4 is outside the job's [min 1, max 3]")
    refused(lambda: elastic.resize(workers=[me, "127.0.0.1:1"]), ValueError, "workers ['127.0.0.1:1'] are not members")
    for call in (lambda: elastic.resize(1), lambda: elastic.resize(workers=[me]), lambda: elastic.resize()):
        changed, detached = call()
        chk.true((bool(changed), bool(detached)) == (False, False), "a resize to the same cluster changes nothing")

    changed, detached = elastic.resize(2)  # asynchronous: nobody joins here
    chk.true((bool(changed), bool(detached)) == (False, False), "growth is not immediate")
    chk.true(client.get_job_state().target_size == 2, "target size requested")
    refused_wait = False
    try:
        elastic.resize(2, wait=True, timeout=0.5)
    except TimeoutError as e:
        refused_wait = "did not reach 2 workers within 0.5 s" in str(e)
    chk.true(refused_wait, "wait=True times out clearly")
    elastic.resize(1)
    chk.true(client.get_job_state().target_size == 1, "resize to the current size cancels the growth")

    @tf.function
    def symbolic(n):
        return elastic.resize(n)

    changed, detached = symbolic(tf.constant(1))
    chk.true((bool(changed), bool(detached)) == (False, False), "tf.function resize")
    try:
        symbolic(tf.constant(0))
    except tf.errors.OpError as e:
        chk.true("new_size must be >= 1, got 0" in str(e), f"run-time size checked: {e}")
    else:
        chk.fail("resize(0) in a tf.function did not fail")

    graph = tf.Graph()
    with graph.as_default():
        ops = elastic.resize(1)
    with tf.compat.v1.Session(graph=graph, config=_setup.session_config()) as session:
        chk.true(tuple(bool(x) for x in session.run(ops)) == (False, False), "v1 graph resize")
    chk.done()


if __name__ == "__main__":
    main()
