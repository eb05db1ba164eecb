"""The strategy source in force as a JSON-able record: what a joiner is told it must run.

A worker that joins an elastic job runs the script from its start, so its
optimizer holds the strategy source the script started with. The members
may run another one by then (``switch_strategy``, a ``StrategyPolicy``),
and a builder is re-run for every new cluster: the joiner must re-run the
members' builder, with the members' settings, or the consensus on the
strategy bytes fails at its admission. The members' first worker sends this
record (kungfu_tf/optimizers/strategy_resize.py); the joiner makes the source
again from it:

* ``{"builder": NAME, "options": {...}}``: a builder, ``NAME`` a registered
  builder's name or ``module:qualname`` of the user's class (the joiner
  imports it: its script defines it as the members' does), ``options`` its
  :meth:`~kungfu_tf.strategy.builders.base.StrategyBuilder.config`;
* ``{"written": true}``: a strategy written once (a proto or a file): the
  members re-map the one they run for the new cluster and send it;
* ``{"auto": {"settings": ..., "results": [...]}}``: ``builders.Auto``,
  which cannot be made again from settings (its results come from trials):
  the joiner keeps its own ``Auto``, checks that its settings are the
  members' (``Auto.search_settings``: it searches again where they do) and
  adopts their search results (``Auto.result_record``, one per cluster
  searched; empty before a search ended), so that it builds what they build;
* ``{"opaque": WHY}``: a builder that cannot be described: every worker
  re-runs its own source, as before the record existed.

Example:
    >>> from kungfu_tf.strategy import builders
    >>> record = source_record(builders.PartitionedPS(min_partition_bytes=64))
    >>> record
    {'builder': 'PartitionedPS', 'options': {'min_partition_bytes': 64, 'sync': True, 'staleness': 0}}
    >>> source_from_record(record).min_partition_bytes
    64
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.builders import BUILDERS
from kungfu_tf.strategy.builders.base import StrategyBuilder
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.source import StrategySource

SourceRecord = dict[str, Any]


def _class_name(builder: StrategyBuilder) -> str:
    cls = type(builder)
    if BUILDERS.get(builder.name) is cls:
        return builder.name
    if "<locals>" in cls.__qualname__:
        raise StrategyError(f"builder class {cls.__qualname__} is defined inside a function: a joiner cannot import it")
    return f"{cls.__module__}:{cls.__qualname__}"


def source_record(source: StrategySource) -> SourceRecord:
    """The record of ``source`` (module docstring); never raises: what cannot be described is ``opaque``."""
    if isinstance(source, str) and source in BUILDERS:
        return {"builder": source, "options": {}}
    # Imported here: kungfu_tf.strategy.auto imports the builders, as this module does.
    from kungfu_tf.strategy.auto.builder import Auto

    if isinstance(source, Auto):
        return {"auto": {"settings": source.search_settings(), "results": source.result_record()}}
    if isinstance(source, StrategyBuilder):
        try:
            return {"builder": _class_name(source), "options": source.config()}
        except StrategyError as e:
            return {"opaque": str(e)}
    if isinstance(source, (strategy_pb2.Strategy, str, os.PathLike)):
        return {"written": True}
    return {"opaque": f"a strategy source of type {type(source).__name__}"}


def source_from_record(record: SourceRecord) -> StrategyBuilder:
    """The builder a ``{"builder": ...}`` record describes, made again.

    Raises:
        StrategyError: the record names no builder, a class that cannot be
            imported here or is no ``StrategyBuilder``, or options its
            constructor refuses; the message names the class and the cause.
    """
    name = record.get("builder")
    if not isinstance(name, str):
        raise StrategyError(f"the strategy record {record!r} names no builder")
    options = record.get("options", {})
    if name in BUILDERS:
        cls: Any = BUILDERS[name]
    else:
        module, _, qualname = name.partition(":")
        try:
            cls = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
        except (ImportError, AttributeError) as e:
            raise StrategyError(f"the members' strategy builder {name} cannot be imported here: {e}") from None
        if not (isinstance(cls, type) and issubclass(cls, StrategyBuilder)):
            raise StrategyError(f"the members' strategy builder {name} is not a StrategyBuilder here")
    try:
        return cls(**options)
    except (TypeError, ValueError) as e:
        raise StrategyError(f"the members' strategy builder {name} refused its options {options!r}: {e}") from None
