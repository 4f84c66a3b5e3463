"""Tiny run configs for the Ray Train tests (the shared local Ray cluster is `ray_cluster` in tests/conftest.py)."""

import pytest


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
    "optimizer.weight_decay_end=0.5",  # the weight-decay schedule too (0.05 -> 0.5), through restarts
    "trainer.correlation_steps=1",  # measured before step 0 of every run (1 pair, not 4: test_correlation.py checks it)
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
