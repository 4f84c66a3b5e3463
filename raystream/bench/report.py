"""What `raystream bench` prints (a short table) and writes (one JSON object, `--json PATH`).

JSON keys: device, device_name, torch, date (UTC), overrides; the setting (scenario, backbone, optimizer,
batch_size per worker, global_batch_size, num_workers, frames_per_clip, resolution, bf16, torch_threads);
steps, warmup; from_memory_steps_per_s, from_memory_clips_per_s, live_steps_per_s, live_clips_per_s,
live_over_memory (live / from-memory), live_decode_workers (the configured count), from_memory_timed_steps and
live_timed_steps (fewer than `steps` when the time budget ran out); decode_workers (the smallest measured
count reaching 0.9x of from-memory, null when none did), decode_bound, decode_workers_sweep
{count: {steps_per_s, over_memory}}, decode_workers_not_measured, decode_verdict; optimizer_step_ms {label: ms},
optimizer_configured (with `optimizer.compile: auto`, the step auto chose), optimizer_compile_auto ("compiled: why"
or "eager: why"; null when compile is true or false), optimizer_step_skipped {label: why}, optimizer_compiled
{label: whether the compiled optimizer's steps ran compiled, e.g. "ran compiled (23 steps)" or "ran eagerly in 3 of
23 steps: <reason>"}; memory
(raystream/bench/memory.py): peak_memory_gb (GiB) and peak_memory_bytes of the training phase (live steps and one
checkpoint save, on the device), host_peak_memory_gb/_bytes (the host's; on CPU the same),
correlation_peak_memory_gb/_bytes and correlation_host_peak_memory_gb/_bytes of the stream correlation before step 0
(or correlation_not_measured: why), checkpoint_bytes (on disk), peak_memory_how; checks {name: "passed: ..." |
"skipped: ..."}; phase_s {phase: seconds} (start, correlation, checks, from_memory, model_compile,
live_and_checkpoint, trial_parts, optimizer, decode_workers); time_budget_s, elapsed_s. trial_parts_s {process_start,
build, correlation, evaluation, checkpoint} (seconds of a trial outside its steps: raystream/bench/trial_parts.py),
trial_parts_not_measured {part: why}, trial_process_chain.
FLOPs (raystream/bench/flops.py): model_flops_per_step (one worker's forward and backward, FlopCounterMode),
peak_tflops (the device's dense bf16 peak, TFLOP/s; null when unknown) and peak_source (the datasheet, `--peak-tflops`,
or why none is known); from_memory_tflops_per_s, from_memory_mfu, live_tflops_per_s, live_mfu (the MFU a fraction
of the peak, null without one). model_compile (`trainer.compile`: the model's ViT blocks compiled or eager, steps
from memory): configured ("eager" | "compiled"), trainer_compile, blocks, eager and compiled {steps_per_s,
timed_steps, warmup_s (the untimed steps: compiling happens there), peak_memory_bytes/_gb,
host_peak_memory_bytes/_gb, tflops_per_s, mfu} or {skipped: why}, compiled_over_eager (when both ran).
A run stopped by a failed check writes device, checks and check_failed {name, detail} instead of the figures.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

from raystream.bench.flops import flops_text, mfu_text


def table(r: Dict[str, Any]) -> str:
    """The result as a few aligned lines."""
    lines: List[str] = [
        f"raystream bench  {r['date']}  {r['device']} ({r['device_name']}), torch {r['torch']}",
        f"{r['scenario']} {r['backbone']}, {r['frames_per_clip']}x{r['resolution']}px, batch {r['batch_size']} per "
        f"worker (global {r['global_batch_size']} / {r['num_workers']}), {r['optimizer']}, "
        f"bf16 {'on' if r['bf16'] else 'off'}; {r['steps']} steps after {r['warmup']}",
        "",
        flops_line(r),
        "",
        f"{'feed':<28} {'steps/s':>8} {'clips/s':>9} {'x memory':>9} {'TFLOP/s':>9}  MFU",
        f"{'from memory':<28} {r['from_memory_steps_per_s']:8.2f} {r['from_memory_clips_per_s']:9.1f} {1.0:9.2f} "
        f"{r['from_memory_tflops_per_s']:9.3g}  {mfu_text(r['from_memory_mfu'])}",
        f"{'live, decode_workers=' + str(r['live_decode_workers']):<28} {r['live_steps_per_s']:8.2f} "
        f"{r['live_clips_per_s']:9.1f} {r['live_over_memory']:9.2f} {r['live_tflops_per_s']:9.3g}  "
        f"{mfu_text(r['live_mfu'])}",
    ]
    for w, s in r["decode_workers_sweep"].items():
        lines.append(f"{'  sweep decode_workers=' + w:<28} {s['steps_per_s']:8.2f} "
                     f"{s['steps_per_s'] * r['batch_size']:9.1f} {s['over_memory']:9.2f}")
    lines += [f"decode workers: {r['decode_verdict']}", "", *compile_lines(r["model_compile"]), ""]
    fused = r["optimizer_step_ms"].get("adamw_fused")
    lines.append(f"{'optimizer step':<32} {'ms':>8} {'x fused':>9}")
    for name, ms in r["optimizer_step_ms"].items():
        ratio = f"{ms / fused:9.2f}" if fused else f"{'':9}"
        mark = " (configured)" if name == r["optimizer_configured"] else ""
        lines.append(f"{name + mark:<32} {ms:8.2f} {ratio}")
    if r["optimizer_compile_auto"]:
        lines.append(f"optimizer.compile=auto chose {r['optimizer_compile_auto']}")
    for name, why in r["optimizer_step_skipped"].items():
        lines.append(f"{name:<32} not timed: {why}")
    for name, how in r["optimizer_compiled"].items():
        lines.append(f"{name:<32} {how}")
    lines += ["", *memory_lines(r),
              "checks: " + "; ".join(f"{k} {v}" for k, v in r["checks"].items()),
              "phases, s: " + ", ".join(f"{k} {v:.1f}" for k, v in r.get("phase_s", {}).items()),
              "a trial outside its steps, s: "
              + ", ".join(f"{k} {v:.1f}" for k, v in r.get("trial_parts_s", {}).items())
              + "".join(f"; {k} not measured: {v}" for k, v in r.get("trial_parts_not_measured", {}).items()),
              f"{r['elapsed_s']:.0f} s of a {r['time_budget_s']:.0f} s budget"]
    return "\n".join(lines)


def flops_line(r: Dict[str, Any]) -> str:
    """The model FLOPs per step and the peak MFU is taken against."""
    peak = (f"MFU against {r['peak_tflops']:g} TFLOP/s dense bf16 ({r['peak_source']})" if r["peak_tflops"]
            else r["peak_source"])
    return (f"model FLOPs per step {flops_text(r['model_flops_per_step'])} (forward and backward at batch "
            f"{r['batch_size']}, FlopCounterMode); {peak}")


def compile_lines(c: Dict[str, Any]) -> List[str]:
    """Steps from memory with the model's blocks eager and compiled (`trainer.compile`)."""
    lines = [f"model compiled (trainer.compile={str(c['trainer_compile']).lower()}: {c['configured']}; "
             f"{c['blocks']} transformer blocks compiled regionally), steps from memory:",
             f"  {'':<10} {'steps/s':>8} {'x eager':>8} {'peak GiB':>9} {'warm-up s':>10}  MFU"]
    for mode in ("eager", "compiled"):
        m = c[mode]
        if "skipped" in m:
            lines.append(f"  {mode:<10} not measured: {m['skipped']}")
            continue
        ratio = m["steps_per_s"] / c["eager"]["steps_per_s"] if "steps_per_s" in c["eager"] else None
        lines.append(f"  {mode:<10} {m['steps_per_s']:8.2f} {'-' if ratio is None else f'{ratio:.2f}':>8} "
                     f"{m['peak_memory_gb']:9.2f} {m['warmup_s']:10.1f}  {mfu_text(m['mfu'])}")
    return lines


def memory_lines(r: Dict[str, Any]) -> List[str]:
    """The peaks of the training phase and of the correlation, device and (on CUDA) host."""
    def peak(prefix: str) -> str:
        host = f", host {r[prefix + 'host_peak_memory_gb']:.2f} GiB" if r["device"] == "cuda" else ""
        return f"{r[prefix + 'peak_memory_gb']:.2f} GiB{host}"

    correlation = (peak("correlation_") if "correlation_peak_memory_gb" in r
                   else f"not measured ({r['correlation_not_measured']})")
    return [f"peak memory, live steps + one checkpoint save ({r['checkpoint_bytes'] / 2 ** 30:.2f} GiB on disk): "
            f"{peak('')}", f"peak memory, stream correlation before step 0: {correlation}",
            f"  ({r['peak_memory_how']})"]


def check_writable(path: str) -> None:
    """Fail before measuring, not after: `path`'s folder can be made and written. Raises OSError naming it."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        probe = target.with_name(f".{target.name}.{os.getpid()}.probe")
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OSError(f"--json {path}: cannot write there ({exc.strerror or exc})") from None


def write_json(result: Dict[str, Any], path: str) -> None:
    """`result` as one JSON object at `path`, written whole (a temporary file renamed over it)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, target)
