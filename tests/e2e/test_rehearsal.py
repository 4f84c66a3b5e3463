"""The rehearsal of the paper experiments (docs/paper-scale.md, "Rehearsal"): each of `+experiment=dora_paper`,
`videomae_paper` and `future_prediction_paper` at its own architecture, on the demo videos, 2 steps on the CPU
with the stream correlation measured by the worker, and one evaluation pass at the end.

Each run starts from a checkpoint in the format its paper experiment starts from, written here by the reference
library itself (random weights; tests/models/reference_checkpoints.py): DoRA from a ViT-S/16 image checkpoint
(transformers' layout), VideoMAE from an official VideoMAE pretraining file (q/v biases, decoder dropped), future
prediction from an ImageNet-21K ViT-L/16 classifier (kernel inflated to tubelets, learned 2-D positions).

DoRA also takes a checkpoint after step 0, has a worker killed before step 1 and restarts from that checkpoint (the
resume), at its paper architecture and from its published start, and its final checkpoint becomes the run's MLflow
LoggedModel, as the docs' command does. The VideoMAE (ViT-B) and ViT-L runs are the same 2 steps without the kill,
each writing one checkpoint, at the end (the ViT-L's, model and three optimizer states, is 6.1 GB), and no
LoggedModel (`trainer.log_checkpoint_artifact=false`: the ViT-L's would be its 1.2 GB of weights copied three times
more by the test's process, the checkpoint's model.pt into a temp dir, MLflow's pickle of it, and its copy into the
artifact store): resuming and logging the model do not depend on the architecture, DoRA's paper model covers them
here, tests/train/test_fit.py restarts a (tiny) VideoMAE from its checkpoint through Ray Train and checks the
LoggedModel's files, metrics and registration.

The overrides and the experiments are read from the docs' rehearsal block, so the command users are told to run is
the one tested. One local Ray cluster (tests/conftest.py) serves the three runs.
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

DOC = Path(__file__).parents[2] / "docs" / "paper-scale.md"


def rehearsal_block():
    """(the experiments of the docs' `for e in ...` loop, the overrides of its `REHEARSAL="..."` line)."""
    text = DOC.read_text()
    overrides = re.search(r'^REHEARSAL="([^"]+)"', text, re.M)
    loop = re.search(r"^for e in ([\w ]+); do\n\s+RAYSTREAM_FAIL_AT_STEP=1 raystream train \+experiment=\$e "
                     r"\$REHEARSAL trainer\.run_name=rehearsal-\$e", text, re.M)
    assert overrides and loop, f"{DOC}: the rehearsal block (REHEARSAL=... and its for loop) is missing"
    where = ("trainer.storage_path=", "mlflow.tracking_uri=")  # the tests write into their own tmp dirs
    return loop.group(1).split(), [o for o in shlex.split(overrides.group(1)) if not o.startswith(where)]


EXPERIMENTS, OVERRIDES = rehearsal_block()


def test_the_rehearsal_covers_every_paper_experiment():
    shipped = sorted(p.stem for p in (DOC.parents[1] / "sweeps" / "experiment").glob("*_paper.yaml"))
    assert sorted(EXPERIMENTS) == shipped


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The module's directory; its checkpoints (about 8 GB: the ViT-L's alone is 6.1 GB) and start files are removed
    at the end, as pytest keeps the temp dirs of the last three sessions and the disk would fill."""
    import shutil

    d = tmp_path_factory.mktemp("rehearsal")
    yield d
    for big in [d / "results", *d.glob("start-*")]:
        shutil.rmtree(big, ignore_errors=True)


def published_start(experiment: str, directory: Path):
    """(the overrides that start `experiment` from its published format, the backbone keys they change)."""
    from reference_checkpoints import official_videomae_pretraining, transformers_videomae, transformers_vit

    if experiment == "dora_paper":
        path, _ = transformers_vit(directory, "small")
        return [f"scenario.backbone.init={path}"], ()
    if experiment == "videomae_paper":
        _, model = transformers_videomae(directory, "base", num_frames=16)
        path = official_videomae_pretraining(directory, model)
        return [f"scenario.backbone.init={path}", "scenario.backbone.qkv_bias=qv"], ("qkv_bias",)
    path, _ = transformers_vit(directory, "large", pooler=True)  # ImageNet-21K: its pooler is dropped
    return [f"scenario.backbone.init={path}", "scenario.backbone.pos_embed=learned"], ("pos_embed",)


RESUMED = ("dora_paper",)  # the other two write one checkpoint each: see the module docstring


@pytest.mark.slow
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_rehearsal(ray_cluster, workdir, experiment):
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
    from raystream.train.faults import Faults
    from raystream.train.run import RunOptions, fit

    checkpoint_dir = workdir / f"start-{experiment}"
    checkpoint_dir.mkdir()
    start, changed = published_start(experiment, checkpoint_dir)
    resumed = experiment in RESUMED
    hooks = Faults(fail_at_step=1) if resumed else None  # the rehearsal's RAYSTREAM_FAIL_AT_STEP=1
    # 2 steps: the final checkpoint only, and no LoggedModel made of it (see the module docstring)
    every = [] if resumed else ["trainer.checkpoint_every=2", "trainer.log_checkpoint_artifact=false"]
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    cfg = compose([f"+experiment={experiment}", *OVERRIDES, *start, *every, f"trainer.run_name=rehearsal-{experiment}",
                   f"trainer.storage_path={workdir / 'results'}", f"mlflow.tracking_uri={uri}"])
    shipped = compose([f"+experiment={experiment}", "data.videos=x", "data.heldout_videos=x", "eval.dataset=x"])
    ours, paper = (OmegaConf.to_container(c.scenario) for c in (cfg, shipped))
    for scenario in (ours, paper):
        scenario["dora"].pop("local_size")  # DoRA's local crops: 16 px of 32 here, 112 of 224 in the paper
        for key in ("init", *changed):  # the start: a file, and the layout its format needs
            scenario["backbone"].pop(key)
    assert ours == paper  # the paper's model: backbone, heads, decoder, masks
    final = fit(cfg, options=RunOptions(step_hooks=hooks))

    assert final["steps_done"] == 2
    if resumed:
        assert final["start_step"] == 1  # restarted from the checkpoint after step 0
        assert (workdir / "results" / f"rehearsal-{experiment}" / ".fault_injected_step1").is_file()
    client = make_client(uri)
    run = client.get_run(final["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert str(checkpoint_dir) in run.data.tags["raystream.init"], run.data.tags  # the one line saying what loaded
    metrics = run.data.metrics
    for metric in correlation.METRICS:  # measured by the worker before step 0
        assert [m.step for m in client.get_metric_history(run.info.run_id, metric)] == [0], metric
    assert [m.step for m in client.get_metric_history(run.info.run_id, names.LOSS)] == [0, 1]
    evals = {k for k in metrics if k.startswith(names.EVAL_PREFIX) and "in_stream" not in k}
    assert evals, metrics  # the evaluation pass at the end (probes, or held-out error for future prediction)
    assert all(len(client.get_metric_history(run.info.run_id, k)) == 1 for k in evals)
    assert os.path.isdir(final["checkpoint_path"]) and final["checkpoint_path"].endswith("checkpoint_00000002")
    written = sorted(p.name for p in (workdir / "results" / f"rehearsal-{experiment}").glob("checkpoint_0*"))
    assert written == (["checkpoint_00000001", "checkpoint_00000002"] if resumed else ["checkpoint_00000002"])
    models = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")
    assert [(m.name, str(m.status)) for m in models] == ([(f"rehearsal-{experiment}", "READY")] if resumed else [])
