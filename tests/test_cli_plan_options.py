"""`raystream plan` takes its options anywhere on the command line (raystream/cli.py `_parse`): before, between and
after the overrides, in their order; an unknown option still fails."""

from __future__ import annotations

import json

import pytest
from cli_driver import in_process

from raystream.cli import _parse, _parser


@pytest.mark.parametrize("argv", [
    ["plan", "--config-dir", "D", "sweep", "a=1", "b=2"],
    ["plan", "sweep", "--config-dir", "D", "a=1", "b=2"],
    ["plan", "sweep", "a=1", "--config-dir", "D", "--json", "b=2"],
    ["plan", "sweep", "a=1", "b=2", "--config-dir", "D"],
])
def test_options_go_anywhere_and_the_overrides_keep_their_order(argv):
    args = _parse(_parser(), argv)
    assert (args.kind, args.overrides, args.config_dir) == ("sweep", ["a=1", "b=2"], ["D"])


def test_an_unknown_option_or_a_stray_argument_of_another_command_still_fails(capsys):
    with pytest.raises(SystemExit) as exc:
        _parse(_parser(), ["plan", "sweep", "a=1", "--nope", "b=2"])
    assert exc.value.code == 2 and "--nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse(_parser(), ["report", "--experiment", "e", "stray"])


def test_the_reported_command_line_plans_a_user_sweep(tmp_path, monkeypatch, capfd):
    """`raystream plan sweep --config-dir DIR <overrides>` failed with "unrecognized arguments"."""
    own = tmp_path / "own" / "sweep"
    own.mkdir(parents=True)
    (own / "mine.yaml").write_text("name: mine\ngrid:\n  optimizer.lr: [0.001, 0.002]\nfixed:\n"
                                   "  trainer.max_steps: 4\n")
    with in_process(tmp_path, monkeypatch, capfd) as run:
        out = run("plan", "sweep", "--config-dir", str(tmp_path / "own"), "sweep=mine", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["trials"] == 2
