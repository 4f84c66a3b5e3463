"""The `raystream` command. Positional arguments are Hydra overrides; flags belong to the subcommand.

    raystream train  [overrides] [--cfg job]
    raystream sweep  [overrides] [--cfg job] [--verbose]
    raystream report (--experiment NAME | --parent RUN_ID) [--out DIR]
    raystream data inspect [overrides] [--batches N] [--start-step S] [--world-size W]
    raystream data make-demo [overrides]
    raystream data correlation [overrides] [--checkpoint PATH] [--steps N]

Every subcommand composes and checks the config first, so a bad key fails before Ray starts; `train` and `sweep`
also check the MLflow tracking store and the evaluation data before Ray starts. Exit 2: bad config, data or
tracking store (nothing ran).
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from omegaconf import OmegaConf

from raystream.config import ConfigError, compose
from raystream.tracking.store import TrackingStoreError


def _at_least(low: int):
    """argparse type: an integer >= `low` (argparse exits 2 naming the flag otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raystream", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    for name, help_ in (("train", "one Ray Train run"), ("sweep", "a Ray Tune sweep (default: sweep=smoke)")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. optimizer=adamw stream.batch_size=4")
        s.add_argument("--cfg", choices=["job"], help="print the composed config and exit")
    sub.choices["sweep"].add_argument("--verbose", action="store_true",
                                      help="Ray's and Tune's output on the terminal (else in the sweep's log file)")

    r = sub.add_parser("report", help="paper-style table and plots from MLflow")
    g = r.add_mutually_exclusive_group(required=True)
    g.add_argument("--experiment", help="MLflow experiment name (its latest sweep parent run)")
    g.add_argument("--parent", help="MLflow run id of a sweep's parent run")
    r.add_argument("--out", default=None, help="directory for report.md, report.csv and plots")

    d = sub.add_parser("data", help="demo videos and stream inspection")
    dsub = d.add_subparsers(dest="data_command", required=True)
    i = dsub.add_parser("inspect", help="print one JSON object per global batch (or per step and rank)")
    i.add_argument("overrides", nargs="*")
    i.add_argument("--batches", type=_at_least(1), default=3)
    i.add_argument("--start-step", type=_at_least(0), default=0)
    i.add_argument("--world-size", type=_at_least(1), default=None)
    m = dsub.add_parser("make-demo", help="write the bundled demo videos (cached)")
    m.add_argument("overrides", nargs="*")
    # correlation: consecutive batches' gradient cosine, configured order vs shuffled (raystream/train/correlation.py)
    c = dsub.add_parser("correlation", help="one JSON line: mean cosine of consecutive batches' gradients at fixed "
                                             "weights, configured order vs shuffled (the paper's Figure 1)")
    c.add_argument("overrides", nargs="*")
    c.add_argument("--checkpoint", default=None, help="model state dict, checkpoint or run directory (default: the "
                                                      "scenario's initial weights)")
    c.add_argument("--steps", type=int, default=8, help="pairs of consecutive batches per order (default 8)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from raystream.train.ray_start import loopback_only

    loopback_only()  # before anything imports Ray: a local cluster advertises 127.0.0.1 only
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (ConfigError, TrackingStoreError) as exc:
        print(f"raystream: {exc}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "report":
        from raystream.tracking.report import main as report_main

        return report_main(experiment=args.experiment, parent=args.parent, out=args.out)

    cfg = compose(args.overrides)
    if getattr(args, "cfg", None) == "job":
        print(OmegaConf.to_yaml(cfg))
        return 0
    if args.command == "train":
        from raystream.tracking.store import prepare_store, tracking_uri
        from raystream.train.preflight import check_evaluation_data
        from raystream.train.run import main as train_main

        prepare_store(tracking_uri(cfg))  # reachable, writable and created before Ray starts
        check_evaluation_data(cfg)
        return train_main(cfg, overrides=args.overrides)
    if args.command == "sweep":  # run_sweep checks the tracking store and every cell before Ray starts
        from raystream.tune.sweep import main as sweep_main

        return sweep_main(cfg, overrides=args.overrides, verbose=args.verbose)
    if args.data_command == "inspect":
        from raystream.data.inspect import main as inspect_main

        return inspect_main(cfg, batches=args.batches, start_step=args.start_step, world_size=args.world_size)
    if args.data_command == "correlation":
        from raystream.train.correlation import main as correlation_main

        return correlation_main(cfg, steps=args.steps, checkpoint=args.checkpoint)
    from raystream.data.demo import main as demo_main

    return demo_main(cfg)


if __name__ == "__main__":
    sys.exit(main())
