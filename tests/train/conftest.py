"""One local Ray cluster (2 CPUs) shared by every Ray test of the session, and tiny run configs."""

import os

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster (or the one a previous fixture started); yields its GCS address."""
    import ray

    # The Train controller polls its workers every 2 s by default; tiny test runs finish faster at 0.25 s.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()


TINY = [
    "stream.batch_size=4",
    "trainer.max_steps=6",
    "trainer.checkpoint_every=2",
    "trainer.keep_checkpoints=2",
    "trainer.log_every=1",
    "trainer.report_every=2",
    "trainer.max_failures=2",
    "eval.metrics=[]",
    "optimizer.warmup_steps=2",
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Storage path and MLflow store shared by a test module's runs."""
    d = tmp_path_factory.mktemp("train")
    return {"storage": str(d / "results"), "mlflow": f"sqlite:///{d / 'mlflow.db'}", "dir": d}


@pytest.fixture(scope="module")
def tiny_overrides(workdir):
    """`tiny_overrides(*extra)`: the override list of a tiny run writing into the module's storage and MLflow."""

    def make(*extra):
        return [*TINY, f"trainer.storage_path={workdir['storage']}", f"mlflow.tracking_uri={workdir['mlflow']}",
                "mlflow.experiment=train-tests", *extra]

    return make


@pytest.fixture(scope="module")
def tiny(tiny_overrides):
    """`tiny(*extra)`: the composed tiny config."""
    from raystream.config import compose

    return lambda *extra: compose(tiny_overrides(*extra))
