"""benchmarks/suite_cpu.py, the plugin that says where the suite's CPU goes (docs/suite.md): a test whose
subprocess burns a second of CPU is charged that second (also below a parent that ignores SIGCHLD, as Ray's raylet
does), a test that sleeps is not, and the controller prints the modules' totals."""

import os
import re
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

BURN = '''
import subprocess, sys, time

def test_burns_a_second_in_a_child():
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.0: pass"], check=True)

def test_sleeps():
    time.sleep(1.0)

# A parent that ignores SIGCHLD, as Ray's raylet does: the kernel reaps its child, whose CPU never reaches its cutime.
AUTO_REAPED = """
import os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
if os.fork() == 0:
    t = time.process_time()
    while time.process_time() - t < 1.5: pass
    os._exit(0)
try:
    os.wait()  # returns once the child is gone (ECHILD: it was reaped for us)
except ChildProcessError:
    pass
time.sleep(0.7)  # the parent outlives its child: the plugin sees it gone below a live parent
"""

def test_burns_in_a_child_of_a_parent_that_ignores_sigchld():
    subprocess.run([sys.executable, "-c", AUTO_REAPED], check=True)
'''


def test_a_childs_cpu_is_charged_to_its_test_and_a_sleep_is_not(tmp_path):
    (tmp_path / "test_burn.py").write_text(BURN)
    out = tmp_path / "cpu.tsv"
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS), "SUITE_CPU_OUT": str(out)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_cpu", "-q", "-p", "no:cacheprovider",
                          "test_burn.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split("\t")[2]: float(line.split("\t")[0]) for line in out.read_text().splitlines()}
    assert rows["test_burn.py::test_burns_a_second_in_a_child"] >= 0.9
    assert rows["test_burn.py::test_sleeps"] < 0.3
    assert rows["test_burn.py::test_burns_in_a_child_of_a_parent_that_ignores_sigchld"] >= 1.0  # 1.5 less 0.3
    assert "CPU-seconds by module" in run.stdout and "test_burn.py" in run.stdout


def test_the_suite_starts_by_saying_how_fast_and_loaded_the_machine_is(tmp_path):
    """tests/conftest.py's header: suite times are compared across machines by its loop figure (docs/suite.md)."""
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider",
                          str(Path(__file__).parents[1] / "test_imports.py")], cwd=Path(__file__).parents[2],
                         capture_output=True, text=True, timeout=120)
    header = next((line for line in run.stdout.splitlines() if line.startswith("machine reference:")), None)
    assert header is not None, run.stdout[-2000:] + run.stderr[-2000:]
    loop_ms, cpus = re.fullmatch(r"machine reference: a million-step Python loop in (\d+) ms \(best of 5\); load "
                                 r"average [\d.]+, [\d.]+, [\d.]+ \(1, 5, 15 min\) on (\d+) CPUs", header).groups()
    assert 0 < int(loop_ms) < 5000 and int(cpus) == os.cpu_count()
