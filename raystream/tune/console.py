"""What a sweep shows on the terminal while it runs: a line when a trial starts and when it ends, and at most one
progress line per trial every `PROGRESS_EVERY_S` seconds, each trial by its MLflow run name:

    [00:41] orth_adamw-time       started (3/4)
    [01:02] orth_adamw-time       step 10  loss 0.6953
    [01:26] orth_adamw-time       finished: step 14  loss 0.5870  eval/knn_top1 0.22

Everything else goes to the sweep's log file (`QuietRay`), whose path is printed once: Tune's status tables
(`RunConfig(verbose=0)` turns them off), the `ray` loggers' INFO/WARNING lines (the driver's: Ray's start, Tune's
own `Tuner.restore(...)` resume hint, trial tracebacks), Python warnings, and every worker's forwarded output
(Ray Train's workers, raystream's per-worker progress lines). `raystream sweep --verbose` keeps all of it on the
terminal instead, as Ray prints it.

Forwarded worker output is routed by replacing the handler Ray's `ray.init(log_to_driver=True)` installs in its
private log dispatcher (`ray._private.ray_logging`); where a Ray version lacks it, that output stays on the terminal.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from ray import tune

from raystream.tracking import names
from raystream.tune.searcher import CELL_KEY

PROGRESS_EVERY_S = 10.0  # at most one progress line per trial this often
SHOWN_METRICS = ("steps_done", names.LOSS)  # a progress line; a finished trial adds its eval/* metrics
ERROR_CHARS = 300
PRINTER = "ray_print_logs"  # the name of the dispatcher handler ray.init installs (removed by ray.shutdown)
_terminal: Optional[TextIO] = None  # while a QuietRay is started: the stdout it replaced, where progress goes


def terminal() -> TextIO:
    """Where the sweep's own lines go: the terminal, also while `QuietRay` sends stdout to the log."""
    return _terminal or sys.stdout


class SweepConsole(tune.Callback):
    """Tune callback printing one line per trial start and end and throttled progress lines (picklable: Tune
    saves it with the experiment and a resumed sweep gets it back)."""

    def __init__(self, cell_values: Sequence[Dict[str, Any]], sample_keys: Sequence[str],
                 every_s: float = PROGRESS_EVERY_S):
        self.cell_values, self.sample_keys, self.every_s = list(cell_values), list(sample_keys), every_s
        self._t0, self._total, self._started, self._last = time.time(), 0, 0, {}
        self._shown: Dict[str, str] = {}  # each trial's last progress line

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info) -> None:
        self._t0, self._total, self._started, self._last = time.time(), int(total_num_samples or 0), 0, {}
        self._shown = {}

    def name(self, trial) -> str:
        """The trial's MLflow run name (as `trial_main` gives it)."""
        config = trial.config or {}
        if CELL_KEY not in config:
            return trial.trial_id
        sampled = {k: config[k] for k in self.sample_keys if k in config}
        return names.trial_run_name(self.cell_values[int(config[CELL_KEY])], sampled)

    def say(self, trial, text: str) -> None:
        elapsed = int(time.time() - self._t0)
        print(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {self.name(trial):<24} {text}", file=terminal(), flush=True)

    def on_trial_start(self, iteration: int, trials: List, trial, **info) -> None:
        self._started += 1
        self.say(trial, f"started ({self._started}/{self._total})" if self._total else "started")
        self._last[trial.trial_id] = time.time()

    def on_trial_result(self, iteration: int, trials: List, trial, result: Dict[str, Any], **info) -> None:
        """A progress line when `every_s` have passed since the trial's last line and it shows something new: a
        trial reports its last step more than once (its evaluation, its end), each such line is printed once."""
        now, text = time.time(), metrics_text(result)
        shown = self.__dict__.setdefault("_shown", {})  # a console saved by an older raystream lacks it
        if now - self._last.get(trial.trial_id, 0.0) >= self.every_s and shown.get(trial.trial_id) != text:
            self._last[trial.trial_id], shown[trial.trial_id] = now, text
            self.say(trial, text)

    def on_trial_complete(self, iteration: int, trials: List, trial, **info) -> None:
        result = trial.last_result or {}
        evals = {k: v for k, v in result.items() if k.startswith(names.EVAL_PREFIX)}
        self.say(trial, "finished: " + metrics_text(result, evals))

    def on_trial_error(self, iteration: int, trials: List, trial, **info) -> None:
        self.say(trial, "failed" + (f": {reason}" if (reason := error_reason(trial)) else ""))


def error_reason(trial) -> str:
    """The last line of the error Tune wrote for `trial` (Ray wraps the trial's error; its last line is the
    cause), "" when there is none to read."""
    try:
        text = Path(trial.error_file).read_text() if trial.error_file else ""
    except OSError:
        return ""
    return last_line(text, ERROR_CHARS)


def last_line(text: str, max_chars: int, default: str = "") -> str:
    """The last non-empty line of `text` (Ray wraps a trial's error: its last line is the cause), cut at
    `max_chars`; `default` when there is none."""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), default)[:max_chars]


