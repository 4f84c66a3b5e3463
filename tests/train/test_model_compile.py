"""`trainer.compile`: the model's ViT blocks compiled regionally (raystream/models/vit.py `compile_blocks`), in the
worker a run builds (raystream/train/worker.py) and in `raystream bench`'s trainee, which takes the worker's step
in this process without Ray. The compiled model trains to the eager one's losses; one graph serves every block of
a shape; a bad value is named before anything runs."""

import itertools

import pytest
import torch
from omegaconf import OmegaConf

from raystream.config import ConfigError, compose
from raystream.models.vit import blocks_of, compile_blocks, compile_wanted
from raystream.train.worker import Worker, typed_config

STEPS = 3


def _losses(cfg):
    """The losses of the worker's first STEPS steps (its model, optimizer, schedules and shard, built as a worker
    builds them, through raystream/bench/trainee.py), and the trainee."""
    from raystream.bench.trainee import Trainee, build_host_stream

    trainee = Trainee.build(cfg, torch.device("cpu"), total_steps=STEPS)
    stream = build_host_stream(cfg, STEPS)
    try:
        return [trainee.step(batch) for batch in itertools.islice(stream.batches(), STEPS)], trainee
    finally:
        stream.close()


def test_a_compiled_model_trains_to_the_eager_losses(tiny):
    """trainer.compile=true on a CPU (inductor, C++): the same losses over 3 steps as eager, to rel 1e-4 (fp32: the
    compiled kernels sum in another order, a few ulps a step that the updates carry on), the same parameter names
    (a checkpoint of either loads into the other), and one compiled graph per block shape, not one per block."""
    from torch._dynamo.utils import counters

    def cfg(setting):
        return typed_config(OmegaConf.to_container(tiny("trainer.num_workers=1", "scenario.backbone.depth=3",
                                                        f"trainer.compile={setting}"), resolve=True))

    eager, plain = _losses(cfg("false"))
    assert not any(b._compiled_call_impl for b in blocks_of(plain.model))
    counters.clear()
    compiled, trainee = _losses(cfg("true"))
    blocks = blocks_of(trainee.model)
    assert len(blocks) >= 4 and all(b._compiled_call_impl is not None for b in blocks)  # encoder 3, decoder
    shapes = {(b.norm1.normalized_shape, b.attn.num_heads) for b in blocks}
    assert counters["stats"]["unique_graphs"] == len(shapes) < len(blocks), dict(counters["stats"])
    assert compiled == pytest.approx(eager, rel=1e-4)
    print(f"eager {eager}, compiled {compiled}; {len(blocks)} blocks, {len(shapes)} graphs")
    assert list(trainee.model.state_dict()) == list(plain.model.state_dict())
    assert compile_blocks(trainee.model, False) == len(blocks)  # and back to eager
    assert not any(b._compiled_call_impl for b in blocks)


@pytest.mark.parametrize("setting, compiled", [("true", True), ("auto", False), ("false", False)])
def test_the_worker_compiles_its_blocks_as_trainer_compile_says(tiny, workdir, setting, compiled):
    """The worker a run builds (Worker.assemble, rank 0 of one, on the CPU): true compiles every block (before DDP
    would wrap the model), auto leaves a CPU's eager (it compiles on CUDA only), false never."""
    cfg = tiny("trainer.num_workers=1", f"trainer.compile={setting}")
    run = {"run_name": "compile", "total_steps": 2, "tracking_uri": workdir["mlflow"], "mlflow_run_id": None}
    w = Worker.assemble(cfg, run, 0, 1, torch.device("cpu"), lambda model: model)
    try:
        blocks = blocks_of(w.model)
        assert blocks and all((b._compiled_call_impl is not None) == compiled for b in blocks)
    finally:
        w.stream.close()
    assert compile_wanted("auto", torch.device("cuda")) and not compile_wanted("auto", torch.device("cpu"))


@pytest.mark.parametrize("value", ["maybe", "1", "on"])
def test_a_bad_trainer_compile_is_named_before_anything_runs(value):
    with pytest.raises(ConfigError, match=r"trainer\.compile.*true, false or auto"):
        compose([f"trainer.compile={value}"])
    with pytest.raises(ValueError, match=r"trainer\.compile = 'maybe': expected true, false or auto"):
        compile_wanted("maybe", torch.device("cpu"))
