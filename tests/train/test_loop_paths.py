"""The loop's other ends. Through the real loop (Ray Train, 1 worker, real MLflow): a diverging run (under bf16
autocast) stops at its first non-finite step with no retry and a FAILED MLflow run; the compiled optimizer trains
like the stock one. Through the worker's step in this process: the bf16 autocast path runs on CPU when asked for,
keeping the parameters and the optimizer's state fp32. Plus the pieces they rest on, without Ray."""

import math
import re
import time
import warnings
from pathlib import Path

import pytest
import torch

from raystream.tracking import client as make_client
from raystream.train.divergence import DivergedError, check_finite, raise_if_diverged
from raystream.train.step import autocast_for
from raystream.train.worker import typed_config


def test_check_finite_names_the_step_and_the_value():
    check_finite(3, {"loss": 0.5, "gradient norm": 12.0})
    with pytest.raises(DivergedError, match=r"^loss is nan at step 17") as info:
        check_finite(17, {"loss": math.nan, "gradient norm": 1.0})
    assert info.value.step == 17
    with pytest.raises(DivergedError, match=r"^gradient norm is inf at step 4"):
        check_finite(4, {"loss": 1.0, "gradient norm": math.inf})
    raise_if_diverged({"loss": 1.0})
    with pytest.raises(DivergedError, match="at step 2"):
        raise_if_diverged({"diverged": "loss is inf at step 2", "diverged_step": 2})


def test_bf16_autocast_is_on_gpu_by_default_and_anywhere_when_asked(tiny):
    cfg = tiny()
    assert cfg.trainer.bf16 is None  # null: on GPU only
    assert not isinstance(autocast_for(cfg.trainer, torch.device("cpu"))(), torch.autocast)
    with warnings.catch_warnings():  # "CUDA is not available": the context is built, not entered
        warnings.simplefilter("ignore")
        assert isinstance(autocast_for(cfg.trainer, torch.device("cuda"))(), torch.autocast)
    on_cpu = autocast_for(tiny("trainer.bf16=true").trainer, torch.device("cpu"))()
    assert isinstance(on_cpu, torch.autocast) and on_cpu.fast_dtype == torch.bfloat16
    assert not isinstance(autocast_for(tiny("trainer.bf16=false").trainer, torch.device("cuda"))(), torch.autocast)


def test_worker_config_is_typed_with_the_run_schema(tiny):
    from omegaconf import OmegaConf

    from raystream.optim.factory import OptimizerConfig

    cfg = typed_config(OmegaConf.to_container(tiny("optimizer.lr=0.25"), resolve=True))
    assert OmegaConf.get_type(cfg.optimizer) is OptimizerConfig and cfg.optimizer.lr == 0.25
    with pytest.raises(Exception, match="lrr"):
        cfg.optimizer.lrr  # a typo is an error, not a default


def first_loss_in_fp32(cfg) -> float:
    """Step 0's loss of a run of `cfg` in fp32: the seeded model on the stream's first batch, as the loop builds
    them."""
    from raystream.data import build_stream
    from raystream.models import build_scenario
    from raystream.train.worker import seed_everything

    seed_everything(cfg.trainer.seed)
    scenario = build_scenario(cfg.scenario, cfg.stream, seed=cfg.trainer.seed)
    stream = build_stream(cfg.data, cfg.stream)
    try:
        return float(scenario.model(next(iter(stream)).model_inputs())["loss"].detach())
    finally:
        stream.close()


@pytest.mark.slow
def test_diverging_run_fails_at_its_step_without_retry(ray_cluster, tiny, workdir, capsys):
    """A diverging run through Ray Train stops at its first non-finite step with no retry (max_failures 3) and a
    FAILED MLflow run. It trains under bf16 autocast (trainer.bf16=true on CPU), so the bf16 path runs through Ray
    Train too: its step 0, taken before any update, has fp32's loss up to bf16 rounding, and not fp32's exactly."""
    from raystream.train.commands import main

    cfg = tiny("trainer.num_workers=1", "trainer.max_failures=3", "optimizer.lr=1e6", "optimizer.warmup_steps=0",
               "trainer.bf16=true", "trainer.run_name=diverged")
    t0 = time.perf_counter()
    assert main(cfg) == 1
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    found = re.search(r"(loss|gradient norm) is (nan|inf|-inf) at step (\d+)", err)
    assert found, err
    assert "FAILED" in err and "Retry" not in err and "TrainingFailedError" not in err
    step = int(found.group(3))
    assert 1 <= step < 6
    client = make_client(workdir["mlflow"])
    run = client.search_runs([client.get_experiment_by_name("train-tests").experiment_id],
                             filter_string="tags.`raystream.run_name` = 'diverged'")[0]
    assert run.info.status == "FAILED"
    assert found.group(0) in run.data.tags["raystream.error"] and run.data.tags["raystream.status"] == "diverged"
    # the steps before it are recorded, the diverged one is not; no checkpoint holds a diverged state
    losses = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    assert [m.step for m in losses] == list(range(step))
    ckpts = sorted(p.name for p in (Path(workdir["storage"]) / "diverged").glob("checkpoint_0*"))
    assert all(int(name.split("_")[1]) <= step for name in ckpts)
    fp32 = first_loss_in_fp32(tiny())
    assert losses[0].value != fp32 and losses[0].value == pytest.approx(fp32, rel=2e-2)  # bf16 in the Ray worker
    print(f"diverged at step {step}, run ended after {elapsed:.1f} s")


