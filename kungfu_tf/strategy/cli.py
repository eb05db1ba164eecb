"""``kungfu-strategy``: explain a strategy file, or build one for a model and a cluster.

    kungfu-strategy explain ps.pbtxt                              # the file alone
    kungfu-strategy explain ps.pbtxt --model digits-mlp --np 4    # checked against a model and job
    kungfu-strategy explain ps.pbtxt --model ncf --np 4 --hosts 2 --cross-host-gbps 1   # + cost model breakdown
    kungfu-strategy build --builder NAME --model digits-mlp --np 4 --hosts 2 -o ps.pbtxt
    kungfu-strategy search --model ncf --np 4 --budget 8 -o best.pbtxt --log search.jsonl

Models are the ones of ``models/registry.py`` (``--models-dir``). Problems
(a malformed file, a strategy that does not fit the model, an unknown model or
builder) print one line ``kungfu-strategy: error: ...`` and exit with status 2.

Example:
    >>> from kungfu_tf.strategy.cli import main
    >>> main(["explain", "/nonexistent.pbtxt"])
    2
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kungfu_tf.strategy.errors import StrategyError

if TYPE_CHECKING:
    from kungfu_tf.proto import strategy_pb2
    from kungfu_tf.strategy.variable_info import VariableInfo

PROG = "kungfu-strategy"
# The repository's example models: an installed package carries a copy of
# models/ inside itself (setup.py's build_py puts it there); a source checkout
# (or an editable install) has models/ next to the package.
INSTALLED_MODELS_DIR = Path(__file__).resolve().parents[1] / "example_models"
CHECKOUT_MODELS_DIR = Path(__file__).resolve().parents[2] / "models"
DEFAULT_MODELS_DIR = INSTALLED_MODELS_DIR if INSTALLED_MODELS_DIR.is_dir() else CHECKOUT_MODELS_DIR


class CliError(Exception):
    """A problem with the command line's arguments, reported like a StrategyError."""


def _model_variables(name: str, models_dir: Path) -> list[VariableInfo]:
    """The trainable variables of model ``name`` of ``models_dir/registry.py``."""
    if not (models_dir / "registry.py").is_file():
        raise CliError(f"no model registry in {models_dir} (expected {models_dir / 'registry.py'}); see --models-dir")
    # Only models need TensorFlow; keep its start-up chatter off the terminal.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # The registry imports its sibling modules by bare name (see models/train.py).
    if str(models_dir) not in sys.path:
        sys.path.insert(0, str(models_dir))
    import registry

    from kungfu_tf.strategy.variable_info import describe_model

    if name not in registry.MODELS:
        raise CliError(f"unknown model {name!r}; choose one of: {', '.join(sorted(registry.MODELS))}")
    import keras

    # Unnamed Keras layers are numbered per process ("dense", "dense_1", ...);
    # a fresh session gives the names a worker gets when it builds the model
    # first thing, which are the names the strategy must use.
    keras.backend.clear_session()
    return describe_model(registry.MODELS[name].build())


def _explain(args: argparse.Namespace) -> None:
    from kungfu_tf.strategy import format as strategy_format
    from kungfu_tf.strategy.explain import explain

    strategy = strategy_format.load(args.file)
    variables = _model_variables(args.model, args.models_dir) if args.model else None
    try:
        text = explain(strategy, variables, replicas=args.np)
        if _wants_costs(args):
            text += "\n\n" + _costs(args, strategy, variables)
    except StrategyError as e:
        raise StrategyError(f"{args.file}: {e}") from None
    print(text)


def _wants_costs(args: argparse.Namespace) -> bool:
    given = [args.costs, args.hosts is not None, args.rates is not None] + [
        getattr(args, name) is not None for name in _COST_OPTIONS
    ]
    return any(given)


def _costs(args: argparse.Namespace, strategy: strategy_pb2.Strategy, variables: list[VariableInfo] | None) -> str:
    """The cost model's breakdown of ``strategy`` with uniform rates from the options, or a rates file."""
    from kungfu_tf.strategy.auto.cost_model import CostModel
    from kungfu_tf.strategy.auto.cost_report import format_costs
    from kungfu_tf.strategy.auto.link_rates import LinkRates
    from kungfu_tf.strategy.cluster_spec import ClusterSpec

    if variables is None or args.np is None:
        raise CliError("the cost breakdown needs --model and --np")
    if args.rates is not None:
        try:
            rates = LinkRates.from_json(args.rates.read_text(), origin="file")
        except OSError as e:
            raise CliError(f"cannot read link rates file {args.rates}: {e.strerror or e}") from None
        cluster = ClusterSpec(args.np, rates.hosts if rates.replicas == args.np else None)
        if args.hosts is not None and args.hosts != len(set(rates.hosts)):
            raise CliError(f"--hosts {args.hosts} but {args.rates} was measured on {rates.signature}")
    else:
        try:
            cluster = ClusterSpec.uniform(args.np, args.hosts or 1)
        except ValueError as e:
            raise CliError(str(e)) from None
        within = (args.link_gbps or DEFAULT_LINK_GBPS) * 1e9 / 8
        cross = args.cross_host_gbps * 1e9 / 8 if args.cross_host_gbps else None
        latency = (args.latency_us if args.latency_us is not None else DEFAULT_LATENCY_US) * 1e-6
        rates = LinkRates.uniform(args.np, within, latency, cluster.hosts, cross_host_bandwidth=cross)
    model = CostModel(rows_per_step=args.rows_per_step or 256, cores_per_host=args.cores_per_host)
    costs = model.predict(strategy, variables, cluster, rates, compute_time=(args.compute_ms or 0.0) / 1e3)
    return format_costs(costs, rates)


