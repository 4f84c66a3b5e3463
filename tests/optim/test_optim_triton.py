"""Orthogonal-AdamW's fused Triton step (raystream/optim/triton_step.py, triton_kernels.py) against Algorithm 2's
single-tensor reference, in Triton's interpreter on CPU tensors: fp32, bf16 and fp16 parameters, several param groups
with their own hyper-parameters (weight decay on and off, maximize), the global and per_tensor projections, both EMA
initialisations, the first step (no EMA yet) and the ones after it, the diagnostics, checkpoints that the other
implementations resume; the `raystream bench` timing of the fused step; and where the step is (not) chosen.

The interpreter must be switched on before Triton is imported (TRITON_INTERPRET=1), so the kernel tests run in a
child pytest of this file that `test_kernels_in_the_triton_interpreter` starts with it set: under pytest-xdist, in
the full suite, no worker's Triton is touched. Run them directly with
`TRITON_INTERPRET=1 python -m pytest -p no:xdist tests/optim/test_optim_triton.py`.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from optim_reference import correlated_gradients
from raystream.optim import OrthogonalAdamW
from raystream.optim.triton_step import KernelBuildError, installed, interpreting

needs_triton = pytest.mark.skipif(not installed(), reason="Triton is not installed (the dev extra installs it on "
                                                          "Linux x86_64)")
in_interpreter = pytest.mark.skipif(not interpreting(), reason="a kernel test: runs in the child process that "
                                                                "test_kernels_in_the_triton_interpreter starts")

# why the tests that run in the parent process skip in the interpreter's
PARENT_ONLY = ("already in the interpreter's process", "the interpreter runs the fused step on CPU tensors",
               "the interpreter's kernels are not compiled", "needs a CUDA device")
# several blocks and a partial last block (BLOCK 2048), small tensors, an empty one
SHAPES = [(48, 50), (4100,), (7,), (3, 3, 3), (0,), (33, 2)]
STEPS = 4


def _params(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((0.5 * torch.randn(s, generator=gen)).to(dtype)) for s in SHAPES]


def _groups(params):
    """Three param groups: decayed, undecayed with other betas / eps / orth_beta, and one that maximizes."""
    return [dict(params=params[:2], lr=0.01, weight_decay=0.1),
            dict(params=params[2:5], lr=0.02, weight_decay=0.0, betas=(0.8, 0.99), eps=1e-6, orth_beta=0.5),
            dict(params=params[5:], lr=0.005, weight_decay=0.05, maximize=True)]


def _run(dtype, projection, orth_init, triton, steps=STEPS, foreach=None, diagnostics=True, scale=1.0):
    params = _params(dtype)
    opt = OrthogonalAdamW(_groups(params), projection=projection, orth_init=orth_init, triton=triton,
                          foreach=foreach, diagnostics=diagnostics)
    diags = []
    for grads in correlated_gradients(SHAPES, steps):
        for p, g in zip(params, grads):
            p.grad = (scale * g).to(dtype)
        opt.step()
        if diagnostics:
            diags.append({k: float(v) for k, v in opt.diagnostics().items()})
    return params, opt, diags


def _ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of x's dtype at |x| (at least at the smallest normal number)."""
    info = torch.finfo(x.dtype)
    mag = x.detach().double().abs().clamp_min(info.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * info.eps


@needs_triton
def test_kernels_in_the_triton_interpreter():
    """This file's kernel tests, in a child pytest with TRITON_INTERPRET=1 set before Triton's import."""
    if interpreting():
        pytest.skip("already in the interpreter's process")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", "-x",
                          "-rs", __file__], cwd=Path(__file__).parent, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    # every kernel test ran: only the tests of the parent process (and a GPU's) are skipped there
    skipped = [line for line in out.stdout.splitlines() if line.startswith("SKIPPED")]
    assert " passed" in out.stdout and all(any(reason in line for reason in PARENT_ONLY) for line in skipped), \
        out.stdout[-3000:]


def test_cpu_default_is_the_multi_tensor_step_and_triton_true_says_why_not():
    """Without the interpreter, CPU parameters keep the eager step; triton=True there is a clear error, as are the
    combinations the fused step does not implement."""
    if interpreting():
        pytest.skip("the interpreter runs the fused step on CPU tensors")
    params = _params(torch.float32)
    opt = OrthogonalAdamW(params)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    assert opt.fused_step.steps == 0 and opt.state[params[0]]["step"].item() == 1
    with pytest.raises(ValueError, match=r"Invalid triton: True .*parameters on cpu: Triton runs the fused step on "
                                         r"CUDA"):
        OrthogonalAdamW(params, triton=True)
    with pytest.raises(ValueError, match="projection='dim0'"):
        OrthogonalAdamW(params, projection="dim0", triton=True)
    with pytest.raises(ValueError, match="compile=True"):
        OrthogonalAdamW(params, compile=True, triton=True)


