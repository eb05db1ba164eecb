"""Benchmarks: one sub-package per experiment, one shared harness.

Each experiment runs as ``python -m benchmarks.<experiment>`` from the
repository root (its driver is ``benchmarks/<experiment>/run.py``; the
workers it starts sit beside it and are started by path with this checkout
on ``PYTHONPATH``). ``benchmarks.harness`` holds what several experiments
share: launching process groups, timing, units, CLI parsing, machine
metadata, the two-host network setup and the digits data and model.
Results are written to ``benchmarks/results/``, which the docs site reads.
"""
