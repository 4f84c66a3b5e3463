"""Where configs come from: the tree shipped in the package, then a user's own directories (env or --config-dir);
what the shipped presets compose to."""

import json
import re
import subprocess
import sys
from pathlib import Path

import config_presets
import pytest

from raystream import config_tree
from raystream.config import ConfigError, compose

CHECKOUT_SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


def test_the_shipped_tree_is_the_installed_package_data():
    shipped = config_tree.shipped_dir()
    assert (shipped / "config.yaml").is_file()
    assert sorted(p.relative_to(shipped) for p in shipped.rglob("*.yaml")) == \
        sorted(p.relative_to(CHECKOUT_SWEEPS) for p in CHECKOUT_SWEEPS.rglob("*.yaml"))


def _compose_from_a_copy(tmp_path: Path, with_sweeps: bool) -> subprocess.CompletedProcess:
    """Compose a preset in a fresh interpreter that imports a copy of the checkout from PYTHONPATH, not installed
    (no site: the editable install's finder of `raystream._sweeps` is not there), as the GPU campaign runs."""
    import shutil
    import sysconfig
    shutil.copytree(CHECKOUT_SWEEPS.parent / "raystream", tmp_path / "raystream",
                    ignore=shutil.ignore_patterns("__pycache__"))
    if with_sweeps:
        shutil.copytree(CHECKOUT_SWEEPS, tmp_path / "sweeps")
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
            "from raystream.config import compose\n"
            "from raystream import config_tree\n"
            "print(config_tree.shipped_dir()); print(compose(['+experiment=dora_paper', 'data=walking_tour', 'data.videos=null', 'eval.dataset=null',\n"
            "'eval.metrics=[]']).scenario.name)")
    return subprocess.run([sys.executable, "-S", "-c", code, str(tmp_path), sysconfig.get_paths()["purelib"]],
                          capture_output=True, text=True, timeout=120)


def test_a_checkout_imported_without_installing_reads_its_own_sweeps(tmp_path):
    run = _compose_from_a_copy(tmp_path, with_sweeps=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(tmp_path / "sweeps"), "dora"]


def test_no_tree_installed_or_beside_the_package_is_named(tmp_path):
    run = _compose_from_a_copy(tmp_path, with_sweeps=False)
    assert run.returncode == 1
    assert "package `raystream._sweeps` is missing" in run.stderr.splitlines()[-1]


def _experiment(root: Path, name: str, lr: float) -> None:
    (root / "experiment").mkdir(parents=True, exist_ok=True)
    (root / "experiment" / f"{name}.yaml").write_text(f"# @package _global_\noptimizer:\n  lr: {lr}\n")


def test_a_user_directory_adds_options_and_keeps_the_shipped_ones(tmp_path, monkeypatch):
    _experiment(tmp_path / "a", "mine", 0.0042)
    _experiment(tmp_path / "b", "theirs", 0.0007)
    monkeypatch.setenv(config_tree.ENV, f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    assert compose(["+experiment=mine"]).optimizer.lr == pytest.approx(0.0042)
    assert compose(["+experiment=theirs"]).optimizer.lr == pytest.approx(0.0007)
    assert compose(["optimizer=adamw"]).optimizer.name == "adamw"  # the shipped groups are still there
    assert config_tree.find("experiment/theirs.yaml") == tmp_path / "b" / "experiment" / "theirs.yaml"
    assert config_tree.find("sweep/smoke.yaml") == config_tree.shipped_dir() / "sweep" / "smoke.yaml"
    assert config_tree.find("sweep/nothing.yaml") is None


def test_a_shipped_name_stays_the_shipped_file(tmp_path, monkeypatch):
    """As Hydra's own --config-dir: the user's directories come after the shipped tree."""
    (tmp_path / "optimizer").mkdir()
    (tmp_path / "optimizer" / "adamw.yaml").write_text("name: adamw\nlr: 0.123\n")
    monkeypatch.setenv(config_tree.ENV, str(tmp_path))
    assert compose(["optimizer=adamw"]).optimizer.lr != pytest.approx(0.123)


def test_a_missing_user_directory_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(config_tree.ENV, str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="nope.*is not a directory"):
        compose([])


def test_hydra_searchpath_override_points_to_config_dir():
    with pytest.raises(ConfigError, match="--config-dir"):
        compose(["hydra.searchpath=[file:///tmp]"])


def test_cli_config_dir_flag(tmp_path, monkeypatch, capfd):
    """`raystream train --config-dir DIR` (relative to the working directory), run in this process."""
    from cli_driver import in_process

    _experiment(tmp_path / "own", "mine", 0.0042)
    with in_process(tmp_path, monkeypatch, capfd) as run:
        out = run("train", "+experiment=mine", "--config-dir", "own", "--cfg", "job")
        assert out.returncode == 0, out.stderr
        assert "lr: 0.0042" in out.stdout
        out = run("train", "--config-dir", "missing", "--cfg", "job")
        assert out.returncode == 2 and "missing" in out.stderr and "is not a directory" in out.stderr


# The combinations composed in the suite (cheap): the default, each experiment, each scenario alone (its clip shape),
# the documented tiny DoRA command and one sweep with its experiment. `python tests/config_presets.py --check`
# composes all of the fixture's combinations (minutes).
CORE = [config_presets.key(c) for c in [[], *(config_presets.experiment(e) for e in config_presets.EXPERIMENTS),
                                        *([f"scenario={s}"] for s in config_presets.GROUPS["scenario"]),
                                        ["scenario=dora", "data=walking_tour", "stream=dora"],
                                        ["+experiment=table1_mini", "stream=videomae"]]]


def test_the_shipped_presets_compose_to_the_fixtures_values():
    """The composed values of the shipped presets are the fixture's (tests/config_fixtures/composed_presets.json,
    written by tests/config_presets.py before the tree was restructured): moving a key between files keeps them."""
    expected = json.loads(config_presets.FIXTURE.read_text())
    got = config_presets.compose_all(only=CORE)
    assert len(got["sha1"]) == len(CORE)
    assert config_presets.changes(expected, got) == []


def test_a_group_file_writes_only_its_own_groups_keys():
    """Only experiment/ files compose across groups: every other group file has its group's package (Hydra's
    default, or `# @package <group>` for a subgroup such as stream/shape/)."""
    for path in sorted(config_tree.shipped_dir().rglob("*.yaml")):
        group = path.parent.relative_to(config_tree.shipped_dir()).parts
        if not group or group[0] == "experiment":
            continue
        header = re.match(r"#\s*@package\s+(\S+)", path.read_text())
        package = header.group(1) if header else ".".join(group)
        assert package == group[0], f"{path}: package {package}, expected {group[0]}"
