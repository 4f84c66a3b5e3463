"""OrthogonalAdamW(compile=True) (raystream/optim/multi_tensor_step.py): the same steps as Algorithm 2's reference and as the
stock-op path, no recompilation when the schedules move lr and weight decay, no host sync, checkpoints that either
path resumes, clear errors where it cannot run, and a recompile or a fallback to eager said once. The tests of this
module compile many graphs of the step in one process: the product's own recompile limit (RECOMPILE_LIMIT) has to
hold them all."""

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile

from optim_reference import ReferenceOptimizer, correlated_gradients
from raystream.optim import OrthogonalAdamW

SHAPES = [(6, 4), (4,), (3, 2, 2), (5, 3)]
SYNCS = ("aten::item", "aten::_local_scalar_dense")


def _params(shapes=SHAPES, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=dtype)) for s in shapes]


def _groups(params, beta):
    g0 = dict(lr=0.05, weight_decay=0.1, orth_beta=beta, betas=(0.9, 0.999), eps=1e-8)
    g1 = dict(lr=0.02, weight_decay=0.0, orth_beta=beta / 2, betas=(0.8, 0.99), eps=1e-8)
    return [dict(params=params[:2], **g0), dict(params=params[2:], **g1)], [g0, g0, g1, g1]


def _step(opt, params, grads):
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()


@pytest.mark.parametrize("projection", ["global", "per_tensor"])
@pytest.mark.parametrize("orth_init", ["zero", "first_grad"])
def test_compiled_step_matches_algorithm_2(projection, orth_init):
    params = _params()
    groups, hp = _groups(params, 0.9)
    opt = OrthogonalAdamW(groups, projection=projection, orth_init=orth_init, compile=True)
    ref = ReferenceOptimizer(params, hp, projection, orth_init, "adamw")
    for grads in correlated_gradients(SHAPES, 6):
        _step(opt, params, grads)
        ref.step(grads)
    for a, b in zip(params, ref.params):
        torch.testing.assert_close(a.detach(), b, rtol=1e-9, atol=1e-11)
    assert opt.compile_trace.summary() == "ran compiled (5 steps)"  # the first step builds the state


def test_schedules_and_maximize_match_the_stock_path_without_recompiling():
    """lr and weight decay change every step (warmup/cosine); one param group maximizes."""
    runs = []
    for compile in (False, True):
        params = _params(seed=1)
        groups, _ = _groups(params, 0.9)
        groups[1]["maximize"] = True
        opt = OrthogonalAdamW(groups, compile=compile, diagnostics=True)
        diags = []
        for t, grads in enumerate(correlated_gradients(SHAPES, 7, seed=2)):
            for group in opt.param_groups:
                group["lr"] *= 0.8
                group["weight_decay"] = 0.01 * t
            if compile and t == 2:
                graphs = counters["stats"]["unique_graphs"]  # the first compiled step has run
            _step(opt, params, grads)
            diags.append({k: float(v) for k, v in opt.diagnostics().items()})
        runs.append((params, diags))
    assert counters["stats"]["unique_graphs"] == graphs and opt.compile_trace.eager == 0
    (p1, d1), (p2, d2) = runs
    for a, b in zip(p1, p2):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-9, atol=1e-11)
    for a, b in zip(d1[1:], d2[1:]):
        assert a == pytest.approx(b, rel=1e-9)


