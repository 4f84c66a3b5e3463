"""`raystream bench` on the CPU (raystream/bench/): a tiny VideoMAE on real demo videos decoded by decord, the real
optimizers, the real DeviceStream. Checks what a user reads off the JSON object (fields present and consistent
with each other), that the command imports neither Ray nor MLflow (it must run on a bare GPU box), and the paths
that stop it: a check that fails (through the documented test hook), a CUDA device that is not there."""

import json
import os
import subprocess
import sys

import pytest
import torch

from raystream.bench import checks, flops, report, throughput
from raystream.bench.main import compile_decision, main as bench_main, model_compile_phase
from raystream.bench.trainee import Budget
from raystream.config import compose


def _tiny(tmp):
    return ["data.demo.num_videos=2", "data.demo.frames_per_video=90", f"data.demo.cache_dir={tmp / 'demo'}",
            "stream.batch_size=2", "scenario.backbone.depth=1"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return tmp_path_factory.mktemp("bench")


# The command in a fresh interpreter: afterwards it says on stderr which of Ray and MLflow were imported.
_RUN = ("import sys; from raystream.cli import main; rc = main(sys.argv[1:]); "
        "print('IMPORTED', sorted(m for m in ('ray', 'mlflow') if m in sys.modules), file=sys.stderr); "
        "sys.exit(rc)")


def test_bench_writes_consistent_figures_without_ray_or_mlflow(demo):
    out_json = demo / "out" / "bench.json"
    out = subprocess.run([sys.executable, "-c", _RUN, "bench", *_tiny(demo), "--device", "cpu", "--steps", "3",
                          "--time-budget", "300", "--peak-tflops", "0.5", "--json", str(out_json)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "IMPORTED []" in out.stderr, out.stderr
    assert "from memory" in out.stdout and "adamw_fused" in out.stdout and "peak memory" in out.stdout
    r = json.loads(out_json.read_text())
    assert r["device"] == "cpu" and r["batch_size"] == 2 and r["steps"] == 3
    # the ratio is the quotient of the rates, clips/s are steps/s times the per-worker batch
    assert r["live_over_memory"] == pytest.approx(r["live_steps_per_s"] / r["from_memory_steps_per_s"], rel=1e-12)
    assert r["from_memory_clips_per_s"] == pytest.approx(2 * r["from_memory_steps_per_s"], rel=1e-12)
    assert r["live_clips_per_s"] == pytest.approx(2 * r["live_steps_per_s"], rel=1e-12)
    assert r["from_memory_steps_per_s"] > 0 and r["live_steps_per_s"] > 0
    assert r["from_memory_timed_steps"] == r["live_timed_steps"] == 3  # the budget did not cut them short
    # FLOPs: counted once (flops.py), achieved TFLOP/s = FLOPs x steps/s, MFU against the peak passed
    assert r["model_flops_per_step"] == flops.step_flops(compose(_tiny(demo)), 2) > 0
    assert r["peak_tflops"] == 0.5 and r["peak_source"] == "--peak-tflops"
    for feed in ("from_memory", "live"):
        achieved = r["model_flops_per_step"] * r[f"{feed}_steps_per_s"] / 1e12
        assert r[f"{feed}_tflops_per_s"] == pytest.approx(achieved, rel=1e-12)
        assert r[f"{feed}_mfu"] == pytest.approx(achieved / 0.5, rel=1e-12)
    assert "model FLOPs per step" in out.stdout and "MFU against 0.5 TFLOP/s" in out.stdout
    # the model eager (trainer.compile=false, the default) from memory; compiled not tried within this budget
    c = r["model_compile"]
    assert c["configured"] == "eager" and c["trainer_compile"] is False and c["blocks"] == 2  # encoder, decoder
    assert c["eager"]["steps_per_s"] == r["from_memory_steps_per_s"] and c["eager"]["peak_memory_bytes"] > 0
    assert c["eager"]["mfu"] == r["from_memory_mfu"]
    assert c["compiled"]["skipped"].startswith("time budget 300 s < 600 s") and "compiled_over_eager" not in c
    # without --peak-tflops a CPU has no peak: FLOPs and TFLOP/s printed, MFU unknown (the same figures)
    no_peak = {**r, "peak_tflops": None, "peak_source": flops.peak_tflops(torch.device("cpu"))[1],
               "from_memory_mfu": None, "live_mfu": None, "model_compile": {**c, "eager": {**c["eager"], "mfu": None}}}
    printed = report.table(no_peak)
    assert "no bf16 peak is known for a CPU: MFU unknown (pass --peak-tflops)" in printed
    assert printed.count("unknown (pass --peak-tflops)") == 4, printed  # the line, both feeds, the eager model
    # decode workers: the counts swept are 1, 2, 4, ... up to the cores; the answer is one of them, or none
    cores = len(os.sched_getaffinity(0))
    swept = [int(w) for w in r["decode_workers_sweep"]]
    assert swept and set(swept) <= set(throughput.worker_counts(cores))
    for s in r["decode_workers_sweep"].values():
        assert s["over_memory"] == pytest.approx(s["steps_per_s"] / r["from_memory_steps_per_s"], rel=1e-12)
    if r["decode_workers"] is None:
        assert r["decode_bound"] or r["decode_workers_not_measured"], r
    else:  # the smallest measured count reaching 0.9x
        assert r["decode_workers"] in swept and not r["decode_bound"]
        reached = r["decode_workers_sweep"][str(r["decode_workers"])]["over_memory"]
        assert reached >= throughput.TARGET
        assert all(r["decode_workers_sweep"][str(w)]["over_memory"] < throughput.TARGET
                   for w in swept if w < r["decode_workers"])
    # the optimizer step: the configured one and both AdamW baselines; the compiled one left out by the budget
    ms = r["optimizer_step_ms"]
    assert {"orthogonal_adamw", "adamw_foreach", "adamw_fused"} <= set(ms) and all(v > 0 for v in ms.values())
    assert r["optimizer_configured"] == "orthogonal_adamw"  # compile: auto, a tiny model: the eager step
    assert r["optimizer_compile_auto"].startswith("eager: ") and "optimizer.compile_min_params" in \
        r["optimizer_compile_auto"]
    assert "time budget" in r["optimizer_step_skipped"]["orthogonal_adamw_compiled"]
    assert r["optimizer_compiled"] == {}  # whether a compiled optimizer ran compiled: none was timed
    assert r["peak_memory_gb"] > 0 and r["peak_memory_gb"] == pytest.approx(r["peak_memory_bytes"] / 2 ** 30)
    # the correlation's phase and the training's (steps and one checkpoint save); on a CPU the host is the device
    assert 0 < r["correlation_peak_memory_bytes"] and r["checkpoint_bytes"] > 0
    assert r["host_peak_memory_bytes"] == r["peak_memory_bytes"]
    assert "above the" in r["peak_memory_how"] and "stream correlation before step 0" in out.stdout
    assert r["checks"]["device_stream"].startswith("passed") and r["checks"]["bf16_step"].startswith("passed")
    assert r["checks"]["compiled_step"].startswith("skipped: time budget")
    assert 0 < r["elapsed_s"] and r["time_budget_s"] == 300
    # the parts of a trial outside its steps (raystream/bench/trial_parts.py), which `raystream plan` adds to a trial
    parts = r["trial_parts_s"]
    assert set(parts) == {"process_start", "build", "correlation", "evaluation", "checkpoint"}
    assert all(v > 0 for v in parts.values()) and r["trial_parts_not_measured"] == {}, r
    assert parts["correlation"] == r["phase_s"]["correlation"] and r["trial_process_chain"] == 7
    assert "a trial outside its steps, s: process_start" in out.stdout


@pytest.mark.parametrize("check", ["device_stream", "bf16_step"])
def test_a_failed_check_stops_before_timing_and_names_itself(demo, monkeypatch, capsys, check):
    monkeypatch.setenv(checks.BREAK_ENV, check)
    out_json = demo / f"failed-{check}.json"
    rc = bench_main(compose(_tiny(demo)), device="cpu", steps=2, json_path=str(out_json), time_budget=60)
    assert rc == 3
    err = capsys.readouterr().err
    assert f"check `{check}` failed" in err and "stopped before timing" in err
    r = json.loads(out_json.read_text())
    assert r["check_failed"]["name"] == check and "live_steps_per_s" not in r


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_a_named_error(demo, capsys):
    from raystream.cli import main

    rc = main(["bench", *_tiny(demo), "--device", "cuda", "--json", str(demo / "cuda.json")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "sees no CUDA device" in err and "--device cpu" in err
    assert not (demo / "cuda.json").exists()


def test_a_peak_that_is_not_positive_fails_before_measuring(demo, capsys):
    rc = bench_main(compose(_tiny(demo)), device="cpu", steps=1, peak_tflops=-1.0)
    assert rc == 2
    assert "raystream bench: --peak-tflops -1.0: expected a peak > 0 (TFLOP/s)" in capsys.readouterr().err


def test_an_unwritable_json_path_fails_before_measuring(demo, capsys):
    blocker = demo / "a-file"
    blocker.write_text("")
    rc = bench_main(compose(_tiny(demo)), device="cpu", steps=1, json_path=str(blocker / "bench.json"))
    assert rc == 2
    err = capsys.readouterr().err
    assert f"--json {blocker / 'bench.json'}: cannot write there" in err


def test_an_evaluation_whose_data_is_not_here_is_named_and_not_timed(demo, tmp_path):
    """A GPU node's bench with a config whose probe set lives elsewhere (a path of the cluster's storage): the
    trial's evaluation part is not measured, and `trial_parts_not_measured` says why, naming the missing file; the
    plan then says the evaluation is not in a trial's time (raystream/tune/rates.py)."""
    from raystream.bench import trial_parts
    from raystream.bench.trainee import Trainee

    missing = tmp_path / "probes.csv"  # never written
    cfg = compose(_tiny(demo) + [f"eval.dataset={missing}"])
    trainee = Trainee.build(cfg, torch.device("cpu"), total_steps=1)
    seconds, why = trial_parts.evaluation(trainee)
    assert seconds == 0.0 and why.startswith("the evaluation could not run here: ") and str(missing) in why, why
    row = trial_parts.parts(trainee, build_s=1.0, correlation_s=0.0, checkpoint_s=0.5, seconds_left=60)
    assert row["trial_parts_s"]["evaluation"] == 0.0 and row["trial_parts_not_measured"] == {"evaluation": why}


def test_a_compiled_model_is_measured_against_eager_and_stays_compiled(demo):
    """trainer.compile=true: the configured (compiled) figures are the from-memory steps', and the eager ones are
    taken with the blocks switched to eager for it (no compiling needed, whatever --compile says) and compiled
    again after."""
    from raystream.bench import memory
    from raystream.bench.trainee import Trainee
    from raystream.models.vit import blocks_of

    cfg = compose(_tiny(demo) + ["trainer.compile=true"])
    trainee = Trainee.build(cfg, torch.device("cpu"), total_steps=10)
    meter = memory.PeakMemory(torch.device("cpu"), memory.rss())
    configured = (throughput.Rate(5.0, 10.0, 2, 1.0, 30.0), memory.Phase(1 << 30, 1 << 30))
    c = model_compile_phase(trainee, meter, configured, "off", 1, Budget(60), lambda rate: {"mfu": rate / 100})
    assert c["configured"] == "compiled" and c["compiled"]["steps_per_s"] == 5.0 and c["compiled"]["warmup_s"] == 30
    assert c["compiled"]["peak_memory_gb"] == 1.0 and c["compiled"]["mfu"] == 0.05
    assert c["eager"]["steps_per_s"] > 0 and c["eager"]["timed_steps"] == 1
    assert c["compiled_over_eager"] == pytest.approx(5.0 / c["eager"]["steps_per_s"])
    assert all(b._compiled_call_impl is not None for b in blocks_of(trainee.model))  # compiled again


def test_the_sweep_counts_double_up_to_the_cores():
    assert throughput.worker_counts(1) == [1]
    assert throughput.worker_counts(2) == [1, 2]
    assert throughput.worker_counts(6) == [1, 2, 4, 6]
    assert throughput.worker_counts(16) == [1, 2, 4, 8, 16]


def test_compiling_is_decided_by_the_optimizer_the_flag_and_the_budget(demo):
    cfg = compose(_tiny(demo))
    cpu = torch.device("cpu")
    allowed, why = compile_decision("auto", cfg.optimizer, cpu, Budget(60))
    assert not allowed and "time budget 60 s" in why and "--compile on" in why
    assert compile_decision("auto", cfg.optimizer, cpu, Budget(3600)) == (True, "")
    assert compile_decision("on", cfg.optimizer, cpu, Budget(60)) == (True, "")
    assert compile_decision("off", cfg.optimizer, cpu, Budget(3600)) == (False, "--compile off")
    allowed, why = compile_decision("on", compose(_tiny(demo) + ["optimizer=adamw"]).optimizer, cpu, Budget(3600))
    assert not allowed and "not applicable to optimizer.name=adamw" in why


def test_sweep_verdicts_name_the_count_or_what_stopped_it():
    memory = throughput.Rate(10.0, 20.0, 3, 1.0)
    slow = throughput.Rate(5.0, 10.0, 3, 1.0)
    assert "decode_workers=2 reaches" in throughput.Sweep({1: slow, 2: memory}, 2, False, []).verdict(memory)
    bound = throughput.Sweep({1: slow, 2: slow}, None, True, []).verdict(memory)
    assert bound.startswith("decode-bound") and "up to 2" in bound and "0.50x" in bound
    cut = throughput.Sweep({1: slow}, None, False, [2, 4]).verdict(memory)
    assert cut.startswith("undetermined") and "[2, 4]" in cut
    fewer = throughput.Sweep({2: memory}, 2, False, [1]).verdict(memory)
    assert fewer.startswith("decode_workers=2 reaches") and "fewer ([1]) not measured" in fewer


def test_a_spent_budget_still_reports_the_configured_count(demo):
    """With no time left the sweep measures nothing new, yet the count measured at the configured setting counts."""
    memory = throughput.Rate(10.0, 20.0, 3, 1.0)
    spent = Budget(0)
    sweep = throughput.sweep_decode_workers(None, memory, [1, 2, 4], 0, 1, spent, {2: memory})
    assert sweep.needed == 2 and sweep.not_measured == [1] and list(sweep.rates) == [2]
    sweep = throughput.sweep_decode_workers(None, memory, [1, 2, 4], 0, 1, spent,
                                            {2: throughput.Rate(5.0, 10.0, 3, 1.0)})
    assert sweep.needed is None and not sweep.decode_bound and sweep.not_measured == [1, 4]



def test_compiled_updates_must_follow_the_stock_ones():
    """The comparison behind the `compiled_step` check (the compilation itself takes minutes on this CPU: run
    `raystream bench --compile on` to see it pass)."""
    from raystream.bench.trainee import CheckFailed

    gen = torch.Generator().manual_seed(0)
    before = [torch.randn(64, 8, generator=gen), 1.0 + torch.zeros(8)]
    stock = [p - 1e-4 * torch.randn(p.shape, generator=gen) for p in before]
    rounded = [s + 2 * torch.finfo(torch.float32).eps * s.abs() for s in stock]  # a few ulps off: agrees
    assert checks.same_updates(before, stock, rounded).startswith("updates agree")
    wrong = [stock[0], before[1] + 2 * (before[1] - stock[1])]  # the second moved the other way
    with pytest.raises(CheckFailed, match="check `compiled_step` failed: .* parameter 1 differ"):
        checks.same_updates(before, stock, wrong)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_eval_rates_on_a_gpu_the_machine_lacks_is_a_named_error(capsys, tmp_path):
    from raystream.cli import main

    rc = main(["bench", "--eval", "--device", "cuda", "--json", str(tmp_path / "eval.json")])
    assert rc == 2
    assert "raystream bench --eval: --device cuda but torch sees no GPU" in capsys.readouterr().err
    assert not (tmp_path / "eval.json").exists()


@pytest.mark.slow  # the models built at full width: a few seconds
def test_eval_rates_measure_a_worker_and_estimate_the_papers_evaluations(capsys, tmp_path, monkeypatch):
    """The models' shapes as measured (ViT-S on 224 px images, ViT-B on 16-frame clips, the probe on ViT-B's tokens),
    with one block each and the probe's step at batch 2: what is checked is what `--eval` does with the rates, and
    12 blocks and a batch of 32 cost most of 20 CPU-s here for the same code."""
    from raystream.bench import eval_rates
    from raystream.models.vit import VisionTransformer

    monkeypatch.setattr(eval_rates, "VisionTransformer", lambda **kw: VisionTransformer(**{**kw, "depth": 1}))
    monkeypatch.setattr(eval_rates, "VJEPA_BATCH", 2)
    eval_rates_main = eval_rates.main
    out = tmp_path / "eval.json"
    argv = ["--device", "cpu", "--batches", "1", "--image-batch", "1", "--clip-batch", "1", "--json", str(out)]
    assert eval_rates_main(argv) == 0
    result = json.loads(out.read_text())
    measured, hours = result["measured"], result["estimated_worker_hours"]
    assert all(measured[k] > 0 for k in ("vit_s16_images_per_s", "vit_b16_clips16_per_s", "dino_jpeg_view_ms",
                                         "attentive_step_b32_vit_b_s"))
    # the estimates are the rates applied to the published set sizes: ImageNet's train images encoded for kNN once
    # and for the augmented linear probe every epoch (100), its val images once
    images = 1_281_167 * 101 + 50_000
    assert hours["dino_vit_s_imagenet"]["encode"] == pytest.approx(images / measured["vit_s16_images_per_s"] / 3600)
    assert hours["vjepa_vit_b_ssv2"]["attentive_probe"] == pytest.approx(
        40_000 * measured["attentive_step_b32_vit_b_s"] / 3600)
    printed = capsys.readouterr().out
    assert "DINO protocol, ViT-S, ImageNet" in printed and "V-JEPA protocol, ViT-B, SSv2" in printed