# Offline defaults of the cost breakdown: a fast local link (shared memory or loopback) and its latency.
DEFAULT_LINK_GBPS = 16.0
DEFAULT_LATENCY_US = 50.0
_COST_OPTIONS = ("link_gbps", "cross_host_gbps", "latency_us", "rows_per_step", "compute_ms", "cores_per_host")


def _build(args: argparse.Namespace) -> None:
    from kungfu_tf.strategy import format as strategy_format
    from kungfu_tf.strategy.cluster_spec import ClusterSpec
    from kungfu_tf.strategy.validation import validate

    try:
        cluster = ClusterSpec.uniform(args.np, args.hosts, args.bandwidth_gbps)
    except ValueError as e:
        raise CliError(str(e)) from None
    # Imported here, not at the top: the builders are optional for the other
    # commands, and some of them pull in TensorFlow.
    try:
        from kungfu_tf.strategy import builders
    except ModuleNotFoundError as e:
        if e.name not in ("kungfu_tf.strategy.builders", "kungfu_tf.strategy"):
            raise
        raise CliError("no strategy builders are installed (kungfu_tf.strategy.builders is missing)") from None
    known = getattr(builders, "BUILDERS", {})
    if args.builder not in known:
        raise CliError(f"unknown builder {args.builder!r}; choose one of: {', '.join(sorted(known)) or '(none)'}")
    variables = _model_variables(args.model, args.models_dir)
    strategy = builders.build(args.builder, variables, cluster)
    try:
        validate(strategy, variables, args.np)
    except StrategyError as e:
        raise StrategyError(f"builder {args.builder!r} produced an invalid strategy: {e}") from None
    if args.output is None:
        sys.stdout.write(strategy_format.dumps(strategy, args.format or "text"))
        return
    strategy_format.save(strategy, args.output, args.format)
    print(f"wrote {args.output}: {len(strategy.node_config)} nodes for {args.np} replicas (builder {args.builder})")


