"""A tiny model learns on a few hundred steps of the real demo stream (raystream.data: mp4s decoded by decord).

The stream is correlated (batches along time), so the per-step loss follows the content; the test measures the
loss on fixed batches of the stream (same steps, same masks) before and after one pass of training.
"""

import pytest
import torch

from raystream.data import build_heldout_stream, build_stream
from raystream.data.config import DataConfig, DemoConfig, StreamConfig
from raystream.eval.config import EvalConfig
from raystream.eval.labelled_videos import load_probe_set
from raystream.models import build_scenario
from scenario_helpers import tiny_cfg, train_on_stream



@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    cache = tmp_path_factory.mktemp("demo")
    return DataConfig(demo=DemoConfig(num_videos=4, frames_per_video=420, cache_dir=str(cache)))


def _first(stream, step):
    batches = stream.batches(start_step=step)
    try:
        return next(batches).model_inputs()
    finally:
        batches.close()  # stop its prefetching


def _fixed_loss(model, batches, key):
    with torch.no_grad():
        return sum(float(model(b)[key]) for b in batches) / len(batches)


@pytest.mark.slow  # training runs (tens of seconds each on a shared CPU)
@pytest.mark.parametrize("name, target_frames, epochs, min_steps, key, factor", [
    ("videomae", 0, 2, 200, "loss", 0.8),
    ("future_prediction", 4, 1, 90, "in_stream/mse", 0.5),
])
def test_tiny_model_learns_on_the_demo_stream(demo_data, name, target_frames, epochs, min_steps, key, factor):
    stream_cfg = StreamConfig(batch_size=8, target_frames=target_frames, epochs=epochs)
    torch.manual_seed(0)
    scenario = build_scenario(tiny_cfg(name, decoder_depth=1 if name == "videomae" else 2,
                                       norm_pix_loss=name == "videomae"), stream_cfg, seed=0)
    model = scenario.model
    stream = build_stream(demo_data, stream_cfg)
    try:
        n = stream.num_steps
        assert n >= min_steps
        fixed = [_first(stream, s) for s in (0, n // 4, n // 2, 3 * n // 4)]
        before = _fixed_loss(model, fixed, key)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        in_stream = train_on_stream(scenario, stream, opt, key)
    finally:
        stream.close()
    after = _fixed_loss(model, fixed, key)
    assert len(in_stream) == stream.num_steps
    assert after < factor * before, (before, after)
    eval_cfg = EvalConfig(metrics=["knn", "linear", "attentive"], attentive_epochs=5, heldout_batches=4)
    if "probe" in scenario.needs:
        metrics = scenario.evaluate(model, eval_cfg, probe=load_probe_set(demo_data, stream_cfg, eval_cfg))
        assert set(metrics) == {"eval/knn_top1", "eval/linear_top1", "eval/attentive_top1"}
        print(metrics)
    if "heldout" in scenario.needs:
        heldout = build_heldout_stream(demo_data, stream_cfg)
        try:
            metrics = scenario.evaluate(model, eval_cfg, heldout=heldout.batches())
        finally:
            heldout.close()
        print(metrics, sum(in_stream) / len(in_stream))
        assert 0 < metrics["eval/mse_out_of_stream"] < before
