"""The JSON objects `raystream bench` writes (report.py), read back and checked, beside the code that writes them.

`read_json(path, where)`: one `raystream bench --json PATH` object, for `raystream plan --rate-from` (ConfigError
naming `where`, e.g. "--rate-from bench.json", and what is wrong: no file, not JSON, not an object, a bench stopped at
a failed check, an `--eval` or `--decoders` object, a steps/s that is not a number > 0).

`shipped_campaign()`: the rates raystream ships (SHIPPED_FILE, package data): the GPU campaign's per-preset bench
objects, in the layout campaign.py writes (campaign.json: the campaign's device, date and commit; `presets` {name:
{preset, overrides, stream_order, bench}}), cut to the keys `raystream plan` reads, each checked as a --rate-from file
is. They are the figures docs/benchmarks.md reports for the campaign run that `source` names; a later campaign on the
same kind of node replaces them by writing this file anew.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any, Dict

from raystream.config import ConfigError

# What a bench object must hold for a rate (the `--eval` and `--decoders` objects hold none of them).
RATE_KEYS = ("scenario", "backbone", "frames_per_clip", "resolution", "device", "batch_size",
             "from_memory_steps_per_s")
SHIPPED_FILE = "h200_campaign.json"
_EXPECTED = "expected the object `raystream bench --json PATH` writes"


def read_json(path: str, where: str) -> Dict[str, Any]:
    """The bench object in the file at `path`, checked (`check_rates`); ConfigError naming `where` otherwise."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file (expected the JSON object `raystream bench --json PATH` writes)") \
            from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    try:
        r = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not JSON ({exc}); {_EXPECTED}") from None
    return check_rates(r, where)


def check_rates(r: Any, where: str) -> Dict[str, Any]:
    """`r` when it is a bench object with a rate: RATE_KEYS present, its steps/s numbers > 0."""
    if not isinstance(r, dict):
        raise ConfigError(f"{where}: a JSON {type(r).__name__}, expected the object `raystream bench --json` writes")
    if "check_failed" in r:
        raise ConfigError(f"{where}: the bench stopped at a failed check ({r['check_failed'].get('name')}) before "
                          "timing any step: no rate in it")
    missing = [k for k in RATE_KEYS if k not in r]
    if missing:
        raise ConfigError(f"{where}: lacks {', '.join(missing)}: {_EXPECTED} (not `--eval` or `--decoders`)")
    for key in ("from_memory_steps_per_s", "live_steps_per_s"):
        value = r.get(key)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ConfigError(f"{where}: `{key}` = {value!r}, expected a number of steps/s > 0")
    return r


def shipped_campaign() -> Dict[str, Any]:
    """SHIPPED_FILE, its presets' bench objects checked (ConfigError naming the preset: a broken install)."""
    where = f"raystream/bench/{SHIPPED_FILE}"
    campaign = json.loads(resources.files("raystream.bench").joinpath(SHIPPED_FILE).read_text())
    for key in ("device_name", "commit", "source", "presets"):
        if key not in campaign:
            raise ConfigError(f"{where}: lacks `{key}`: expected campaign.json's layout (raystream/bench/campaign.py)")
    for name, preset in campaign["presets"].items():
        check_rates(preset.get("bench"), f"{where}, preset {name}")
    return campaign


__all__ = ["RATE_KEYS", "SHIPPED_FILE", "read_json", "check_rates", "shipped_campaign"]
