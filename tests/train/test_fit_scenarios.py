"""Every scenario trains through Ray Train with 2 DDP workers and reports its evaluations (issue 5: `raystream train`
works for every scenario). VideoMAE is covered at length in test_fit.py, future prediction by the 2-worker regime run
of tests/train/test_correlation.py (its figures, steps and evaluations); this is DoRA's, 3 steps."""

import math

import pytest

from raystream.train.run import fit

pytestmark = pytest.mark.slow

SMALL_DEMO = ["data.demo.num_videos=2", "data.demo.frames_per_video=120", "eval.max_probe_samples=70",
              "eval.probe_epochs=5", "eval.heldout_batches=2"]


@pytest.mark.parametrize("scenario, extra, expected", [
    ("dora", ["data=walking_tour", "eval.metrics=[knn,linear]"],
     ["eval/knn_top1", "eval/linear_top1"]),
])
def test_scenario_trains_on_two_workers_and_reports_its_evaluations(ray_cluster, tiny, workdir, scenario, extra,
                                                                     expected):
    cfg = tiny(f"scenario={scenario}", "trainer=ddp2", "trainer.max_steps=3", "trainer.checkpoint_every=3",
               f"trainer.run_name=scenario-{scenario}", f"data.demo.cache_dir={workdir['dir'] / 'demo'}",
               *SMALL_DEMO, *extra)
    result = fit(cfg)
    assert result["steps_done"] == 3
    assert math.isfinite(result["loss"])
    for key in expected:
        assert key in result and math.isfinite(result[key]), (key, sorted(result))