@needs_triton
@in_interpreter
@pytest.mark.parametrize("projection", ["global", "per_tensor"])
@pytest.mark.parametrize("orth_init", ["zero", "first_grad"])
def test_fp32_matches_the_reference(projection, orth_init):
    fused, opt, diag_f = _run(torch.float32, projection, orth_init, triton=True)
    ref, _, diag_r = _run(torch.float32, projection, orth_init, triton=False, foreach=False)
    assert opt.fused_step.summary() == f"ran fused (Triton, {STEPS} steps)"
    for a, b in zip(fused, ref):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-7)
    for df, dr in zip(diag_f[1:], diag_r[1:]):  # step 1 has no EMA: cos(g, c) is NaN in both
        for key in ("grad_cos_prev", "grad_cos_ema", "update_norm_ratio"):
            assert df[key] == pytest.approx(dr[key], rel=1e-5, abs=1e-6), key


@needs_triton
@in_interpreter
@pytest.mark.parametrize("projection", ["global", "per_tensor"])
def test_state_matches_the_reference_and_checkpoints_cross_over(projection):
    """The same state tensors, dtypes and keys as the multi-tensor step keeps (a checkpoint of either resumes in the
    other: the param groups it restores keep fused=True); the first step has no EMA (c_1 = (1 - beta) g_1,
    u_1 = g_1)."""
    fused, opt, _ = _run(torch.float32, projection, "zero", triton=True, steps=1)
    ref, ref_opt, _ = _run(torch.float32, projection, "zero", triton=False, steps=1)
    for p, q in zip(fused, ref):
        assert opt.state[p].keys() == ref_opt.state[q].keys()
        for key, x in opt.state[p].items():
            y = ref_opt.state[q][key]
            assert (x.dtype, x.shape, x.device) == (y.dtype, y.shape, y.device), key
            torch.testing.assert_close(x, y, rtol=2e-6, atol=1e-9)
    # resume each from the other's checkpoint and step both: still together
    sd_fused, sd_ref = opt.state_dict(), ref_opt.state_dict()
    opt.load_state_dict(sd_ref)
    ref_opt.load_state_dict(sd_fused)
    for grads in correlated_gradients(SHAPES, 3, seed=1):
        for o, ps in ((opt, fused), (ref_opt, ref)):
            for p, g in zip(ps, grads):
                p.grad = g.float()
            o.step()
    assert opt.fused_step.steps == 4
    for a, b in zip(fused, ref):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-7)


@needs_triton
@in_interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("projection", ["global", "per_tensor"])
def test_half_precision_parameters_match_the_reference_to_rounding(dtype, projection):
    """bf16 / fp16 parameters, m and v (the reference's dtypes), the EMA in fp32. The fused step rounds once per
    stored value where the reference rounds after every op (its weight decay, lr wd p, is mostly lost to bf16's
    rounding): both stay within rounding of the same steps computed in float64 from the same start and rounded
    gradients, STEPS x (one ulp of the parameter + a tenth of lr) per element. Gradients are scaled so that fp16's
    v does not underflow."""
    fused, opt, _ = _run(dtype, projection, "zero", triton=True, scale=10.0, diagnostics=False)
    ref, ref_opt, _ = _run(dtype, projection, "zero", triton=False, foreach=False, scale=10.0, diagnostics=False)
    exact = [torch.nn.Parameter(p.detach().double()) for p in _params(dtype)]
    exact_opt = OrthogonalAdamW(_groups(exact), projection=projection, foreach=False)
    for grads in correlated_gradients(SHAPES, STEPS):
        for p, g in zip(exact, grads):
            p.grad = (10.0 * g).to(dtype).double()
        exact_opt.step()
    lrs = [group["lr"] for group in exact_opt.param_groups for _ in group["params"]]
    for p, q, x, lr in zip(fused, ref, exact, lrs):
        assert {k: v.dtype for k, v in opt.state[p].items()} == {k: v.dtype for k, v in ref_opt.state[q].items()}
        assert opt.state[p]["orth_ema"].dtype == torch.float32 and opt.state[p]["exp_avg"].dtype == dtype
        torch.testing.assert_close(opt.state[p]["orth_ema"], ref_opt.state[q]["orth_ema"], rtol=1e-5, atol=1e-6)
        bound = STEPS * (_ulp(x.detach().to(dtype)) + 0.1 * lr)
        assert ((p.detach().double() - x.detach()).abs() <= bound).all(), "fused step"
        if dtype == torch.bfloat16:  # fp16's reference step overflows where eps underflows: no yardstick
            assert ((q.detach().double() - x.detach()).abs() <= bound).all(), "reference step"


