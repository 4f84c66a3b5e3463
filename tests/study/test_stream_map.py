"""The map (raystream/study/stream_map.py) from a real MLflow store holding two matched-drift sweeps recorded the
way a sweep records them (parent runs from the sweep files' plans, child runs tagged with their cells): per stream,
the correlation at the start per seed, AdamW's gradient cosine in training along the order and shuffled, and
Orthogonal-AdamW's lead over AdamW at matched drift in stream and out of stream with the seed spread; a stream
whose lines never reach the same drift is said to have no overlap, not read outside its range."""

from __future__ import annotations

import csv
import math
import shutil

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from raystream.config import compose, config_dir
from raystream.study import report, stream_map
from raystream.tune.space import plan
from raystream.tune.sweep_run import parent_run
from raystream.tune.trial import trial_tags

SWEEP = """name: {name}
grid:
  optimizer: [adamw, orthogonal_adamw]
  stream.order: [batch_along_time, shuffled]
  optimizer.lr: [0.001, 0.002, 0.004]
  trainer.seed: [0, 1]
exclude:
  - {{optimizer: orthogonal_adamw, stream.order: shuffled}}
  - {{stream.order: shuffled, optimizer.lr: 0.002}}
  - {{stream.order: shuffled, optimizer.lr: 0.004}}
  - {{optimizer: adamw, optimizer.lr: 0.004}}
  - {{optimizer: orthogonal_adamw, optimizer.lr: 0.001}}
"""
# stream "ahead": Orthogonal-AdamW's drift is half AdamW's at the same lr, so lr 2e-3 / 4e-3 meet AdamW's 1e-3 / 2e-3
# (drift 0.1 / 0.2); it leads by 1 dB in stream and 10% out of stream. Stream "apart": its drift stays 10x lower.
STREAMS = {"map_ahead": dict(orth_drift=50.0, psnr_lead=1.0, mse_ratio=0.9),
           "map_apart": dict(orth_drift=10.0, psnr_lead=-1.0, mse_ratio=1.1)}


def metrics(stream, opt, order, lr, seed):
    s = STREAMS[stream]
    orth = opt != "adamw"
    drift = lr * (s["orth_drift"] if orth else 100.0)
    out = [Metric("drift/params", drift, 0, 10),
           Metric("eval/psnr_in_stream", 10.0 + 0.1 * seed + (s["psnr_lead"] if orth else 0.0), 0, 10),
           Metric("eval/mse_out_of_stream", 0.05 * (s["mse_ratio"] if orth else 1.0), 0, 10),
           # what a run measures at its start in its own order: the shuffled run's "sequential" is shuffled
           Metric("correlation/sequential", 0.1 if order == "shuffled" else 0.6 + 0.2 * seed, 0, 0),
           Metric("correlation/shuffled", 0.05, 0, 0)]
    cos = 0.3 if order == "shuffled" else (0.5 if orth else 0.9 - lr * 10)  # AdamW at 1e-3 along time: 0.89
    return out + [Metric("grad_cos_prev", cos, 0, step) for step in range(1, 4)]


@pytest.fixture(scope="module")
def map_store(tmp_path_factory):
    """Two finished matched-drift sweeps in one MLflow experiment (10 trials each)."""
    tmp = tmp_path_factory.mktemp("map")
    with pytest.MonkeyPatch.context() as mp:
        root = tmp / "sweeps"
        shutil.copytree(config_dir(), root)
        for name in STREAMS:
            (root / "sweep" / f"{name}.yaml").write_text(SWEEP.format(name=name))
        mp.setenv("RAYSTREAM_CONFIG_DIR", str(root))
        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        client = MlflowClient(uri)
        for name in STREAMS:
            cfg = compose([f"sweep={name}"])
            p = plan(cfg, [f"sweep={name}"])
            parent = parent_run(uri, "maptest", f"{name}-run", cfg, p, None)
            exp_id = client.get_run(parent).info.experiment_id
            info = {"name": name, "run_name": f"{name}-run", "cell_values": [c.values for c in p.cells]}
            for cell in p.cells:
                v = cell.values
                tags = {**trial_tags(info, cell.index, f"t{cell.index}", {}), "mlflow.parentRunId": parent}
                run = client.create_run(exp_id, run_name=f"{name}-t{cell.index}", tags=tags)
                client.log_batch(run.info.run_id, metrics=metrics(name, v["optimizer"], v["stream.order"],
                                                                  float(v["optimizer.lr"]), v["trainer.seed"]))
                client.set_terminated(run.info.run_id, "FINISHED")
        yield client, uri, tmp


