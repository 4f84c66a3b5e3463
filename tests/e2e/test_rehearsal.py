"""The README's rehearsal of the paper experiments (section "At paper scale"): each of `+experiment=dora_paper`,
`videomae_paper` and `future_prediction_paper` at its own architecture, on the demo videos, 2 steps on the CPU
with the stream correlation measured by the worker, a checkpoint after step 0, a worker killed before step 1 and
restarted from that checkpoint (the resume), and one evaluation pass at the end.

The overrides and the experiments are read from the README's rehearsal block, so the command users are told to run
is the one tested. One local Ray cluster (tests/conftest.py) serves the three runs.
"""

import os
import re
import shlex
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from raystream.config import compose
from raystream.tracking import names
from raystream.tracking.store import client as make_client
from raystream.train import correlation

README = Path(__file__).parents[2] / "README.md"


def rehearsal_block():
    """(the experiments of the README's `for e in ...` loop, the overrides of its `REHEARSAL="..."` line)."""
    text = README.read_text()
    overrides = re.search(r'^REHEARSAL="([^"]+)"', text, re.M)
    loop = re.search(r"^for e in ([\w ]+); do\n\s+RAYSTREAM_FAIL_AT_STEP=1 raystream train \+experiment=\$e "
                     r"\$REHEARSAL trainer\.run_name=rehearsal-\$e", text, re.M)
    assert overrides and loop, "README: the rehearsal block (REHEARSAL=... and its for loop) is missing"
    where = ("trainer.storage_path=", "mlflow.tracking_uri=")  # the tests write into their own tmp dirs
    return loop.group(1).split(), [o for o in shlex.split(overrides.group(1)) if not o.startswith(where)]


EXPERIMENTS, OVERRIDES = rehearsal_block()


def test_the_rehearsal_covers_every_paper_experiment():
    shipped = sorted(p.stem for p in (README.parent / "sweeps" / "experiment").glob("*_paper.yaml"))
    assert sorted(EXPERIMENTS) == shipped


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("rehearsal")


@pytest.fixture
def fault_before_step_1(monkeypatch):
    monkeypatch.setenv("RAYSTREAM_FAIL_AT_STEP", "1")


@pytest.mark.slow
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_rehearsal(ray_cluster, workdir, fault_before_step_1, experiment):
    from raystream.train.run import fit

    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    cfg = compose([f"+experiment={experiment}", *OVERRIDES, f"trainer.run_name=rehearsal-{experiment}",
                   f"trainer.storage_path={workdir / 'results'}", f"mlflow.tracking_uri={uri}"])
    shipped = compose([f"+experiment={experiment}", "data.videos=x", "data.heldout_videos=x", "eval.dataset=x"])
    ours, paper = (OmegaConf.to_container(c.scenario) for c in (cfg, shipped))
    for scenario in (ours, paper):
        scenario["dora"].pop("local_size")  # DoRA's local crops: 16 px of 32 here, 112 of 224 in the paper
    assert ours == paper  # the paper's model: backbone, heads, decoder, masks
    final = fit(cfg)

    assert final["steps_done"] == 2 and final["start_step"] == 1  # restarted from the checkpoint after step 0
    assert (workdir / "results" / f"rehearsal-{experiment}" / ".fault_injected_step1").is_file()
    client = make_client(uri)
    run = client.get_run(final["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    for metric in correlation.METRICS:  # measured by the worker before step 0
        assert [m.step for m in client.get_metric_history(run.info.run_id, metric)] == [0], metric
    assert [m.step for m in client.get_metric_history(run.info.run_id, names.LOSS)] == [0, 1]
    evals = {k for k in metrics if k.startswith(names.EVAL_PREFIX) and "in_stream" not in k}
    assert evals, metrics  # the evaluation pass at the end (probes, or held-out error for future prediction)
    assert all(len(client.get_metric_history(run.info.run_id, k)) == 1 for k in evals)
    assert os.path.isdir(final["checkpoint_path"]) and final["checkpoint_path"].endswith("checkpoint_00000002")
