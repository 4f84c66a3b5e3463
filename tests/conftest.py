"""Fixtures shared across test folders: one torch thread per test (the CI machine has 2 shared cores and the
models are tiny), and one local Ray cluster (2 CPUs) for every Ray test of the session; and the two queues the
suite runs in under pytest-xdist (`make test`: `-n 2 --dist loadgroup`)."""

import os

import pytest
import torch


def pytest_configure(config):
    """Demo videos go to a cache of the tests (kept between sessions, outside the user's home), never into
    ~/.cache/raystream; Ray Train polls its workers often. Subprocesses and Ray workers inherit both."""
    import tempfile

    os.environ.setdefault("RAYSTREAM_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"raystream-tests-{os.getuid()}"))
    # The Train controller polls its workers every 2 s by default; tiny test runs finish faster at 0.25 s. Set for
    # the whole session, so the `raystream` subprocesses of the end-to-end tests poll as fast as in-process runs.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")


# Modules whose tests start clusters of their own (subprocess `raystream` drivers, fake autoscaling nodes, the Ray
# job server); the other Ray modules share the session's `ray_cluster`.
OWN_CLUSTERS = ("e2e", "cluster")


def pytest_collection_modifyitems(config, items):
    """Two queues for `-n 2 --dist loadgroup`: every module with a Ray test (one using `ray_cluster`, or marked slow)
    runs whole, in order, in one of two groups, so its module fixtures are made once and one worker holds one
    session cluster; the e2e and cluster modules form the other group; the unit tests fill in on both workers.
    Without xdist the groups change nothing."""
    ray_modules = {item.path for item in items if "ray_cluster" in item.fixturenames or item.get_closest_marker("slow")}
    for item in items:
        if item.path in ray_modules:
            group = "own-clusters" if item.path.parent.name in OWN_CLUSTERS else "session-cluster"
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster (or the one a previous fixture started); yields its GCS address. A start that times out
    (Ray waits a fixed time for its GCS and raylet, which a loaded machine can exceed) fails the test saying so,
    with the load average; it is not retried."""
    import ray

    started = not ray.is_initialized()
    if started:
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
        except Exception as exc:
            if not (isinstance(exc, TimeoutError) or any(w in str(exc).lower() for w in ("timed out", "timeout"))):
                raise
            load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
            pytest.fail(f"Ray did not start: a time-out while starting ({type(exc).__name__}: {exc}), as when the "
                        f"machine is loaded: load average {load} (1, 5, 15 min) on {os.cpu_count()} CPUs. Not "
                        "retried.", pytrace=False)
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()
