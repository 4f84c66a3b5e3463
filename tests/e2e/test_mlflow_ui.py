"""The comparison a sweep's last lines open, in a real browser: a sweep's MLflow records as a sweep writes them (its
parent run and saved view, four trial runs named by their grid values, with params and metrics; no Ray), the
`mlflow ui` command the sweep prints, run as printed from another directory on a free port of 127.0.0.1, and the
printed link opened in headless Chromium (Debian's `chromium`; `.ci/run` installs it where missing). The rendered
page must list every trial by name with a metric column and its values: the runs table of the training view,
not MLflow's GenAI start page, and no trial folded away under its parent; in a fresh browser profile the page is
MLflow's training workflow (models, charts), not its GenAI one (traces, "Agent versions")."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from raystream.config import compose
from raystream.tracking import names, ui
from raystream.tracking.store import end_run, prepare_store, start_run
from raystream.tune.space import plan
from raystream.tune.sweep_run import parent_run, view_columns
from raystream.tune.trial import trial_tags

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
KNN = {0: 0.1234, 1: 0.2345, 2: 0.3456, 3: 0.4567}  # eval/knn_top1 of each trial: values to find on the page


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recorded_sweep(tmp: Path):
    """What `raystream sweep` (smoke) records, written with the sweep's own functions."""
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    prepare_store(uri)
    cfg = compose([])
    p = plan(cfg)
    parent = parent_run(uri, "raystream", "smoke-ui", cfg, p, None)
    client = MlflowClient(uri)
    info = {"name": "smoke", "run_name": "smoke-ui", "cell_values": [c.values for c in p.cells]}
    for cell in p.cells:
        tags = {**trial_tags(info, cell.index, f"t{cell.index}", {}),
                names.RUN_NAME_TAG: names.trial_run_name(cell.values)}
        rid = start_run(client, experiment="raystream", uri=uri, run_name=f"smoke-ui-t{cell.index}",
                        parent_run_id=parent, tags=tags)
        now = int(time.time() * 1000)
        client.log_batch(rid, params=[Param(k, str(v)) for k, v in cell.values.items()],
                         metrics=[Metric("eval/knn_top1", KNN[cell.index], now, 13),
                                  Metric("loss", 0.5 + 0.01 * cell.index, now, 13)])
        end_run(client, rid)
    exp_id = client.get_run(parent).info.experiment_id
    ui.write_view(client, exp_id, "smoke-ui", view_columns(p, ["loss", "eval/knn_top1"]))
    end_run(client, parent)
    return uri, exp_id, [names.trial_run_name(c.values) for c in p.cells]


def _render(url: str, profile: Path, budget_ms: int, output: str = "--dump-dom") -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--window-size=1600,900", f"--virtual-time-budget={budget_ms}",
           output, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180).stdout


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's `chromium` where missing)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    tmp = tmp_path_factory.mktemp("mlflow_ui")
    uri, exp_id, trial_names = _recorded_sweep(tmp)
    lines = ui.open_lines(uri, exp_id, "smoke-ui", len(trial_names))
    port = _free_port()
    command = shlex.split(lines[-2])  # as printed, on a free port: 5000 may be taken
    command[command.index("--port") + 1] = str(port)
    elsewhere = tmp / "elsewhere"  # the printed command works from any directory
    elsewhere.mkdir()
    server_log = open(tmp / "mlflow_ui.log", "w")
    # MLflow's GenAI job runner (8 processes importing MLflow) left out, as tests/local_cloud.py's server does
    server = subprocess.Popen(command, cwd=elsewhere, stdout=server_log, stderr=subprocess.STDOUT,
                              start_new_session=True, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        deadline = time.time() + 300  # MLflow's server starts slowly on a loaded 2-core machine
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None and time.time() < deadline, \
                (f"`{lines[-2]}` did not serve on {port}", (tmp / "mlflow_ui.log").read_text()[-3000:])
            time.sleep(1)
        url = lines[-1].strip().replace(f":{ui.UI_PORT}/", f":{port}/")
        dom = ""
        for budget in (30_000, 60_000, 120_000):  # a loaded machine renders the SPA slower
            dom = _render(url, tmp / "profile", budget)
            if all(name in dom for name in trial_names) and str(KNN[3]) in dom:
                break
        shot = os.environ.get("RAYSTREAM_UI_SCREENSHOT")  # docs' picture: a PNG of the page, where asked
        if shot:
            _render(url, tmp / "profile", 60_000, f"--screenshot={shot}")
        yield {"dom": dom, "names": trial_names, "url": url}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=15)
        server_log.close()


def test_the_printed_link_lists_every_trial_by_name(page):
    dom = page["dom"]
    assert page["names"] == ["adamw-time", "adamw-shuffled", "orth_adamw-time", "orth_adamw-shuffled"]
    missing = [name for name in page["names"] if name not in dom]
    assert not missing, (missing, page["url"], dom[-3000:])  # the runs table, not the GenAI start page


def test_the_page_shows_a_metric_column_with_each_trials_value(page):
    dom = page["dom"]
    assert "eval/knn_top1" in dom and "optimizer.name" in dom
    assert all(str(v) in dom for v in KNN.values()), [v for v in KNN.values() if str(v) not in dom]


def test_the_link_opens_the_training_workflow_not_genai(page):
    """MLflow 3.17's UI takes its workflow from the link (`workflowType`), else from the browser's last choice, GenAI
    in a fresh profile, whatever the experiment's `mlflow.experimentKind`: the GenAI sidebar lists "Agent versions",
    the training one ("Runs", "Models", "Model registry") does not."""
    dom = page["dom"]
    assert "workflowType=machine_learning" in page["url"]
    assert "Agent versions" not in dom, (page["url"], dom[-3000:])
    assert "Model registry" in dom, (page["url"], dom[-3000:])
