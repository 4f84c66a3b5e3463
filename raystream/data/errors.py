"""The one exception of raystream.data: bad input (a file, a key) named together with what is wrong with it; and
the two pieces a decoder's message is made of (an exception's first line, a span of frame indices)."""

import re
from typing import Sequence


class DataError(ValueError):
    """A video, manifest, directory or data/stream key that cannot be used; the message names it and the problem."""


def first_line(exc: BaseException) -> str:
    """The exception's first line, without the `[hh:mm:ss] /source/file.cc:123: ` that decord puts before it."""
    text = str(exc).strip().splitlines()
    return re.sub(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: ", "", text[0]) if text else type(exc).__name__


def span(indices: Sequence[int]) -> str:
    return f"[{indices[0]}..{indices[-1]}]" if indices else "[]"