@needs_triton
@in_interpreter
def test_bench_times_the_fused_step():
    """`raystream bench`'s optimizer timing lists the fused step beside the eager one and torch's AdamW where it runs
    (here: the interpreter), and reports that its steps ran fused."""
    from omegaconf import OmegaConf

    from raystream.bench.optimizer_timing import time_optimizers
    from raystream.bench.trainee import Budget
    from raystream.optim.factory import OptimizerConfig

    params = _params(torch.float32)
    cfg = OmegaConf.structured(OptimizerConfig(compile=False))
    ms, skipped, ran = time_optimizers([{"params": params}], cfg, warmup=2, steps=1, budget=Budget(300),
                                       with_compiled=False)
    assert {"orthogonal_adamw", "orthogonal_adamw_eager", "adamw_fused"} <= set(ms), (ms, skipped)
    assert ran["orthogonal_adamw"].startswith("ran fused (Triton")


@needs_triton
@in_interpreter
def test_a_layout_it_cannot_take_falls_back_to_the_eager_step_once_said(capfd):
    """A non-contiguous parameter (a transposed view): by default the step says why once and runs the multi-tensor
    step, now and from then on, with the same result; triton=True raises instead, before changing anything."""
    def make():
        gen = torch.Generator().manual_seed(0)
        return [torch.nn.Parameter(torch.randn(5, 7, generator=gen).t()),
                torch.nn.Parameter(torch.randn(4, generator=gen))]

    fused, eager = make(), make()
    opt, ref = OrthogonalAdamW(fused), OrthogonalAdamW(eager, triton=False)
    for grads in correlated_gradients([(7, 5), (4,)], 3):
        for o, ps in ((opt, fused), (ref, eager)):
            for p, g in zip(ps, grads):
                p.grad = g.float()
            o.step()
    for a, b in zip(fused, eager):
        assert torch.equal(a, b)
    assert "contiguous" in opt.fused_step.eager_reason and opt.fused_step.steps == 0
    assert capfd.readouterr().err.count("fused Triton step could not be built") == 1

    strict = make()
    opt = OrthogonalAdamW(strict, triton=True)
    before = [p.detach().clone() for p in strict]
    for p in strict:
        p.grad = torch.ones_like(p)
    with pytest.raises(KernelBuildError, match="contiguous"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(strict, before)) and opt.state[strict[0]]["step"].item() == 0


def _benchmark_script():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import optimizer_step
    finally:
        sys.path.pop(0)
    return optimizer_step


@needs_triton
def test_benchmark_script_times_the_fused_rows_where_triton_runs():
    """benchmarks/optimizer_step.py (what a GPU machine runs, on CUDA) times the Triton rows beside the multi-tensor
    step and torch's AdamW, through the same timing code as on CUDA; where Triton does not run (a CPU outside the
    interpreter) it lists them as not timed, saying why."""
    bench = _benchmark_script()
    labels = ["AdamW foreach", "AdamW fused", "OrthogonalAdamW global", "OrthogonalAdamW Triton global",
              "OrthogonalAdamW Triton per_tensor"]
    # one unmeasured round and one measured: each of the interpreter's fused steps of vit_tiny costs half a second
    rows, skipped = bench.bench_model("vit_tiny", torch.device("cpu"), steps=1, warmup=1, memory=False,
                                      labels=labels)
    timed = {r["optimizer"]: r for r in rows}
    if interpreting():
        assert set(timed) == set(labels) and not skipped
        assert timed["OrthogonalAdamW Triton global"]["ran"] == "ran fused (Triton, 2 steps)"
        assert timed["OrthogonalAdamW global"]["ran"] == ""
    else:
        assert set(timed) == set(labels[:3])
        assert set(skipped) == set(labels[3:]) and "Triton runs the fused step on CUDA" in skipped[labels[3]]


