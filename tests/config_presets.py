"""The configs users compose, and what each composes to: the fixture tests/config_fixtures/composed_presets.json.

Every `+experiment=`, every option of every group alone, each scenario with each stream, each experiment with each
scenario and each stream, the documented commands, and every sweep with its documented experiment (its plan's
fingerprint: the hash of every cell's config, which also names the sweep's run, so a changed one would not resume).
The tree can be restructured freely as long as all of these compose to the same values:

    .venv/bin/python tests/config_presets.py --check   # composes all of them again (minutes) and names any change
    .venv/bin/python tests/config_presets.py           # (re)writes the fixture: only when a value is meant to change

tests/test_config_tree.py composes a cheap core of them (the default, each experiment, each scenario) in the suite.

Paths that depend on the machine are normalised: RAYSTREAM_CACHE_DIR is set to /CACHE while composing, and no
user config directory is searched (the documented example's is added for its own command only).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from omegaconf import OmegaConf

from raystream import config_tree
from raystream.config import ConfigError, compose
from raystream.tune.space import plan

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "config_fixtures" / "composed_presets.json"
CACHE = "/CACHE"

# The user's data each paper experiment requires (`${required:...}`), as tests/test_experiments.py gives it.
REQUIRED = {
    "dora_paper": ["data.videos=/data/wt_venice.mp4", "eval.dataset=/data/probe"],
    "videomae_paper": ["data.videos=/data/ssv2.csv", "eval.dataset=/data/probe.csv"],
    "future_prediction_paper": ["data.videos=/data/ego4d.csv", "data.heldout_videos=/data/ego4d_heldout.csv"],
}
EXPERIMENTS = ["dora_paper", "future_prediction_paper", "multi_video", "regime", "table1_mini", "table1_start",
               "videomae_paper"]
GROUPS = {
    "data": ["moving_digits", "photo_pans", "short_walks", "walking_tour"],
    "stream": ["default", "dora", "future_prediction", "videomae"],
    "scenario": ["dora", "dora_paper", "future_prediction", "future_prediction_paper", "videomae", "videomae_paper"],
    "optimizer": ["adamw", "orthogonal_adamw", "orthogonal_adamw_099", "orthogonal_adamw_official", "orthogonal_sgd",
                  "orthogonal_torch_adamw", "sgd", "slower_adamw"],
    "trainer": ["ddp2", "gpu", "local"],
    "sweep": ["ablation_batch_size", "ablation_beta", "ablation_optimizer", "ablation_order", "batch_size", "beta",
              "matched_regime", "matched_table1_mini", "paper_table", "projection", "regime", "regime_search",
              "slower_adamw", "smoke", "table1_mini"],
}
# Each sweep with the overrides its comment documents (none: the default config).
SWEEPS = {
    "ablation_batch_size": ["+experiment=multi_video"], "ablation_order": ["+experiment=multi_video"],
    "ablation_beta": ["+experiment=regime"], "ablation_optimizer": ["+experiment=regime"],
    "matched_regime": ["+experiment=regime"], "regime": ["+experiment=regime"],
    "matched_table1_mini": ["+experiment=table1_mini"], "table1_mini": ["+experiment=table1_mini"],
    "paper_table": ["scenario=videomae", "data=moving_digits"],
    "regime_search": ["scenario=future_prediction", "data=walking_tour", "stream=future_prediction",
                      "stream.clip_shift=1", "stream.batch_size=4", "optimizer.lr=1e-3"],
    "batch_size": [], "beta": [], "projection": [], "slower_adamw": [], "smoke": [],
}
# Commands of README.md, docs/ and raystream/bench/campaign.py not covered above.
DOCUMENTED = [
    ["scenario=dora", "data=walking_tour", "stream=dora"],
    ["scenario=dora", "data=walking_tour", "stream=dora", "scenario.dora.global_crops=2"],
    ["trainer=ddp2", "optimizer=adamw", "stream.order=shuffled"],
    ["stream=dora", "data=walking_tour"],
    ["scenario=videomae_paper", "stream=videomae", "trainer=gpu", "trainer.num_workers=8"],
    ["+experiment=table1_start", "trainer.seed=1", "trainer.run_name=table1_start_s1"],
    ["+experiment=dora_paper", "trainer.num_workers=1", "stream.batch_size=32", "data=walking_tour",
     "data.videos=null", "data.heldout_videos=null", "eval.dataset=null", "eval.metrics=[]"],
    ["+experiment=videomae_paper", "trainer.num_workers=8", "stream.batch_size=512", "data=walking_tour",
     "data.videos=null", "data.heldout_videos=null", "eval.dataset=null", "eval.metrics=[]"],
    ["+experiment=future_prediction_paper", "trainer.num_workers=1", "stream.batch_size=16", "data=walking_tour",
     "data.videos=null", "data.heldout_videos=null", "eval.dataset=null", "eval.metrics=[]"],
]
EXAMPLE = (ROOT / "docs" / "examples", ["+experiment=my_stream"])  # docs/extending.md's --config-dir example
FULL = 12  # the first combinations (the default, each experiment, the data options) keep their whole config


def experiment(name: str) -> List[str]:
    return [f"+experiment={name}", *REQUIRED.get(name, [])]


def combinations() -> List[List[str]]:
    """Every combination of overrides the fixture holds, the default and the experiments first."""
    combos: List[List[str]] = [[]] + [experiment(e) for e in EXPERIMENTS]
    combos += [[f"{group}={option}"] for group, options in GROUPS.items() for option in options]
    combos += [[f"scenario={sc}", f"stream={st}"] for sc in GROUPS["scenario"] for st in GROUPS["stream"]]
    for e in EXPERIMENTS:
        combos += [experiment(e) + [f"{group}={option}"] for group in ("scenario", "stream")
                   for option in GROUPS[group]]
        combos.append(experiment(e) + ["optimizer=adamw"])
    combos += [SWEEPS[s] + [f"sweep={s}"] for s in SWEEPS]
    combos += DOCUMENTED
    unique: Dict[str, List[str]] = {}
    for c in combos:
        unique.setdefault(key(c), c)
    return list(unique.values())


def key(overrides: List[str]) -> str:
    return " ".join(overrides) or "(default)"


@contextmanager
def normalised_env(config_dir: Optional[Path] = None) -> Iterator[None]:
    """RAYSTREAM_CACHE_DIR=/CACHE and only `config_dir` (if given) as a user config directory, restored after."""
    saved = {k: os.environ.get(k) for k in ("RAYSTREAM_CACHE_DIR", config_tree.ENV)}
    os.environ["RAYSTREAM_CACHE_DIR"] = CACHE
    os.environ.pop(config_tree.ENV, None)
    if config_dir is not None:
        os.environ[config_tree.ENV] = str(config_dir)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def digest(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def composed(overrides: List[str]) -> Tuple[Any, Any]:
    """(the resolved config as a container, or `{"error": message}`; its sweep plan's fingerprint and cells, or
    None when the combination names no sweep)."""
    try:
        cfg = compose(overrides)
    except ConfigError as exc:
        return {"error": str(exc)}, None
    plan_of = None
    if any(o.startswith("sweep=") for o in overrides):
        try:
            sweep_plan = plan(cfg, overrides)
            plan_of = {"fingerprint": sweep_plan.fingerprint(), "cells": len(sweep_plan.cells)}
        except ConfigError as exc:
            plan_of = {"error": str(exc)}
    return OmegaConf.to_container(cfg, resolve=True), plan_of


def compose_all(only: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """{"full": {combination: config}, "sha1": {combination: hash of its config}, "plans": {...}} of every
    combination, or of those whose key is in `only`."""
    out: Dict[str, Any] = {"full": {}, "sha1": {}, "plans": {}}
    with normalised_env():
        for i, overrides in enumerate(combinations()):
            if only is not None and key(overrides) not in only:
                continue
            config, plan_of = composed(overrides)
            out["sha1"][key(overrides)] = digest(config)
            if i < FULL:
                out["full"][key(overrides)] = config
            if plan_of is not None:
                out["plans"][key(overrides)] = plan_of
    if only is None or key(EXAMPLE[1]) in only:
        with normalised_env(EXAMPLE[0]):
            out["sha1"][key(EXAMPLE[1])] = digest(composed(EXAMPLE[1])[0])
    return out


def changes(expected: Dict[str, Any], got: Dict[str, Any]) -> List[str]:
    """What differs between two `compose_all` results, over the combinations `got` holds: one line each, with the
    keys that differ where the fixture holds the whole config."""
    lines = []
    for combo, sha in got["sha1"].items():
        if expected["sha1"].get(combo) != sha:
            line = f"{combo}: composes to other values"
            if combo in expected["full"] and combo in got["full"]:
                old, new = (flatten(d["full"][combo]) for d in (expected, got))
                line += ": " + ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}"
                                         for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))
            lines.append(line)
    lines += [f"{combo}: sweep plan {expected['plans'].get(combo)} -> {p}" for combo, p in got["plans"].items()
              if expected["plans"].get(combo) != p]
    return lines


def flatten(node: Any, prefix: str = "") -> Dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix: node}
    return {k: v for name, child in node.items() for k, v in flatten(child, f"{prefix}{name}.").items()} \
        if node else {prefix: node}


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        found = changes(json.loads(FIXTURE.read_text()), compose_all())
        print("\n".join(found) or "every combination composes to the fixture's values", file=sys.stderr)
        sys.exit(1 if found else 0)
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(compose_all(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size // 1024} KB)", file=sys.stderr)
