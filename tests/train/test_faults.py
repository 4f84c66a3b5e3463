"""The fault-injection hook fires once per run, on the chosen rank only."""

import pytest

from raystream.train import faults


def test_fail_once_at_step_on_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSTREAM_FAIL_AT_STEP", "3")
    monkeypatch.setenv("RAYSTREAM_FAIL_RANK", "1")
    hooks = faults.from_env(str(tmp_path / "run"), "r")
    assert hooks["fail_marker"].startswith(str(tmp_path / "run"))
    for step in range(3):
        faults.before_step(hooks, step, rank=1)
    faults.before_step(hooks, 3, rank=0)  # other rank: no failure
    with pytest.raises(faults.FaultInjected, match="step 3|RAYSTREAM_FAIL_AT_STEP=3"):
        faults.before_step(hooks, 3, rank=1)
    faults.before_step(hooks, 3, rank=1)  # the restarted worker goes past it
    assert (tmp_path / "run" / ".fault_injected_step3").is_file()


def test_no_hooks_without_env(monkeypatch):
    monkeypatch.delenv("RAYSTREAM_FAIL_AT_STEP", raising=False)
    monkeypatch.delenv("RAYSTREAM_STEP_DELAY_S", raising=False)
    assert faults.from_env(None, "r") == {}
    faults.before_step({}, 0, 0)