@needs_triton
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_kernels_compile_for_a_hopper_gpu_with_vector_loads():
    """Triton's real compiler (no GPU needed) builds every kernel for sm_90 (the H200), and the blocks that lie wholly
    inside their tensor load and store 16 bytes at a time (PTX ld/st.global.v4): the interpreter checks the maths,
    this the code a GPU runs."""
    if interpreting():
        pytest.skip("the interpreter's kernels are not compiled")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from raystream.optim import triton_kernels as K

    def ptx(fn, signature, constexprs, aligned):
        signature = {**signature, **{name: "constexpr" for name in constexprs}}
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(aligned)}  # as Triton marks aligned pointers
        src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]

    tables = {"block_tensor": "*i32", "block_start": "*i64", "numel": "*i64"}
    dots = ptx(K.dots_kernel, {"p_base": "*fp32", "c_base": "*fp32", "g_off": "*i64", "c_off": "*i64", **tables,
                               "partial": "*fp32", "block0": "i32"}, {"VEC_P": 4, "VEC_C": 4, "BLOCK": 2048}, 8)
    assert dots.count("ld.global.v4") >= 2
    for p_type, vec in (("*fp32", 4), ("*bf16", 8), ("*fp16", 8)):
        update = ptx(K.update_kernel, {
            "p_base": p_type, "c_base": "*fp32", **{n: "*i64" for n in ("p_off", "g_off", "c_off", "m_off", "v_off")},
            "step_size": "*fp64", "inv_bc2": "*fp64", **tables, "k": "*fp32", "uu": "*fp32", "block0": "i32",
            "first": "i32", **{n: "fp32" for n in ("decay", "beta1", "beta2", "eps", "ema_weight")}},
            {"PER_TENSOR": True, "MAXIMIZE": True, "WITH_UU": True, "VEC_P": vec, "VEC_C": 4, "BLOCK": 2048}, 15)
        # g, theta, m, v and c (two vectors of fp32 for 8 elements of a half type) in, theta, m, v, c out
        assert update.count("ld.global.v4") >= 5 and update.count("st.global.v4") >= 4, p_type
    ptx(K.segment_kernel, {"partial": "*fp32", "first_block": "*i64", "blocks": "*i64", "out": "*fp32"},
        {"CHUNK": 256}, 4)


@needs_triton
@in_interpreter
@pytest.mark.parametrize("projection", ["global", "per_tensor"])
def test_schedules_and_a_reset_ema_reach_the_fused_step(projection):
    """lr, weight decay and orth_beta moved between steps (schedules), and the EMA dropped mid-run (a video
    boundary: new EMA tensors, a step without projection): the fused step follows, as the reference does."""
    runs = []
    for triton, foreach in ((True, None), (False, False)):
        params = _params(torch.float32)
        opt = OrthogonalAdamW(_groups(params), projection=projection, triton=triton, foreach=foreach)
        for i, grads in enumerate(correlated_gradients(SHAPES, 6)):
            opt.param_groups[0]["lr"] = 0.01 * (1 + i) / 6
            opt.param_groups[0]["weight_decay"] = 0.1 * (6 - i) / 6
            opt.param_groups[1]["orth_beta"] = 0.5 + 0.05 * i
            if i == 3:
                opt.reset_orthogonal_state()
            for p, g in zip(params, grads):
                p.grad = g.float()
            opt.step()
        runs.append(params)
        if triton:
            assert opt.fused_step.summary() == "ran fused (Triton, 6 steps)"
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-7)


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("projection", ["global", "per_tensor"])
def test_on_cuda_the_default_is_the_fused_step_and_matches_the_reference(projection):
    """On a GPU (Triton's compiled kernels, not the interpreter): OrthogonalAdamW() runs the fused step by default
    and agrees with Algorithm 2's reference; bf16 parameters within rounding of it."""
    if interpreting():
        pytest.skip("the interpreter's kernels are not compiled")
    for dtype, tol in ((torch.float32, dict(rtol=2e-6, atol=2e-7)), (torch.bfloat16, dict(rtol=0.0, atol=0.05))):
        runs = []
        for foreach in (None, False):
            params = [torch.nn.Parameter(p.detach().cuda()) for p in _params(dtype)]
            opt = OrthogonalAdamW(_groups(params), projection=projection, foreach=foreach, diagnostics=True)
            for grads in correlated_gradients(SHAPES, STEPS):
                for p, g in zip(params, grads):
                    p.grad = g.to(device="cuda", dtype=dtype)
                opt.step()
            runs.append(params)
            if foreach is None:
                assert opt.fused_step.summary() == f"ran fused (Triton, {STEPS} steps)"
        for a, b in zip(*runs):
            torch.testing.assert_close(a.float(), b.float(), **tol)