def metrics_text(result: Dict[str, Any], extra: Optional[Dict[str, Any]] = None) -> str:
    shown = {k: result[k] for k in SHOWN_METRICS if isinstance(result.get(k), (int, float))}
    shown.update(extra or {})
    return "  ".join(f"{'step' if k == 'steps_done' else k} {v:.4g}" if isinstance(v, float) else
                     f"{'step' if k == 'steps_done' else k} {v}" for k, v in shown.items())


def log_path(run_dir: Optional[Path], run_name: str) -> Path:
    """The sweep's log file: in its local Tune directory, else (a bucket) in the system temp directory."""
    directory = run_dir if run_dir is not None else Path(tempfile.gettempdir()) / "raystream"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / "sweep.log" if run_dir is not None else directory / f"{run_name}.log"


class QuietRay:
    """Once `start(log)` is called, stdout (Tune prints its experiment header there whatever its verbosity), the
    `ray` loggers, Python warnings and (after `route_worker_output`, once Ray is up) the workers' forwarded output
    write to `log`, and `terminal()` is the terminal; `close` (or leaving the `with` block) puts everything back.
    Disabled (`enabled=False`: `--verbose`), it changes nothing."""

    def __init__(self, enabled: bool = True):
        self.enabled, self.log, self._out = enabled, None, None
        self._saved: List[Any] = []
        self._routed: Optional[Tuple[Any, Any]] = None  # (our writer, Ray's printer it replaced)
        self._warnings = warnings.catch_warnings()

    def __enter__(self) -> "QuietRay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, log: Path) -> None:
        if not self.enabled or self._out is not None:
            return
        self.log, self._out = log, open(log, "a", buffering=1, encoding="utf-8")
        handler = logging.StreamHandler(self._out)
        handler.setFormatter(logging.Formatter("%(asctime)s\t%(levelname)s %(name)s -- %(message)s"))
        for lg in (logging.getLogger("ray"), logging.getLogger("py.warnings")):
            self._saved.append((lg, list(lg.handlers), lg.propagate))
            lg.handlers, lg.propagate = [handler], False
        self._warnings.__enter__()
        warnings.simplefilter("default")
        logging.captureWarnings(True)
        global _terminal
        _terminal, sys.stdout = sys.stdout, self._out

    def route_worker_output(self) -> None:
        """Send the workers' forwarded output (the dispatcher's printer, installed by ray.init) to the log."""
        if self._out is None or self._routed is not None:
            return
        try:
            # lazy: a private module of Ray, which a Ray version may lack (then nothing is routed)
            from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
        except ImportError:
            return
        printers = [handler for n, handler in dispatcher.handlers if n == PRINTER]
        if len(printers) != 1:
            return
        out = self._out

        def write(data: Dict[str, Any]) -> None:
            who = data.get("actor_name") or data.get("task_name") or ""
            pid, lines = data.get("pid"), data.get("lines", [])
            if pid == "autoscaler":  # its status every few seconds; Ray's printer too keeps only its events
                lines = [line for line in lines if ":event_summary:" in line]
            prefix = f"({pid}) " if pid in ("raylet", "autoscaler") else f"({who} pid={pid}) "
            try:
                out.write("".join(f"{prefix}{line}\n" for line in lines))
            except ValueError:  # the log is closed: the sweep ended while Ray was still forwarding
                pass

        dispatcher.remove_handler(PRINTER)
        dispatcher.add_handler(PRINTER, write)
        self._routed = (write, printers[0])

    def close(self) -> None:
        if self._out is None:
            return
        if self._routed is not None:  # Ray's printer back, unless ray.shutdown removed ours
            # lazy: Ray's private module, present since route_worker_output found it
            from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

            write, printer = self._routed
            if any(n == PRINTER and h is write for n, h in dispatcher.handlers):
                dispatcher.remove_handler(PRINTER)
                dispatcher.add_handler(PRINTER, printer)
            self._routed = None
        global _terminal
        if _terminal is not None:
            sys.stdout, _terminal = _terminal, None
        logging.captureWarnings(False)
        self._warnings.__exit__(None, None, None)
        for lg, handlers, propagate in self._saved:
            lg.handlers, lg.propagate = handlers, propagate
        self._saved = []
        self._out.close()
        self._out = None
