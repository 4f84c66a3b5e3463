"""Fixtures shared across test folders: one torch thread per test (the CI machine has 2 shared cores and the
models are tiny), and one local Ray cluster (2 CPUs) for every Ray test of the session, whose workers compile with
`aot_eager` (tests/ray_env.py `SESSION_CLUSTER_ENV`); and the two queues the suite runs in under pytest-xdist
(`make test`: `-n 2`)."""

import functools
import os
import re
import time
from pathlib import Path
from typing import Optional

import pytest
import torch


def pytest_configure(config):
    """Demo videos go to a cache of the tests (kept between sessions, outside the user's home), never into
    ~/.cache/raystream; Ray Train polls its workers often and skips what no test reads (tests/ray_env.py).
    Subprocesses and Ray workers inherit both."""
    import tempfile

    os.environ.setdefault("RAYSTREAM_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"raystream-tests-{os.getuid()}"))
    from ray_env import RAY_TEST_ENV  # the poll interval, and no preemption watcher or JSON logs

    for key, value in RAY_TEST_ENV.items():
        os.environ.setdefault(key, value)


def reference_loop_s(repeat: int = 5) -> float:
    """The best of `repeat` timings of a fixed pure-Python loop (a million additions), in seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i
        best = min(best, time.perf_counter() - t0)
    return best


def pytest_report_header(config):
    """This machine's speed and load as the suite starts, so that suite times from different machines can be
    compared: machines of one kind ran the same tests up to 2.5x apart (docs/suite.md). Most of the suite's CPU is
    Python (imports, Ray's processes, CLI drivers), so a pure-Python loop is its yardstick."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"machine reference: a million-step Python loop in {reference_loop_s() * 1000:.0f} ms (best of 5); "
            f"load average {load} (1, 5, 15 min) on {os.cpu_count()} CPUs")


# The suite runs on 2 xdist workers (`make test`: `-n 2`) in two long queues and the unit tests around them: the Ray
# modules (those naming the `ray_cluster` fixture or the slow mark) run whole, in collection order, in one of two
# queues, so that each module's fixtures are made once and two Ray runs of one queue never overlap; the e2e and
# cluster modules, which start clusters of their own, form the first queue, the modules on the session's cluster the
# second, and every other module is a unit of its own that either worker takes when free.
OWN_CLUSTERS = ("e2e", "cluster")
RAY_MODULE = re.compile(r"ray_cluster|mark\.slow")
QUEUES = ("own-clusters", "session-cluster")


@functools.lru_cache(maxsize=None)
def queue_of(module: str) -> Optional[str]:
    """The queue of a test module (its path), or None for a module of unit tests."""
    path = Path(module)
    if not RAY_MODULE.search(path.read_text()):
        return None
    return QUEUES[0] if path.parent.name in OWN_CLUSTERS else QUEUES[1]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The queues' modules first, the first queue's before the second's (a stable sort: each keeps its order), so
    that xdist hands one queue to each worker before any unit of tests."""
    rank = {QUEUES[0]: 0, QUEUES[1]: 1, None: 2}
    items.sort(key=lambda item: rank[queue_of(str(item.path))])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's load-by-scope scheduling with the queues above as scopes (its own `xdist_group` mark does not group
    under pytest 9, whose node ids it can no longer rewrite)."""
    from xdist.scheduler import LoadScopeScheduling  # only under xdist, which may not be installed

    config.option.loadscopereorder = False  # the collection's order (the queues first), not the largest unit first

    class Queues(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return queue_of(str(config.rootpath / module)) or module

    return Queues(config, log)


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

    from ray_env import SESSION_CLUSTER_ENV
    from raystream.train.ray_start import start_local_ray

    started = not ray.is_initialized()
    if started:
        try:
            # raystream's local start: the cluster's Train placement-group cleaners never ask another cluster's
            # dashboard (the e2e and cluster tests start clusters beside this one) whether a run is alive. The
            # cluster's processes take SESSION_CLUSTER_ENV from this process's environment as they start; the
            # environment is restored right after, so this process and its later subprocesses do not.
            with pytest.MonkeyPatch.context() as patch:
                for key, value in SESSION_CLUSTER_ENV.items():
                    patch.setenv(key, value)
                start_local_ray(num_cpus=2, include_dashboard=False, log_to_driver=True)
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
