"""studies/: every study of docs/results.md reruns from the tree (`bash studies/run.sh <study>`). Each queue names
sweeps and experiments that exist, labels its steps once (a label is what marks a step done, so a resumed study
skips exactly the finished ones), and the script refuses an unknown study naming the file it expected."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies"
QUEUES = sorted(STUDIES.glob("*.queue"))


def steps(queue: Path):
    for line in queue.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            label, _, rest = line.partition(" ")
            yield label, rest.split()


def test_there_are_studies():
    assert {q.stem for q in QUEUES} >= {"map", "projection", "ablations", "matched", "table1_mini", "seeds"}


@pytest.mark.parametrize("queue", QUEUES, ids=lambda q: q.stem)
def test_a_queue_names_sweeps_and_experiments_that_exist_and_labels_each_step_once(queue):
    labels = [label for label, _ in steps(queue) if label != "report"]
    assert len(labels) == len(set(labels)), f"{queue.name}: a label twice: {labels}"
    for label, args in steps(queue):
        for arg in args:
            m = re.fullmatch(r"\+?(sweep|experiment)=(\w+)", arg)
            if m:
                path = ROOT / "sweeps" / m.group(1) / f"{m.group(2)}.yaml"
                assert path.is_file(), f"{queue.name}, step {label}: {arg} names no {path.relative_to(ROOT)}"


def test_status_lists_every_step_of_a_study(tmp_path):
    out = subprocess.run(["bash", str(STUDIES / "run.sh"), "--status", "matched"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RAYSTREAM_STUDY_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{label}: not done" for label, _ in steps(STUDIES / "matched.queue")]


def test_an_unknown_study_is_refused_naming_the_file_it_expected(tmp_path):
    out = subprocess.run(["bash", str(STUDIES / "run.sh"), "no_such_study"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RAYSTREAM_STUDY_DIR": str(tmp_path)})
    assert out.returncode == 2
    assert "studies/no_such_study.queue" in out.stderr
    assert not any(tmp_path.iterdir()), "nothing is written for a study that does not exist"