def _search(args: argparse.Namespace) -> int:
    """Runs the search in a ``kungfu-run -np N`` job on this machine; returns the job's exit status."""
    import subprocess

    from kungfu_tf.strategy.auto.search import check_searchable, check_workers

    check_workers(args.np)  # before the model is built: that takes seconds
    if args.hosts > args.np:
        raise CliError(f"cannot spread {args.np} replicas over {args.hosts} hosts")
    if args.warmup < 0:
        raise CliError(f"--warmup must be >= 0 steps, got {args.warmup}")
    if args.confirm_top < 0 or args.confirm_top == 1:
        raise CliError(f"--confirm-top must be 0 (none) or >= 2 (the fastest compared once more), got {args.confirm_top}")
    script = args.models_dir / "search_strategy.py"
    if not script.is_file():
        raise CliError(f"no search worker in {args.models_dir} (expected {script}); see --models-dir")
    # Checked here, before any worker starts: the same precise errors the workers would raise.
    check_searchable(_model_variables(args.model, args.models_dir), args.np)
    output = args.output.resolve()
    worker = [
        sys.executable, str(script), "--model", args.model, "--budget", str(args.budget),
        "--trial-steps", str(args.trial_steps), "--warmup", str(args.warmup),
        "--confirm-top", str(args.confirm_top), "--batch-size", str(args.batch_size), "--seed", str(args.seed), "--hosts", str(args.hosts),
        "--output", str(output),
    ]  # fmt: skip
    if args.seconds is not None:
        worker += ["--seconds", str(args.seconds)]
    if args.bandwidth_gbps is not None:
        worker += ["--bandwidth-gbps", str(args.bandwidth_gbps)]
    if args.log is not None:
        worker += ["--log", str(args.log.resolve())]
    if output.exists():
        output.unlink()  # a file left by an earlier search must not pass for this one's
    job = [sys.executable, "-m", "kungfu_tf.run", "-np", str(args.np), *worker]
    status = subprocess.run(job, stdin=subprocess.DEVNULL, check=False).returncode
    if status != 0:
        raise CliError(f"the search job (kungfu-run -np {args.np}) failed with exit status {status}; see its output above")
    if not output.is_file():
        raise CliError(f"the search job ended without writing {output}")
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kungfu-strategy``.

    Example:
        >>> make_parser().parse_args(["explain", "s.pbtxt", "--np", "4"]).np
        4
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Explain or build kungfu_tf synchronisation strategies.",
        epilog=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add_models_dir(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--models-dir",
            type=Path,
            default=DEFAULT_MODELS_DIR,
            help="directory holding registry.py (default: %(default)s)",
        )

    explain = commands.add_parser("explain", help="print a strategy per variable, with load totals")
    explain.add_argument("file", type=Path, help="strategy file (protobuf text format or JSON)")
    explain.add_argument("--model", help="check against this model of the registry and show shapes and bytes")
    explain.add_argument("--np", type=_positive_int, help="number of replicas of the job to check against")
    costs = explain.add_argument_group(
        "cost model breakdown (any of these options asks for it; needs --model and --np)"
    )
    costs.add_argument("--costs", action="store_true", help="show the cost model's predicted time per variable")
    costs.add_argument("--hosts", type=_positive_int, help="hosts the ranks are spread over, in blocks (default 1)")
    costs.add_argument("--link-gbps", type=_positive_float, help=f"Gbit/s within a host (default {DEFAULT_LINK_GBPS:g})")
    costs.add_argument("--cross-host-gbps", type=_positive_float, help="Gbit/s between hosts (default: --link-gbps)")
    costs.add_argument("--latency-us", type=_positive_float, help=f"per-message latency (default {DEFAULT_LATENCY_US:g})")
    costs.add_argument("--rates", type=Path, help="measured link rates (JSON, e.g. a calibration cache file)")
    costs.add_argument("--rows-per-step", type=_positive_int, help="embedding rows a worker touches per step (256)")
    costs.add_argument("--compute-ms", type=_positive_float, help="compute time per step, added to the prediction")
    costs.add_argument("--cores-per-host", type=_positive_int, help="cores a host's ranks share (default: one per rank)")
    add_models_dir(explain)
    explain.set_defaults(run=_explain)

    build = commands.add_parser("build", help="write the strategy a builder makes for a model and cluster")
    build.add_argument("--builder", required=True, help="builder name (kungfu_tf.strategy.builders.BUILDERS)")
    build.add_argument("--model", required=True, help="model name in the registry")
    build.add_argument("--np", type=_positive_int, required=True, help="number of replicas")
    build.add_argument("--hosts", type=_positive_int, default=1, help="hosts the ranks are spread over, in blocks")
    build.add_argument("--bandwidth-gbps", type=_positive_float, help="inter-host bandwidth in Gbit/s")
    build.add_argument("-o", "--output", type=Path, help="output file (default: standard output)")
    build.add_argument(
        "--format", choices=("text", "json"), help="output format (default: from the file suffix, else text)"
    )
    add_models_dir(build)
    build.set_defaults(run=_build)

    search = commands.add_parser(
        "search",
        help="search for a model's fastest strategy with trial runs on this machine (builders.Auto)",
        description=(
            "Starts kungfu-run -np NP on this machine (loopback); its workers train MODEL on synthetic data "
            "while builders.Auto samples candidates, scores them with the cost model and measures the most "
            "promising in real trial steps. Rank 0 prints one line per trial and writes the fastest strategy "
            "measured to -o, for kungfu-strategy explain and SynchronousSGDOptimizer(strategy=FILE)."
        ),
    )
    search.add_argument("--model", required=True, help="model name in the registry")
    search.add_argument("--np", type=_positive_int, required=True, help="workers (at least 2)")
    search.add_argument("--budget", type=_positive_int, default=8, help="trials (default %(default)s)")
    search.add_argument("--seconds", type=_positive_float, help="also stop after this many seconds of trials")
    search.add_argument(
        "--hosts",
        type=_positive_int,
        default=1,
        help=(
            "rank candidates for this many hosts (ranks in blocks) at --bandwidth-gbps between them, as "
            "declared rates. The trials still run here, on one host: their measurements, and the ranker "
            "trained on them, are this machine's. For a real multi-host search use builders.Auto in a job "
            "launched on those hosts."
        ),
    )
    search.add_argument("--bandwidth-gbps", type=_positive_float, help="declared inter-host bandwidth in Gbit/s")
    search.add_argument("--trial-steps", type=_positive_int, default=5, help="timed steps per trial")
    search.add_argument("--warmup", type=int, default=2, help="untimed steps per trial before the timed ones")
    search.add_argument(
        "--confirm-top", type=int, default=2,
        help="after the budget, this many of the fastest strategies run one more trial each; the lowest mean wins",
    )  # fmt: skip
    search.add_argument("--batch-size", type=_positive_int, default=32, help="per-worker batch size")
    search.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    search.add_argument("-o", "--output", type=Path, required=True, help="best strategy file (.json: JSON)")
    search.add_argument("--log", type=Path, help="search log: one JSON line per trial (predicted, measured)")
    add_models_dir(search)
    search.set_defaults(run=_search)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``kungfu-strategy``; returns the exit status (0, or 2 after an error).

    Example:
        >>> main(["explain", "--help"])  # doctest: +SKIP
    """
    args = make_parser().parse_args(argv)
    try:
        status = args.run(args)
    except (StrategyError, CliError) as e:
        # One line, no traceback: these are the user's mistakes, not ours.
        message = " ".join(str(e).split("\n"))
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
