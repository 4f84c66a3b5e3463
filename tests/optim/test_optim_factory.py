"""build_optimizer: every optimizer name, and every shipped optimizer preset composes and builds what it says."""

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from raystream.optim import Orthogonal, OrthogonalAdamW, OrthogonalSGD, SlowerAdamW, build_optimizer, param_groups
from raystream.optim.factory import NAMES, OptimizerConfig
from raystream.optim.factory import compile_choice

PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "sweeps" / "optimizer").glob("*.yaml"))


@pytest.mark.parametrize("name, cls", [
    ("adamw", torch.optim.AdamW), ("sgd", torch.optim.SGD), ("orthogonal_adamw", OrthogonalAdamW),
    ("orthogonal_sgd", OrthogonalSGD), ("slower_adamw", SlowerAdamW), ("orthogonal_torch_adamw", Orthogonal),
])
def test_build_optimizer_by_name(name, cls):
    cfg = OptimizerConfig(name=name, lr=0.02, weight_decay=0.03, momentum=0.5, orth_beta=0.7, projection="per_tensor")
    opt = build_optimizer([torch.nn.Parameter(torch.ones(3))], cfg, diagnostics=True)
    assert type(opt) is cls
    group = opt.param_groups[0]
    assert group["lr"] == 0.02 and group["weight_decay"] == 0.03
    if name.startswith("orthogonal"):
        assert group["orth_beta"] == 0.7 and opt.projection == "per_tensor"
    if name in ("sgd", "orthogonal_sgd"):
        assert group["momentum"] == 0.5
    if name in ("orthogonal_adamw", "orthogonal_sgd", "slower_adamw", "orthogonal_torch_adamw"):
        assert set(opt.diagnostics()) == {"grad_cos_prev", "grad_cos_ema", "update_norm_ratio"}