def test_the_map_reads_the_lead_at_matched_drift_beside_the_correlation(map_store):
    client, uri, _ = map_store
    parents = stream_map.latest_sweeps(client, "maptest")
    rows = {r.stream: r for p in parents
            for r in stream_map.map_rows(report.build_table(client, p), p.data.tags["raystream.sweep"])}
    assert set(rows) == set(STREAMS)
    ahead = rows["map_ahead"]
    assert (ahead.order, ahead.line, ahead.seeds) == ("batch_along_time", "orthogonal_adamw", 2)
    # one correlation per seed (0.6, 0.8) from the runs along time only: the shuffled runs' 0.1 is left out
    assert ahead.corr_start[:2] == pytest.approx((0.7, math.sqrt(0.02))) and ahead.corr_start[2] == 2
    assert ahead.corr_start_shuffled[0] == pytest.approx(0.05)
    # AdamW's cosine in training at the shuffled run's lr (1e-3): 0.89 along time, 0.3 shuffled
    assert ahead.cos_training[0] == pytest.approx(0.89) and ahead.cos_training_shuffled[0] == pytest.approx(0.3)
    assert ahead.overlap == pytest.approx((0.1, 0.2)) and ahead.coverage == pytest.approx(1.0)
    assert ahead.in_stream.mean == pytest.approx(1.0) and ahead.in_stream.low == pytest.approx(1.0)
    assert ahead.in_stream.spread == pytest.approx(math.hypot(math.sqrt(0.005), math.sqrt(0.005)))
    assert ahead.out_of_stream.mean == pytest.approx(10.0) and ahead.out_of_stream.spread == pytest.approx(0.0)
    # each at its best lr: the same leads here (the metrics do not depend on the lr)
    assert ahead.tuned_in_stream == pytest.approx((1.0, math.hypot(math.sqrt(0.005), math.sqrt(0.005))))
    assert ahead.tuned_out_of_stream == pytest.approx((10.0, 0.0))
    apart = rows["map_apart"]  # Orthogonal-AdamW reached drift 0.02-0.04, AdamW 0.1-0.2: no matched step
    assert apart.overlap is None and apart.in_stream is None and apart.out_of_stream is None
    assert apart.tuned_in_stream[0] == pytest.approx(-1.0) and apart.tuned_out_of_stream[0] == pytest.approx(-10.0)


def test_report_map_writes_the_table_csv_and_figure(map_store, tmp_path, capsys):
    client, uri, _ = map_store
    assert stream_map.main("maptest", out=str(tmp_path / "map"), tracking_uri=uri) == 0
    out = capsys.readouterr().out
    assert "| map_ahead | time | orth_adamw | 2 | 0.70 ± 0.14 / 0.05 ± 0.00 | 0.89 ± 0.00 / 0.30 ± 0.00 | " \
           "0.1-0.2 (100%) | +1.00 ± 0.10 (+1.00 to +1.00) | +10.00% ± 0.00 (+10.00 to +10.00) | " \
           "+1.00 ± 0.10 / +10.00% ± 0.00 |" in out
    assert "| map_apart | time | orth_adamw | 2 |" in out
    assert "no overlap | no overlap | -1.00 ± 0.10 / -10.00% ± 0.00 |" in out
    with open(tmp_path / "map" / "map.csv") as f:
        got = {r["stream"]: r for r in csv.DictReader(f)}
    assert float(got["map_ahead"]["in_stream_lead_db"]) == pytest.approx(1.0)
    assert got["map_apart"]["in_stream_lead_db"] == ""
    assert (tmp_path / "map" / "map.png").stat().st_size > 0
    assert "too few streams: a line needs a matched lead on at least 3 streams" in out  # two streams here
    assert "too few streams" in (tmp_path / "map" / "map.md").read_text()
    assert stream_map.main("nope", tracking_uri=uri) == 2
    assert "no MLflow experiment named 'nope'" in capsys.readouterr().err
    assert stream_map.main(None, tracking_uri=uri) == 2
    assert "give --experiment NAME" in capsys.readouterr().err


def _row(stream, line, corr, cos, lead_in, lead_out):
    adv = (lambda v: None if v is None else stream_map.Advantage(v, v, v, 0.0))
    return stream_map.MapRow(stream=stream, order="batch_along_time", line=line, seeds=3, corr_start=(corr, 0.0, 3),
                             corr_start_shuffled=None, cos_training=(cos, 0.0, 3), cos_training_shuffled=None,
                             overlap=(0.1, 0.2), coverage=1.0, in_stream=adv(lead_in), out_of_stream=adv(lead_out))


def test_the_map_says_whether_the_correlation_orders_the_leads_across_streams():
    """Per line, over the streams with a matched lead: in stream the lead rises with the correlation at the start
    (rho +1), out of stream it falls (rho -1); a stream without an overlap is left out of that line's count."""
    rows = [_row("a", "orthogonal_adamw", 0.2, 0.5, 0.1, 5.0), _row("b", "orthogonal_adamw", 0.5, 0.9, 0.3, 1.0),
            _row("c", "orthogonal_adamw", 0.6, 0.7, 0.5, -2.0), _row("d", "orthogonal_adamw", 0.9, 0.8, 0.9, -9.0),
            _row("e", "orthogonal_adamw", 0.95, 0.6, None, None),
            _row("a", "orthogonal_adamw_099", 0.2, 0.5, 0.1, 5.0), _row("b", "orthogonal_adamw_099", 0.5, 0.9, 0.3, 1.0)]
    found = {(f.line, f.measure, f.lead): f for f in stream_map.predictions(rows)}
    assert set(found) == {("orthogonal_adamw", m, lead) for m, _ in stream_map.MEASURES for lead, _ in stream_map.LEADS}
    start_in = found[("orthogonal_adamw", "correlation at start", "in stream")]
    assert (start_in.n, start_in.rho, start_in.p) == (4, pytest.approx(1.0), pytest.approx(2 / 24))
    assert found[("orthogonal_adamw", "correlation at start", "out of stream")].rho == pytest.approx(-1.0)
    assert found[("orthogonal_adamw", "AdamW grad cos in training", "in stream")].rho == pytest.approx(0.4)
    text = stream_map.predictions_markdown(stream_map.predictions(rows))
    assert "| orth_adamw | correlation at start | in stream | 4 | +1.00 | 0.083 |" in text
    assert "orth_adamw_099" not in text  # two streams: no rank correlation for that line
