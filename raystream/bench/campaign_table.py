"""The GPU campaign's Markdown (campaign.md; campaign.py writes and prints it): its JSON result as tables.

`markdown(result)`: a header (device, torch, commit, budget; the peak MFU is taken against), one row per preset
(steps/s from memory and live with their MFU, the model compiled against eager, peak memory beside the estimate,
host syncs, the checkpoint's stall), the optimizer step alone per preset, the checks before timing; then the
sections of the phases after the presets, each where it ran: decode (frames/s per decoder), gpu_decode (`raystream
bench --decoders` and the decode-worker scaling) and eval (feature extraction), and the phases that failed.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

_GIB = float(1 << 30)


def markdown(r: Dict[str, Any]) -> str:
    """The campaign's table: one row per preset, then decoders and evaluation."""
    lines = [f"GPU campaign {r['date']}, {r['device_name']} ({r['device']}{', tiny dry run' if r['tiny'] else ''}), "
             f"torch {r['torch']}, commit {r['commit']}, {r.get('elapsed_s', '?')} s of a {r['budget_s']:.0f} s budget",
             "",
             f"MFU against {_peak_text(r)}; steps/s from device memory, then live",
             "",
             *preset_lines(r["presets"]), *decode_lines(r.get("decode", {})),
             *gpu_decode_lines(r.get("gpu_decode", {})), *eval_lines(r.get("eval", {}))]
    if r["failed"]:
        lines += ["", "failed: " + ", ".join(r["failed"]) + " (errors in the JSON)"]
    return "\n".join(lines) + "\n"


def preset_lines(presets: Dict[str, Any]) -> List[str]:
    """The presets' table, then their optimizer steps alone and their checks before timing."""
    lines = ["| preset | batch/GPU | model TFLOP/step | steps/s memory (MFU) | steps/s live (MFU) | live/memory | "
             "compiled steps/s (MFU), x eager | peak GiB eager / compiled | peak GiB (estimate) | "
             "syncs: steps / read | checkpoint stall s (write s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    optimizer = ["", "optimizer step alone (ms, x AdamW fused; how the compiled or fused steps ran):", "",
                 "| preset | optimizer | ms | x fused | ran |", "|---|---|---|---|---|"]
    checks = ["", "checks before timing:"]
    for name, p in presets.items():
        b = p.get("bench", {})
        if "skipped" in p or "error" in b:
            why = p.get("skipped") or b["error"].splitlines()[0][:120]
            lines.append(f"| {name} | | | {why} | | | | | | | |")
            continue
        lines.append(_preset_row(name, b, p.get("estimate", {}), p.get("train", {})))
        optimizer += _optimizer_rows(name, b)
        checks.append(f"- {name}: " + "; ".join(f"{k} {v}" for k, v in b.get("checks", {}).items()))
    return lines + optimizer + checks


def _preset_row(name: str, b: Dict[str, Any], e: Dict[str, Any], t: Dict[str, Any]) -> str:
    """One preset's row: its bench, memory estimate and two worker steps."""
    peak = max(b.get("peak_memory_bytes", 0), b.get("correlation_peak_memory_bytes", 0)) / _GIB
    est = _f(e.get("tensors_bytes", None) and e["tensors_bytes"] / _GIB) if "error" not in e else "error"
    syncs = (f"{_f(t.get('host_syncs_in_steps'), '{}')} / {_f(t.get('host_syncs_in_read'), '{}')}"
             if "error" not in t else "error")
    stall = (f"{_f(t.get('checkpoint_stall_s'))} ({_f(t.get('checkpoint_write_s'))})" if "error" not in t
             else "error")
    compiled, mem = _compile_cells(b.get("model_compile", {}))
    return (f"| {name} | {b.get('batch_size')} | {_f(b.get('model_flops_per_step', 0) / 1e12, '{:.3g}')} | "
            f"{_f(b.get('from_memory_steps_per_s'))} ({_mfu(b.get('from_memory_mfu'))}) | "
            f"{_f(b.get('live_steps_per_s'))} ({_mfu(b.get('live_mfu'))}) | "
            f"{_f(b.get('live_over_memory'))} | {compiled} | {mem} | {peak:.2f} ({est}) | {syncs} | {stall} |")


def _optimizer_rows(name: str, b: Dict[str, Any]) -> List[str]:
    """The preset's optimizer steps timed alone (x AdamW fused, how they ran), then those not timed and why."""
    ms = b.get("optimizer_step_ms", {})
    fused = ms.get("adamw_fused")
    ran = b.get("optimizer_compiled", {})
    rows = []
    for label, v in ms.items():
        mark = " (configured)" if label == b.get("optimizer_configured") else ""
        rows.append(f"| {name} | {label}{mark} | {v:.2f} | {_f(fused and v / fused)} | {ran.get(label, '')} |")
    return rows + [f"| {name} | {label} | not timed: {why} | | |"
                   for label, why in b.get("optimizer_step_skipped", {}).items()]