def test_the_wrapped_torch_adamw_takes_the_same_steps_as_orthogonal_adamw():
    """`orthogonal_torch_adamw` (Orthogonal around torch's AdamW) and `orthogonal_adamw` give the same weights over
    a run's param groups (decayed and not), step after step: the optimizer ablation's check of one against the other."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    twin, start = copy.deepcopy(model), copy.deepcopy(model)
    opts = [build_optimizer(param_groups(m, cfg), cfg) for m, cfg in
            [(model, OptimizerConfig(name="orthogonal_adamw", lr=0.05, compile=False)),
             (twin, OptimizerConfig(name="orthogonal_torch_adamw", lr=0.05))]]
    for _ in range(6):
        x = torch.randn(8, 6)
        for m, opt in zip((model, twin), opts):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=n)
    assert (model[0].weight - start[0].weight).abs().min() > 1e-3  # every weight moved: the steps were taken


def test_unknown_name_is_named():
    with pytest.raises(ValueError, match="optimizer.name = 'lion'"):
        build_optimizer([torch.nn.Parameter(torch.ones(1))], OptimizerConfig(name="lion"))


def test_every_preset_composes_and_builds():
    from raystream.config import ConfigError, compose

    expected = {"adamw", "sgd", "orthogonal_adamw", "orthogonal_sgd", "slower_adamw", "orthogonal_adamw_official"}
    assert expected <= set(PRESETS)
    for preset in PRESETS:
        cfg = compose([f"optimizer={preset}"]).optimizer
        opt = build_optimizer([torch.nn.Parameter(torch.ones(4, 2))], cfg)
        assert opt.param_groups[0]["lr"] == cfg.lr
    official = compose(["optimizer=orthogonal_adamw_official"]).optimizer
    opt = build_optimizer([torch.nn.Parameter(torch.ones(4, 2))], official)
    assert isinstance(opt, OrthogonalAdamW) and (opt.projection, opt.orth_init) == ("dim0", "first_grad")
    paper = build_optimizer([torch.nn.Parameter(torch.ones(4, 2))], compose(["optimizer=orthogonal_adamw"]).optimizer)
    assert (paper.projection, paper.orth_init) == ("global", "zero")
    for bad, key in [("optimizer.betas=[0.9,1.0]", "optimizer.betas"), ("optimizer.eps=-1", "optimizer.eps"),
                     ("optimizer.momentum=-0.1", "optimizer.momentum")]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            compose([bad])


def test_every_declared_name_builds_and_only_this_package_has_diagnostics():
    for name in NAMES:
        opt = build_optimizer([torch.nn.Parameter(torch.ones(3))], OptimizerConfig(name=name), diagnostics=True)
        assert hasattr(opt, "diagnostics") == (type(opt).__module__.startswith("raystream.optim"))


def test_a_config_without_a_field_is_an_error_not_a_silent_default():
    """build_optimizer reads typed OptimizerConfig fields; it does not fill in defaults of its own."""
    partial = SimpleNamespace(name="orthogonal_adamw", lr=0.1, weight_decay=0.0, betas=[0.9, 0.999], eps=1e-8,
                              compile=False)
    with pytest.raises(AttributeError, match="orth_beta"):
        build_optimizer([torch.nn.Parameter(torch.ones(3))], partial)


def _groups(sizes, dtype=torch.float32):
    return [{"params": [torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n in sizes], "weight_decay": 0.0}]


def test_compile_auto_stays_eager_for_a_small_model_and_compiles_from_the_threshold_on(capsys):
    """The choice only (building the optimizer compiles nothing: torch.compile runs at the second step)."""
    small = build_optimizer(_groups([7, 5]), OptimizerConfig(compile="auto", compile_min_params=13))
    large = build_optimizer(_groups([7, 6]), OptimizerConfig(compile="auto", compile_min_params=13))
    again = build_optimizer(_groups([7, 6]), OptimizerConfig(compile="auto", compile_min_params=13))
    assert (small.compile, large.compile, again.compile) == (False, True, True)
    said = capsys.readouterr().err.splitlines()
    assert said == [  # the compiled choice once per process, with the reason and how to turn it off; eager unsaid
        "raystream: optimizer.compile=auto: Orthogonal-AdamW runs its compiled step (13 trainable parameters >= "
        "optimizer.compile_min_params=13; torch.compile builds it at the second step, about a minute on a CPU); "
        "optimizer.compile=false turns it off"]
    assert OptimizerConfig().compile == "auto"  # the default
    from_generator = build_optimizer(torch.nn.Linear(3, 2).parameters(), OptimizerConfig())  # counted, then built
    assert [p.shape for p in from_generator.param_groups[0]["params"]] == [(2, 3), (2,)]


@pytest.mark.parametrize("cfg, groups, expected", [
    (OptimizerConfig(compile=True, compile_min_params=10 ** 9), _groups([3]), (True, "optimizer.compile=true")),
    (OptimizerConfig(compile=False, compile_min_params=0), _groups([3]), (False, "optimizer.compile=false")),
    (OptimizerConfig(projection="dim0", compile_min_params=0), _groups([3]),
     (False, "projection=dim0 has no compiled step")),
    (OptimizerConfig(compile_min_params=0, compile_min_steps=100), _groups([3]),
     (False, "a run of 99 steps < optimizer.compile_min_steps=100: the compilation would not be paid back")),
    (OptimizerConfig(compile_min_params=0), _groups([3], torch.bfloat16),
     (False, "the compiled step takes fp32/fp64 parameters, not torch.bfloat16")),
])
def test_compile_true_and_false_are_kept_and_auto_stays_eager_where_there_is_no_compiled_step(cfg, groups, expected):
    assert compile_choice(groups, cfg, total_steps=99) == expected


def test_a_bad_compile_value_names_the_key_and_the_accepted_values():
    with pytest.raises(ValueError, match=r"optimizer.compile = 'maybe': expected true, false or auto"):
        compile_choice(_groups([3]), OptimizerConfig(compile="maybe"))


@pytest.mark.parametrize("value, expected", [("auto", None), (False, False)])
def test_optimizer_triton_reaches_orthogonal_adamw_and_the_cpu_step_is_the_multi_tensor_one(value, expected):
    """auto: the fused step where it runs (here, a CPU: the multi-tensor step); false: the multi-tensor step always."""
    opt = build_optimizer(_groups([3, 4]), OptimizerConfig(triton=value, compile=False))
    assert opt.triton is expected
    for group in opt.param_groups:
        for p in group["params"]:
            p.grad = torch.ones_like(p)
    opt.step()
    assert opt.fused_step.steps == 0 and opt.state[opt.param_groups[0]["params"][0]]["exp_avg"].abs().sum() > 0


def test_optimizer_triton_true_on_a_cpu_says_why_at_construction():
    with pytest.raises(ValueError, match=r"Invalid triton: True \(expected None or False here: parameters on cpu: "
                                         r"Triton runs the fused step on CUDA"):
        build_optimizer(_groups([3]), OptimizerConfig(triton=True, compile=False))
    with pytest.raises(ValueError, match=r"optimizer.triton = 'maybe': expected true, false or auto"):
        build_optimizer(_groups([3]), OptimizerConfig(triton="maybe", compile=False))