def test_a_checkpoint_resumes_on_either_path_and_after_a_reset():
    seq = correlated_gradients(SHAPES, 8, seed=3)
    params = _params(seed=4)
    opt = OrthogonalAdamW(params, lr=0.05, compile=True)
    for grads in seq[:4]:
        _step(opt, params, grads)
    saved = ({i: p.detach().clone() for i, p in enumerate(params)}, opt.state_dict())
    assert set(saved[1]["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "orth_ema"}
    owned = [t.untyped_storage().nbytes() == t.numel() * t.element_size() for s in opt.state.values()
             for t in s.values()]
    assert all(owned)  # every state tensor, step counters included, is a tensor of its own (no views)
    finals = []
    for compile in (True, False):
        resumed = _params(seed=4)
        with torch.no_grad():
            for i, p in enumerate(resumed):
                p.copy_(saved[0][i])
        opt2 = OrthogonalAdamW(resumed, lr=0.05, compile=compile)
        opt2.load_state_dict(copy.deepcopy(saved[1]))  # as read from a checkpoint file
        for t, grads in enumerate(seq[4:]):
            if t == 2:
                opt2.reset_orthogonal_state()  # a video boundary: one unprojected step, then compiled again
            _step(opt2, resumed, grads)
        finals.append(resumed)
    for a, b in zip(*finals):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-9, atol=1e-11)


def _profile(n):
    params = _params([(3 + i % 4, 2 + i % 3) for i in range(n)], dtype=torch.float32)
    opt = OrthogonalAdamW(params, compile=True, diagnostics=True)
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            opt.step()
    assert any(e.name.startswith("Torch-Compiled Region") for e in prof.events())  # the compiled step ran
    assert opt.compile_trace.eager == 0
    names = [e.name for e in prof.events() if e.name.startswith("aten::")
             and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    return len(names), [n for n in names if n in SYNCS]


def test_compiled_step_dispatches_the_same_ops_for_any_number_of_tensors_and_never_syncs():
    """4 and 12 tensors: an op per tensor outside the compiled region would show as 8 more. Each count is a graph of
    its own, compiled to C++ from a cold cache on CI: the fewer tensors, the less to compile."""
    (ops_few, syncs_few), (ops_many, syncs_many) = _profile(4), _profile(12)
    assert ops_few == ops_many
    assert syncs_few == syncs_many == []


@pytest.mark.parametrize("kwargs, expected", [
    (dict(projection="dim0"), "projection='dim0'"),
    (dict(foreach=False), "foreach=False"),
    (dict(fused=False), "fused=False"),
])
def test_settings_the_compiled_step_cannot_take_are_named(kwargs, expected):
    with pytest.raises(ValueError, match="Invalid compile") as err:
        OrthogonalAdamW(_params(), compile=True, **kwargs)
    assert expected in str(err.value)


def test_half_precision_parameters_are_refused_with_the_remedy():
    with pytest.raises(ValueError, match="bfloat16.*autocast"):
        OrthogonalAdamW(_params(dtype=torch.bfloat16), compile=True)


def test_a_missing_compiler_says_how_to_run_without_one(tmp_path):
    """Inductor needs a C++ compiler on CPU: without one the second step (the first compiled one) fails with the
    setting to change, not inductor's traceback, and leaves parameters and state as they were."""
    code = textwrap.dedent("""
        import torch, torch._inductor.config as c
        from raystream.optim import OrthogonalAdamW
        c.cpp.cxx = ("/nonexistent/c++",)
        p = torch.nn.Parameter(torch.randn(4, 3))
        opt = OrthogonalAdamW([p], compile=True)
        p.grad = torch.randn(4, 3)
        opt.step()
        before = {k: v.clone() for k, v in opt.state[p].items()}, p.detach().clone()
        try:
            opt.step()
        finally:  # the failed step changed nothing
            assert all(torch.equal(before[0][k], v) for k, v in opt.state[p].items()) and torch.equal(before[1], p)
    """)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: OrthogonalAdamW(compile=True)") and "optimizer.compile=false" in last


def test_a_torch_whose_compile_takes_no_recompile_limit_gets_the_process_wide_one(tmp_path):
    """torch.compile took no `recompile_limit` before torch 2.13 (the GPU machine's 2.11, 2026-11-27: a TypeError
    stopped every compiled step there). Given such a torch.compile (the real one behind 2.11's signature, dynamo's
    eager backend to keep it fast), the step compiles and raises dynamo's process-wide limit to the product's."""
    code = textwrap.dedent("""
        import torch
        stock = torch.compile
        def compile_of_torch_2_11(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None,
                                  options=None, disable=False):
            return stock(model, fullgraph=fullgraph, dynamic=dynamic, backend="eager", disable=disable)
        torch.compile = compile_of_torch_2_11
        from raystream.optim import OrthogonalAdamW
        from raystream.optim.base import RECOMPILE_LIMIT
        p = torch.nn.Parameter(torch.ones(4, 3))
        opt = OrthogonalAdamW([p], lr=0.05, compile=True)
        for _ in range(3):
            p.grad = torch.randn(4, 3)
            opt.step()
        print(opt.compile_trace.summary(), torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT)
    """)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == "ran compiled (2 steps) True"


@pytest.mark.slow  # two graphs traced by dynamo in a fresh process
def test_a_recompile_and_a_fallback_to_eager_are_said_once(tmp_path):
    """A changed beta compiles the step again: said once, with dynamo's reason. Past the recompile limit (2 here, in
    a process of its own) the step runs eagerly, said once, and still moves the parameters as the stock step.
    Recompiles, their reasons and the limit are dynamo's (its guards), whatever backend compiles each graph: dynamo's
    eager backend here (torch's per-graph override, TORCH_COMPILE_OVERRIDE_BACKENDS) spares two cold inductor
    compilations to C++ (most of a minute of CPU); the inductor-compiled step's figures are checked in this process by
    the tests above."""
    code = textwrap.dedent("""
        import torch
        import raystream.optim.base as compiled
        from raystream.optim import OrthogonalAdamW
        compiled.RECOMPILE_LIMIT = 2
        runs = []
        for compile in (True, False):
            gen = torch.Generator().manual_seed(0)
            p = torch.nn.Parameter(torch.randn(4, 3, generator=gen))
            opt = OrthogonalAdamW([p], lr=0.05, compile=compile)
            for beta1 in (0.9, 0.9, 0.8, 0.8, 0.7, 0.7, 0.6):  # 1 state, 2 graphs, then eager
                opt.param_groups[0]["betas"] = (beta1, 0.999)
                p.grad = torch.randn(4, 3, generator=gen)
                opt.step()
            runs.append(p.detach().clone())
            if compile:
                print("TRACE", opt.compile_trace.summary())
        torch.testing.assert_close(runs[0], runs[1], rtol=1e-5, atol=1e-6)
    """)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "TORCH_COMPILE_OVERRIDE_BACKENDS": ">=0:eager"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    said = [line for line in out.stderr.splitlines() if line.startswith("raystream: WARNING: OrthogonalAdamW")]
    assert len(said) == 2, out.stderr[-3000:]
    print("\n".join(said))
    assert "compiled its step again (" in said[0] and "not recorded" not in said[0], said[0]  # with dynamo's reason
    assert "runs its step eagerly" in said[1] and "recompile limit (2" in said[1], said[1]
    assert "TRACE ran eagerly in 3 of 6 steps: torch.compile hit its recompile limit (2" in out.stdout, out.stdout
