"""Fixtures shared across test folders: one local Ray cluster (2 CPUs) for every Ray test of the session."""

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
