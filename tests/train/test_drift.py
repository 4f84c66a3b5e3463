"""drift/* (raystream/train/drift.py) against a hand computation in numpy: ||θ_t - θ_0|| / ||θ_0|| over the trained
parameters and over DoRA's teacher backbone (an EMA in buffers); and a resumed worker, whose model is rebuilt from
the same config and then loaded from the checkpoint's state, measures from the same start."""

import numpy as np
import pytest
import torch

from raystream.config import compose
from raystream.models import build_scenario
from raystream.models.scenario import unwrap
from raystream.train.drift import Drift

DORA = ["scenario=dora", "scenario.backbone.preset=tiny", "stream.resolution=32"]


def by_hand(now, start) -> float:
    """||now - start|| / ||start|| over lists of arrays, in float64 numpy."""
    diff = sum(float(np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)) for a, b in zip(now, start))
    norm = sum(float(np.sum(np.asarray(b, np.float64) ** 2)) for b in start)
    return float(np.sqrt(diff) / np.sqrt(norm))


def dora(seed: int = 0):
    cfg = compose(DORA)
    scenario = build_scenario(cfg.scenario, cfg.stream, seed=seed)
    scenario.set_total_steps(10)
    net = unwrap(scenario.model)
    params = [p for p in net.parameters() if p.requires_grad]
    return scenario, net, params


def arrays(tensors):
    return [t.detach().cpu().numpy().copy() for t in tensors]


def teacher_tensors(net):
    return [t for t in net.teacher.backbone.state_dict().values() if t.is_floating_point()]


def train_a_little(scenario, params, steps: int = 3) -> None:
    """Steps that move the student (a fixed random update) and the teacher (DoRA's EMA after each step)."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for t in range(steps):
            for p in params:
                p.add_(0.01 * torch.randn(p.shape, generator=gen))
            scenario.after_step(t)


def test_drift_is_the_relative_distance_from_the_start():
    layer = torch.nn.Linear(3, 2)
    layer.register_buffer("running", torch.tensor([1.0, -2.0]))
    params = list(layer.parameters())
    drift = Drift.of(params, {"layer": layer})
    start_params, start_all = arrays(params), arrays([layer.weight, layer.bias, layer.running])
    assert drift.measure() == {"params": 0.0, "layer": 0.0}
    with torch.no_grad():
        layer.weight.add_(torch.tensor([[0.5, 0.0, -1.0], [0.0, 2.0, 0.0]]))
        layer.running.mul_(3.0)  # a buffer: in the module's group, not in the trained parameters
    got = drift.measure()
    assert got["params"] == pytest.approx(by_hand(arrays(params), start_params), rel=1e-12)
    assert got["layer"] == pytest.approx(by_hand(arrays([layer.weight, layer.bias, layer.running]), start_all),
                                         rel=1e-12)
    assert got["params"] > 0 and got["layer"] != got["params"]  # the buffer counts in the module's group only


def test_dora_teacher_backbone_drift_by_hand():
    scenario, net, params = dora()
    drift = Drift.of(params, scenario.drift_modules(net))
    assert set(drift.groups) == {"params", "teacher_backbone"}
    start_p, start_t = arrays(params), arrays(teacher_tensors(net))
    train_a_little(scenario, params)
    got = drift.measure()
    assert got["params"] == pytest.approx(by_hand(arrays(params), start_p), rel=1e-9)
    assert got["teacher_backbone"] == pytest.approx(by_hand(arrays(teacher_tensors(net)), start_t), rel=1e-9)
    assert 0 < got["teacher_backbone"] < got["params"]  # the EMA trails the student


def test_a_resumed_worker_measures_from_the_same_start():
    """The run: built, trained a little, its state and θ_0's fingerprint checkpointed. The resume: the model
    rebuilt from the same config (as `Worker.assemble` does before `restore` loads the checkpoint), its Drift taken
    then, the state loaded: the same start (fingerprints match), the same drift, equal to the hand computation."""
    scenario, net, params = dora()
    first = Drift.of(params, scenario.drift_modules(net))
    start_p, start_t = arrays(params), arrays(teacher_tensors(net))
    train_a_little(scenario, params)
    state, fingerprint, before = {k: v.clone() for k, v in net.state_dict().items()}, first.fingerprint(), \
        first.measure()

    scenario2, net2, params2 = dora()
    resumed = Drift.of(params2, scenario2.drift_modules(net2))
    net2.load_state_dict(state)
    assert resumed.matches(fingerprint) == []
    after = resumed.measure()
    assert after == pytest.approx(before, rel=1e-12)
    assert after["params"] == pytest.approx(by_hand(arrays(params2), start_p), rel=1e-9)
    assert after["teacher_backbone"] == pytest.approx(by_hand(arrays(teacher_tensors(net2)), start_t), rel=1e-9)

    # a start taken after the load (the resumed weights) would read 0: what the rebuild-first order prevents
    assert Drift.of(params2, scenario2.drift_modules(net2)).measure()["params"] == 0.0
    # another start (another seed: other random weights) is recognised as such
    scenario3, net3, params3 = dora(seed=1)
    assert Drift.of(params3, scenario3.drift_modules(net3)).matches(fingerprint) == ["params", "teacher_backbone"]
