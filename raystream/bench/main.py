"""`raystream bench`: the phases in order, each drawing on one time budget, then the table and the JSON object.

    1. build the worker's model and optimizer (raystream/bench/trainee.py); the stream correlation a run measures
       before step 0 (1 pair per order: its memory does not grow with more), its peak memory (memory.py)
    2. checks (checks.py): DeviceStream vs the host path, a bf16 step, compiled vs stock step; a failure stops here
    3. `steps` steps from batches held in device memory; then, with the model's ViT blocks compiled the other way
       (`trainer.compile`: eager if configured compiled, else compiled where compiling is allowed), the same steps
       again: compiled against eager steps/s and peak memory (model_compile)
    4. `steps` steps from the live stream with the configured data.decode_workers, then one checkpoint save (as
       rank 0 writes it, into a temporary directory); the training peak memory over both
    4b. the parts of a trial that are not its steps (trial_parts.py: a fresh worker process's imports, the build, the
       correlation, one evaluation, the checkpoint save), which `raystream plan --rate-from` adds to a trial's time
    5. the optimizer step alone: configured, stock / compiled, AdamW foreach and fused
    6. the decode-worker sweep (1, 2, 4, ... up to the cores) while the budget lasts

Compiling (Orthogonal-AdamW's compiled step, for the check and the timing, and the model's compiled blocks) is
allowed with `--compile on`, or with `auto` when the budget is at least COMPILE_BUDGET_S for the device (a first
compilation of a ViT's step took about a minute on a 2-core CPU); otherwise it is skipped and the output says so.
Model FLOPs per step are counted before anything runs (flops.py, on the meta device) and every steps/s figure comes
with its achieved TFLOP/s and, where the device's bf16 peak is known or `--peak-tflops` names it, its MFU.
Exit 0; 2 when the input is bad (no CUDA device, bad data or checkpoint, a `--json` path that cannot be written, a
`--peak-tflops` not > 0: checked first); 3 when a check failed.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import gc
import sys
import time
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from omegaconf import OmegaConf

from raystream.bench import checks, flops, memory, report, throughput, trial_parts
from raystream.bench.optimizer_timing import compile_applies, label, time_optimizers
from raystream.bench.trainee import Budget, CheckFailed, Trainee, device_name, resolve_device
from raystream.data import DataError
from raystream.data.decode.workers import available_cores, default_decode_workers
from raystream.models.vit import blocks_of, compile_blocks, compile_wanted
from raystream.optim.factory import compile_choice

RUN_STEPS = 10 ** 6  # the run bench's trainee stands for: a long one (its schedules; what compile=auto weighs)
WARMUP = 3  # untimed steps before each timing (the compiled optimizer step compiles in the second)
COMPILE_BUDGET_S = {"cpu": 600.0, "cuda": 240.0}  # --compile auto compiles when the time budget is at least this


def compile_decision(mode: str, opt_cfg, device: torch.device, budget: Budget) -> Tuple[bool, str]:
    """(whether Orthogonal-AdamW's compiled step is built for the check and the timing, why not)."""
    if not compile_applies(opt_cfg):
        return False, (f"not applicable to optimizer.name={opt_cfg.name}, projection={opt_cfg.projection} (the "
                       "compiled step is orthogonal_adamw's, global or per_tensor projection)")
    if opt_cfg.compile is True:
        return True, ""
    why = compile_not_allowed(mode, device, budget)
    return why is None, why or ""


def compile_not_allowed(mode: str, device: torch.device, budget: Budget) -> Optional[str]:
    """Why `--compile MODE` allows no torch.compile in this run (None: it does)."""
    if mode == "off":
        return "--compile off"
    need = COMPILE_BUDGET_S[device.type]
    if mode == "auto" and budget.seconds < need:
        return (f"time budget {budget.seconds:.0f} s < {need:.0f} s allowed for torch.compile on {device.type} "
                "(--compile on forces it)")
    return None


def resolve_auto_compile(cfg, trainee: Trainee) -> Tuple[Any, Optional[str]]:
    """`cfg` with `optimizer.compile: auto` replaced by the step the trainee's optimizer was built with (so the
    configured row times the default path, not a third variant), and which it is and why (None without auto)."""
    if cfg.optimizer.compile != "auto" or not compile_applies(cfg.optimizer):
        return cfg, None
    compiled, why = compile_choice(trainee.groups, cfg.optimizer, RUN_STEPS)
    return OmegaConf.merge(cfg, {"optimizer": {"compile": compiled}}), f"{'compiled' if compiled else 'eager'}: {why}"


def _setting(cfg, trainee: Trainee, device: torch.device, overrides: Sequence[str]) -> Dict[str, Any]:
    return {
        "device": device.type, "device_name": device_name(device), "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "overrides": list(overrides), "scenario": str(cfg.scenario.name),
        "backbone": str(cfg.scenario.backbone.preset), "optimizer": label(cfg.optimizer),
        "batch_size": trainee.batch_size, "global_batch_size": int(cfg.stream.batch_size),
        "num_workers": int(cfg.trainer.num_workers), "frames_per_clip": int(cfg.stream.frames_per_clip),
        "resolution": int(cfg.stream.resolution), "bf16": isinstance(trainee.autocast(), torch.autocast),
        "torch_threads": torch.get_num_threads(),
    }


def run(cfg, *, device: Optional[str] = None, steps: int = 20, time_budget: float = 480.0, compile: str = "auto",
        overrides: Sequence[str] = (), peak_tflops: Optional[float] = None,
        model_compile: Optional[str] = None) -> Dict[str, Any]:
    """Measure; the result dict (report.py lists its keys). `compile`: the `--compile` mode; `model_compile`: the
    mode for the model's compiled blocks when it differs (the GPU campaign compiles the model, not the optimizer).
    Raises BenchError, DataError, CheckFailed (and ValueError for a `peak_tflops` that is not > 0)."""
    budget = Budget(time_budget)
    dev = resolve_device(device)
    peak_tf, peak_source = flops.peak_tflops(dev, peak_tflops)
    meter = memory.PeakMemory(dev, memory.rss())
    began = budget.elapsed()
    trainee = Trainee.build(cfg, dev, total_steps=RUN_STEPS)
    build_s = budget.elapsed() - began
    step_flops = flops.step_flops(cfg, trainee.batch_size)
    phases = Phases(budget)
    cfg, auto = resolve_auto_compile(cfg, trainee)
    result = _setting(cfg, trainee, dev, overrides)
    result["optimizer_compile_auto"] = auto
    result.update(steps=steps, warmup=WARMUP, time_budget_s=float(time_budget), model_flops_per_step=step_flops,
                  peak_tflops=peak_tf, peak_source=peak_source)
    result["phase_s"] = phases.seconds
    phases.done("start")
    result.update(correlation_phase(trainee, meter))
    phases.done("correlation")
    allowed, why_not = compile_decision(compile, cfg.optimizer, dev, budget)
    with _failed_check_keeps(result):
        result["checks"] = checks.run_checks(trainee)
    phases.done("checks")
    held_peak, held = memory.measured(meter, lambda: throughput.from_memory(trainee, WARMUP, steps, budget))
    phases.done("from_memory")
    figures = functools.partial(flops.figures, step_flops, peak=peak_tf)  # a steps/s rate's TFLOP/s and MFU
    result["model_compile"] = model_compile_phase(trainee, meter, (held, held_peak), model_compile or compile,
                                                  steps, budget, figures)
    phases.done("model_compile")
    configured = int(cfg.data.decode_workers or default_decode_workers())
    live, checkpoint_s = _live_phase(result, trainee, meter, held, configured, steps, budget, figures)
    phases.done("live_and_checkpoint")
    pairs = int(cfg.trainer.correlation_steps)  # 0: a run measures no correlation
    result.update(trial_parts.parts(trainee, build_s, phases.seconds["correlation"] if pairs else 0.0,
                                    checkpoint_s, budget.left()))
    phases.done("trial_parts")
    gc.collect()
    result.update(optimizer_phase(trainee, cfg.optimizer, steps, budget, (allowed, why_not)))
    phases.done("optimizer")
    result.update(decode_workers_phase(trainee, held, steps, budget, {configured: live}))
    phases.done("decode_workers")
    with _failed_check_keeps(result):  # last: compiling the step can take minutes on a GPU (99 s for ViT-S, H200)
        result["checks"]["compiled_step"] = checks.compiled_check(trainee, (allowed, why_not))
    phases.done("compiled_check")
    result["elapsed_s"] = budget.elapsed()
    return result


def _live_phase(result: Dict[str, Any], trainee: Trainee, meter: memory.PeakMemory, held: throughput.Rate,
                configured: int, steps: int, budget: Budget, figures) -> Tuple[throughput.Rate, float]:
    """Live steps with the configured decode workers and one checkpoint save (`training_phase`): their figures
    beside the from-memory ones into `result`; (the live Rate, the save's seconds). `figures(steps_per_s)`: a
    rate's FLOP figures."""
    peak, (live, (checkpoint_bytes, checkpoint_s)) = training_phase(trainee, meter, steps, budget)
    result.update(from_memory_steps_per_s=held.steps_per_s, from_memory_clips_per_s=held.clips_per_s,
                  live_steps_per_s=live.steps_per_s, live_clips_per_s=live.clips_per_s,
                  live_over_memory=live.steps_per_s / held.steps_per_s, live_decode_workers=configured,
                  from_memory_timed_steps=held.steps, live_timed_steps=live.steps, checkpoint_bytes=checkpoint_bytes,
                  peak_memory_how=meter.how, **peak.figures(""), **_prefixed("from_memory_", figures(held.steps_per_s)),
                  **_prefixed("live_", figures(live.steps_per_s)))
    return live, checkpoint_s


def optimizer_phase(trainee: Trainee, opt_cfg, steps: int, budget: Budget,
                    compile_allowed: Tuple[bool, str]) -> Dict[str, Any]:
    """The optimizer step alone (optimizer_timing.py): ms per variant, those skipped and why (the compiled step
    when compiling is not allowed: `compile_allowed` = (allowed, why not)), how the compiled ones ran."""
    allowed, why_not = compile_allowed
    ms, skipped, ran = time_optimizers(trainee.groups, opt_cfg, WARMUP, steps, budget, with_compiled=allowed)
    if compile_applies(opt_cfg) and not allowed:
        skipped[label(OmegaConf.merge(opt_cfg, {"compile": True}))] = why_not
    return dict(optimizer_step_ms=ms, optimizer_configured=label(opt_cfg), optimizer_step_skipped=skipped,
                optimizer_compiled=ran)


def decode_workers_phase(trainee: Trainee, held: throughput.Rate, steps: int, budget: Budget,
                         measured: Dict[int, throughput.Rate]) -> Dict[str, Any]:
    """The decode-worker sweep (1, 2, 4, ... up to the cores, `measured` counts not taken again) while the budget
    lasts: the workers the stream needs to keep up with the steps from memory."""
    sweep = throughput.sweep_decode_workers(trainee, held, throughput.worker_counts(available_cores()), WARMUP, steps,
                                            budget, measured)
    return dict(decode_workers=sweep.needed, decode_bound=sweep.decode_bound,
                decode_workers_sweep={str(w): {"steps_per_s": r.steps_per_s,
                                               "over_memory": r.steps_per_s / held.steps_per_s}
                                      for w, r in sweep.rates.items()},
                decode_workers_not_measured=sweep.not_measured, decode_verdict=sweep.verdict(held))


def _prefixed(prefix: str, figures: Dict[str, Any]) -> Dict[str, Any]:
    return {prefix + k: v for k, v in figures.items()}


def model_compile_phase(trainee: Trainee, meter: memory.PeakMemory, configured: Tuple[throughput.Rate, memory.Phase],
                        mode: str, steps: int, budget: Budget, mfu) -> Dict[str, Any]:
    """Steps from memory with the model's blocks compiled (`trainer.compile`, models/vit.py `compile_blocks`) and
    eager: the `configured` measurement (rate, peak memory) and the other one, taken now with the blocks switched
    and put back after. Compiling for it is allowed as for the optimizer (`--compile`, COMPILE_BUDGET_S); eager
    needs no permission. `mfu(steps_per_s)`: the rate's FLOP figures."""
    compiled = compile_wanted(trainee.cfg.trainer.compile, trainee.device)
    this, other = ("compiled", "eager") if compiled else ("eager", "compiled")
    rate, phase = configured
    out: Dict[str, Any] = {"configured": this, "trainer_compile": trainee.cfg.trainer.compile,
                           "blocks": len(blocks_of(trainee.model))}
    out[this] = _compile_figures(rate, phase, mfu)
    why = compile_not_allowed(mode, trainee.device, budget) if not compiled else None
    if why is None and budget.left() <= 0:
        why = "time budget spent"
    if why is not None:
        out[other] = {"skipped": why}
        return out
    compile_blocks(trainee.model, not compiled)
    try:
        phase, rate = memory.measured(meter, lambda: throughput.from_memory(trainee, WARMUP, steps, budget))
    finally:
        compile_blocks(trainee.model, compiled)
    out[other] = _compile_figures(rate, phase, mfu)
    out["compiled_over_eager"] = out["compiled"]["steps_per_s"] / out["eager"]["steps_per_s"]
    return out


def _compile_figures(rate: throughput.Rate, phase: memory.Phase, mfu) -> Dict[str, Any]:
    return {"steps_per_s": rate.steps_per_s, "timed_steps": rate.steps, "warmup_s": rate.warmup_s,
            **phase.figures(""), **mfu(rate.steps_per_s)}


@contextlib.contextmanager
def _failed_check_keeps(result: Dict[str, Any]):
    """A CheckFailed carries what was measured before it (`exc.result`, which the command's JSON writes)."""
    try:
        yield
    except CheckFailed as exc:
        exc.result = {**result, "check_failed": {"name": exc.name, "detail": str(exc)}}
        raise


class Phases:
    """Seconds of each phase in order (`phase_s` in the result): where the time went, so a run that grew shows what
    grew (the same phases a run records as `time/<phase>_s`)."""

    def __init__(self, budget: Budget):
        self.budget, self.mark, self.seconds = budget, 0.0, {}

    def done(self, name: str) -> None:
        now = self.budget.elapsed()
        self.seconds[name], self.mark = round(now - self.mark, 3), now


def correlation_phase(trainee: Trainee, meter: memory.PeakMemory) -> Dict[str, Any]:
    """The correlation's peak memory (`correlation_peak_memory_*`) at the run's pairs (`trainer.correlation_steps`),
    or why it was not measured (`correlation_not_measured`: a stream without two consecutive per-worker batches)."""
    pairs = int(trainee.cfg.trainer.correlation_steps)
    try:
        peak, _ = memory.measured(meter, lambda: memory.correlation(trainee, pairs))
    except ValueError as exc:
        return {"correlation_not_measured": str(exc)}
    gc.collect()
    return peak.figures("correlation_")


def training_phase(trainee: Trainee, meter: memory.PeakMemory, steps: int, budget: Budget, warmup: int = WARMUP):
    """(the peaks of live steps and one checkpoint save, (their Rate, (the checkpoint's bytes on disk, the
    seconds of its save)))."""
    def phase():
        live = throughput.live(trainee, warmup, steps, budget)
        began = time.perf_counter()
        saved = memory.save_checkpoint(trainee)
        return live, (saved, time.perf_counter() - began)

    return memory.measured(meter, phase)


def main(cfg, *, device: Optional[str] = None, steps: int = 20, json_path: Optional[str] = None,
         time_budget: float = 480.0, compile: str = "auto", overrides: Sequence[str] = (),
         peak_tflops: Optional[float] = None) -> int:
    """`raystream bench`: print the table, write the JSON object. Exit 0, 2 (bad input) or 3 (a check failed)."""
    try:
        if json_path:
            report.check_writable(json_path)
        result = run(cfg, device=device, steps=steps, time_budget=time_budget, compile=compile, overrides=overrides,
                     peak_tflops=peak_tflops)
    except (DataError, ValueError, OSError) as exc:  # BenchError and a bad checkpoint (CheckpointError) included
        print(f"raystream bench: {exc}", file=sys.stderr)
        return 2
    except CheckFailed as exc:  # a check before timing, or a step that stopped being finite while timed
        before = getattr(exc, "result", None) is not None
        print(f"raystream bench: {exc}; {'stopped before timing' if before else 'stopped'}", file=sys.stderr)
        if json_path and before:
            report.write_json(exc.result, json_path)
        return 3
    print(report.table(result))
    if json_path:
        report.write_json(result, json_path)
    return 0