def test_bf16_autocast_runs_on_cpu_through_the_workers_step(tiny):
    """trainer.bf16=true on CPU, through the worker's step taken in this process (raystream/bench/trainee.py: the
    model, optimizer, schedules and shard a worker builds from the config it is sent, re-typed as a worker does;
    that the Ray worker takes bf16 from its config is test_diverging_run_fails_at_its_step_without_retry's): the
    forward runs under bf16 autocast (the first loss differs from fp32's by bf16 rounding only), the loss stays
    finite over 3 steps, the parameters and the optimizer's state stay fp32."""
    import itertools

    from omegaconf import OmegaConf

    from raystream.bench.trainee import Trainee, build_host_stream

    cfg = typed_config(OmegaConf.to_container(tiny("trainer.num_workers=1", "trainer.bf16=true",
                                                   "trainer.max_steps=3"), resolve=True))
    trainee = Trainee.build(cfg, torch.device("cpu"), total_steps=3)
    assert isinstance(trainee.autocast(), torch.autocast)
    stream = build_host_stream(cfg, 3)
    try:
        losses = [trainee.step(batch) for batch in itertools.islice(stream.batches(), 3)]
    finally:
        stream.close()
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    fp32 = first_loss_in_fp32(tiny())
    assert losses[0] != fp32 and losses[0] == pytest.approx(fp32, rel=2e-2)

    model_state = trainee.model.state_dict()  # what a checkpoint's model.pt holds
    assert {v.dtype for v in model_state.values() if v.is_floating_point()} == {torch.float32}
    state = trainee.optimizer.state_dict()["state"]  # and its train_state.pt's optimizer
    dtypes = {k: v.dtype for s in state.values() for k, v in s.items() if torch.is_tensor(v) and v.is_floating_point()
              and v.dim() > 0}
    assert {"exp_avg", "exp_avg_sq", "orth_ema"} <= set(dtypes) and set(dtypes.values()) == {torch.float32}


@pytest.mark.slow
def test_compiled_optimizer_trains_like_the_stock_one(ray_cluster, tiny, workdir, capsys):
    """`optimizer.compile=true` through the real loop (Ray Train, 1 worker: schedules, clipping, checkpoints,
    diagnostics): the same losses, to fp32 rounding, as the stock-op step. The stock losses come from the worker's
    step taken in this process (raystream/bench/trainee.py: the model, optimizer, schedules and shard a worker
    builds, `forward_backward` and `optimizer_update`), which gives a stock Ray Train run's losses to fp32 rounding,
    without a second Ray Train run. On the session's cluster the worker's torch.compile traces the step whole and
    runs it with `aot_eager` (tests/ray_env.py `SESSION_CLUSTER_ENV`): inductor's C++ build of the same step, which
    was most of this test's time, is tests/optim/test_optim_compiled.py's."""
    import itertools

    from raystream.bench.trainee import Trainee, build_host_stream
    from raystream.train.commands import main

    assert main(tiny("trainer.num_workers=1", "optimizer.compile=true", "trainer.run_name=compiled")) == 0
    final = Path(workdir["storage"]) / "compiled" / "checkpoint_00000006"
    assert f"  checkpoint  {final}\n" in capsys.readouterr().out  # `raystream train`'s summary names it
    client = make_client(workdir["mlflow"])
    run = client.search_runs([client.get_experiment_by_name("train-tests").experiment_id],
                             filter_string="tags.`raystream.run_name` = 'compiled'")[0]
    assert run.info.status == "FINISHED"
    compiled = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)]

    cfg = tiny("trainer.num_workers=1")
    trainee = Trainee.build(cfg, torch.device("cpu"), total_steps=int(cfg.trainer.max_steps))
    assert cfg.optimizer.compile == "auto" and trainee.optimizer.compile is False  # a tiny model: auto stays eager
    stream = build_host_stream(cfg, int(cfg.trainer.max_steps))
    try:
        stock = [trainee.step(batch) for batch in itertools.islice(stream.batches(), int(cfg.trainer.max_steps))]
    finally:
        stream.close()
    assert len(compiled) == len(stock) == 6
    assert compiled == pytest.approx(stock, rel=1e-4)
