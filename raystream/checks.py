"""Range checks of config values, declared by the package that owns each config section.

A package's `config.py` lists its checks as `Check(key, predicate, expected)` with keys relative to its section
("" is the section itself, for checks across its fields); `raystream.config` runs every package's list on the
composed config and names the full dotted key in its error. Plain Python: imports nothing of raystream.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence


class Check(NamedTuple):
    """`predicate(value)` is True for every value raystream accepts at `key`; `expected` says what those are."""

    key: str
    predicate: Callable[[Any], bool]
    expected: str


def options_text(options: Sequence[str]) -> str:
    """`a, b or c`: the options of a key, as error messages spell them."""
    opts = list(options)
    return opts[0] if len(opts) == 1 else f"{', '.join(opts[:-1])} or {opts[-1]}"


def is_path_name(value: Any) -> bool:
    """`value` can name one directory inside another: not empty, not `.` or `..`, no path separator, no leading
    dot or surrounding spaces, no control characters (run names become `<storage>/<name>`)."""
    return (isinstance(value, str) and bool(value) and value.strip() == value and not value.startswith(".")
            and not any(c in value for c in "/\\") and value.isprintable())


PATH_NAME = "a name without '/', '\\', a leading '.' or surrounding spaces (it names a directory)"


def one_of(key: str, options: Sequence[str]) -> Check:
    """The value is one of `options`."""
    allowed = tuple(options)
    return Check(key, lambda v: v in allowed, f"one of {options_text(allowed)}")
