"""The launcher's JobPlan never shows the job secret in reprs or logs."""

from __future__ import annotations

import logging

from kungfu_tf.run.plan.cli import parse_args
from kungfu_tf.run.plan.job_plan import build_plan

SECRET = "5ec7e7" + "0f" * 29


def test_secret_is_not_in_repr_str_or_logs(caplog):
    plan = build_plan(parse_args(["-np", "2", "prog"]), {"KUNGFU_JOB_SECRET": SECRET})
    assert plan.secret == SECRET  # the workers still get it
    assert plan.worker_env(plan.peers[0], {})["KUNGFU_JOB_SECRET"] == SECRET
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("kungfu_tf.test").info("plan %s / %r / %s", plan, plan, [plan])
        logging.getLogger("kungfu_tf.test").info(f"{plan} {plan!r}")
    shown = [repr(plan), str(plan), f"{plan}", caplog.text]
    assert all("peers=" in text for text in shown)  # the rest of the plan is shown
    assert not [text for text in shown if SECRET in text]