def decode_lines(d: Dict[str, Any]) -> List[str]:
    """Frames/s of the clip stream per decoder, one worker (the `decode` phase), and each decoder's first open."""
    if "decoders" not in d:
        return []
    lines = ["", f"decode, {d['video_frames']} frames {d['canvas']} px, clips at {d['resolution']} px, 1 worker:",
             "", "| setting decoder | frames/s |", "|---|---|"]
    for key, v in d["decoders"].items():
        lines.append(f"| {key} | {_f(v.get('frames_per_s'), '{:.0f}') if 'frames_per_s' in v else v}"
                     .replace("{", "").replace("}", "") + " |")
    if d.get("first_open_s"):
        lines += ["", "first open in a process (the decoder's library loads; not in the rates): " + ", ".join(
            f"{k} {v:.2f} s" for k, v in d["first_open_s"].items())]
    return lines


def gpu_decode_lines(g: Dict[str, Any]) -> List[str]:
    """`raystream bench --decoders` on the GPU machine (NVDEC where it loads) and the decode-worker scaling."""
    lines: List[str] = []
    if "rows" in g:
        nv = g.get("nvdec", {})
        lines += ["", f"decoders (`raystream bench --decoders`, best of {g['repeat']}), GPU decoding: {g['gpu']}"
                      + (f"; NVDEC probe: frames on {nv['frames_device']}, CPU fallback: {nv['cpu_fallback']}"
                         if nv else ""),
                  "", "| video | decoder | workers | frames/s | frames per CPU-s | read by |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {x['video']} | {x['decoder']} | {x['workers']} | {x['frames_per_s']:.0f} | "
                  f"{x['frames_per_cpu_s']:.0f} | {x['read_by']} |" for x in g["rows"]]
    if "scaling_skipped" in g:
        lines += ["", f"decode-worker scaling not measured: {g['scaling_skipped']}"]
    if "scaling" in g:
        sc = g["scaling"]
        lines += ["", f"decode-worker scaling: {sc['decoder']} on {sc['device']}, VideoMAE clips of a "
                      f"{sc['video_frames']}-frame 256 px video, {sc['cores']} cores"
                      + (f" ({sc['not_measured']} workers not measured)" if sc["not_measured"] else ""),
                  "", "| backend | workers | frames/s | x 1 worker | after the first batch, x 1 worker | "
                      "decoded bytes per clip |", "|---|---|---|---|---|---|"]
        lines += [f"| {x['backend']} | {x['workers']} | {x['frames_per_s']:.0f} | {x['over_1']:.2f} | "
                  f"{_f(x.get('steady_over_1'))} | {x['decoded_bytes_per_clip']:,} |" for x in sc["rows"]]
    return lines


def eval_lines(ev: Dict[str, Any]) -> List[str]:
    """The evaluation features' rates (the `eval` phase), where it ran."""
    if "vit_s16_images_per_s" not in ev:
        return []
    return ["", f"evaluation features ({'bf16' if ev['bf16'] else 'fp32'}, {ev['resolution']} px): ViT-S/16 "
                f"{ev['vit_s16_images_per_s']:.1f} images/s (batch {ev['image_batch']}), ViT-B/16 "
                f"{ev['vit_b16_clips_per_s']:.2f} clips/s (batch {ev['clip_batch']})"]


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _mfu(x: Optional[float]) -> str:
    return "MFU ?" if x is None else f"{100 * x:.1f} %"


def _peak_text(r: Dict[str, Any]) -> str:
    """The peak the presets' MFU is taken against (the first measured preset's; all ran on one device)."""
    for p in r["presets"].values():
        b = p.get("bench", {})
        if "peak_source" in b:
            return (f"{b['peak_tflops']:g} TFLOP/s dense bf16 ({b['peak_source']})" if b["peak_tflops"]
                    else b["peak_source"])
    return "no preset measured"


def _compile_cells(c: Dict[str, Any]):
    """(compiled steps/s (MFU), x eager; peak GiB eager / compiled) of the bench's `model_compile`."""
    eager, compiled = c.get("eager", {}), c.get("compiled", {})
    if "steps_per_s" not in compiled:
        return f"not measured: {compiled.get('skipped', '-')}", _f(eager.get("peak_memory_gb"))
    return (f"{compiled['steps_per_s']:.2f} ({_mfu(compiled['mfu'])}), {_f(c.get('compiled_over_eager'))}x",
            f"{_f(eager.get('peak_memory_gb'))} / {compiled['peak_memory_gb']:.2f}")


__all__ = ["markdown", "preset_lines", "decode_lines", "gpu_decode_lines", "eval_lines"]
