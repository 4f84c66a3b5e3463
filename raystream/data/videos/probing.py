"""Checking every listed video before a stream starts: its frame count, fps and size, read by the decoder.

`probe_videos` opens each file with the configured decoder in a child process (`python -m
raystream.data.videos.probing`) and decodes its first and last frames, so a missing, non-video, truncated/corrupt or
empty file is reported by name before training; and a file that makes the decoder hang or abort costs at most
`decode_timeout_s` (per decoder tried) and becomes an error, not a frozen sweep: where one of auto's decoders (or
the configured one) hangs or aborts on it, that decoder is passed over, named, and the next probes the file in a
fresh child. Each file gets the decoder that reads it exactly
(decode/exact.py): the configured one, or with `auto` the first installed in auto's order (decode/backends.py); a file the
configured (preferred) decoder would read wrong or cannot open goes to the next, PyAV at the latest
(`VideoInfo.decoded_by`, why in `VideoInfo.pyav_because`); a file PyAV does not read exactly either is refused here,
named with each decoder's reason, before any training starts; see docs/videos.md.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from raystream.data.decode.backends import auto_order, installed_decoders, open_reader, unavailable
from raystream.data.decode.exact import misread, pyav_misread
from raystream.data.errors import DataError, first_line
from raystream.data.videos.listing import VideoEntry, VideoInfo

_CACHE: Dict[tuple, Tuple[Optional[VideoInfo], Optional[str]]] = {}


def _cache_key(path: str, decoder: str, device: str) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns, decoder, device)


def probe_videos(entries: Sequence[VideoEntry], decoder: str, timeout_s: float,
                 fps_override: Optional[float] = None,
                 device: str = "cpu") -> Tuple[List[VideoInfo], List[Tuple[str, str]]]:
    """(good videos in order, [(path, problem)] for the bad ones). Results are cached per (file, size, mtime).
    A configured decoder that is not installed is a DataError saying so, before any file is opened. `device`: where
    the stream decodes (data.decode_device), which sets auto's order of decoders."""
    if decoder not in ("auto", "pyav") and unavailable(decoder) is not None:
        raise DataError(f"data.decoder = {decoder}: {unavailable(decoder)}; data.decoder=auto uses what is installed "
                        f"({', '.join(installed_decoders())})")
    results: Dict[int, Tuple[Optional[VideoInfo], Optional[str]]] = {}
    todo: List[int] = []
    for i, e in enumerate(entries):
        if not os.path.exists(e.path):
            results[i] = (None, "file not found")
        elif not os.path.isfile(e.path):
            results[i] = (None, "not a regular file")
        elif not os.access(e.path, os.R_OK):
            results[i] = (None, "not readable (permission denied)")
        elif os.path.getsize(e.path) == 0:
            results[i] = (None, "empty file (0 bytes): not a video")
        else:
            key = _cache_key(e.path, decoder, device)
            if key in _CACHE:
                results[i] = _CACHE[key]
            else:
                todo.append(i)
    for i, res in _probe_in_child([entries[i].path for i in todo], decoder, timeout_s, device).items():
        results[todo[i]] = res
        key = _cache_key(entries[todo[i]].path, decoder, device)
        if key is not None:
            _CACHE[key] = res
    good: List[VideoInfo] = []
    bad: List[Tuple[str, str]] = []
    for i, e in enumerate(entries):
        info, problem = results[i]
        if problem is not None:
            bad.append((e.path, problem))
            continue
        fps = float(fps_override) if fps_override else info.fps
        if not fps or fps <= 0:
            bad.append((e.path, "the container gives no frame rate: set data.fps"))
            continue
        good.append(VideoInfo(e.path, info.num_frames, fps, info.height, info.width, e.label,
                              pyav_because=info.pyav_because, decoded_by=info.decoded_by))
    return good, bad


def _probe_in_child(paths: List[str], decoder: str, timeout_s: float, device: str) -> Dict[int, tuple]:
    """Probe `paths` in child processes; a hang past `timeout_s` or a crash moves on. In a decoder the child was
    trying (it says which before each), that decoder is passed over for that file, named with why, and the file is
    probed again by a fresh child with the others; in PyAV's own reading of the file, the file is bad."""
    out: Dict[int, tuple] = {}
    known: Dict[int, List[List[str]]] = {}  # file -> [decoder, why] of the decoders that hung or crashed on it
    start = 0
    while start < len(paths):
        proc = subprocess.Popen([sys.executable, "-m", "raystream.data.videos.probing", decoder,
                                 *_candidates(decoder, device)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        proc.stdin.write(json.dumps([[p, known.get(start + k, [])] for k, p in enumerate(paths[start:])]))
        proc.stdin.close()
        lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        current, started, trying = start, False, None
        while current < len(paths):
            try:  # before the first file the child is still starting Python and importing the decoder
                line = lines.get(timeout=timeout_s if started else timeout_s + 60.0)
            except queue.Empty:
                proc.kill()
                proc.wait()
                within = f"within data.decode_timeout_s = {timeout_s}s"
                current = _failed(out, known, current, trying, f"did not finish decoding {within}",
                                  f"decoding did not finish {within} (a stuck decode: the file is likely corrupt)")
                break
            if line is None:  # the child died (e.g. a native abort inside the decoder)
                code = proc.wait()
                current = _failed(out, known, current, trying, f"crashed on it (exit code {code})",
                                  f"the {trying or decoder} decoder crashed on it (exit code {code}): corrupt file")
                break
            msg = json.loads(line)
            if "started" in msg or "trying" in msg:
                current, started, trying = start + msg.get("started", current - start), True, msg.get("trying")
                continue
            i = start + msg["i"]
            if msg.get("error"):
                out[i] = (None, msg["error"])
            else:
                out[i] = (VideoInfo(paths[i], msg["num_frames"], msg["fps"], msg["height"], msg["width"],
                                    pyav_because=msg.get("pyav_because"), decoded_by=msg.get("decoded_by")), None)
            current = i + 1
        else:
            proc.wait()
        start = current
    return out


def _failed(out: Dict[int, tuple], known: Dict[int, List[List[str]]], current: int, trying: Optional[str],
            why: str, bad_file: str) -> int:
    """After the child hung or died on file `current` while `trying` a decoder: that decoder is passed over for the
    file (`why`) and the file is probed again (returns `current`); in PyAV's own reading (or before any decoder),
    the file is bad (`bad_file`) and the next one is probed (returns `current + 1`)."""
    if trying is not None and trying != "pyav":
        known.setdefault(current, []).append([trying, f"{trying} {why}"])
        return current
    out[current] = (None, bad_file)
    return current + 1


def _candidates(decoder: str, device: str = "cpu") -> List[str]:
    """The decoders the probe tries on each file before PyAV: `decoder`, or with `auto` each of auto's order for
    `device` that loads."""
    if decoder == "auto":  # installed or not: the child loads each when a file first needs it
        return [d for d in auto_order(device) if d != "pyav"]
    return [] if decoder == "pyav" else [decoder]


def _pump(stream, lines: "queue.Queue[Optional[str]]") -> None:
    with stream:  # closed at the child's end (exit, crash or kill), so no pipe is left to the garbage collector
        for line in stream:
            if line.strip():
                lines.put(line)
    lines.put(None)


def _probe_one(path: str, decoder: str, candidates: Optional[List[str]] = None,
               on_first_load: Optional[Callable[[], None]] = None,
               on_try: Optional[Callable[[str], None]] = None, known: Sequence[Sequence[str]] = ()) -> dict:
    """Open `path`, decode its first and last frames; a dict with the facts or an `error`.

    The container is read with PyAV first (its FFmpeg messages say what is wrong: no video stream, zero frames,
    invalid data), and its packets must hold the frames the container states (PyAVReader.truncation). Then each
    candidate decoder (`data.decoder`, or with `auto` the installed ones in order) must open the file, index it as
    the container does and decode the frames PyAV decodes (exact.misread) and its first and last frames; the first
    that does reads the file (`decoded_by`), PyAV where none does (`pyav_because` says why each was passed over). A
    candidate that fails on the file in any way (an error of its own library included) is passed over, saying so:
    it is a decoder that does not read this file, not a file that cannot be read. PyAV must itself find each frame
    from the start to past the first B-frame (exact.pyav_misread) wherever a check compares with its frames or it
    reads the file; a file no decoder reads exactly is an error naming each decoder's reason. `on_try(name)` is
    called before each candidate is tried and before PyAV's own reading ("pyav"); `known`: [decoder, why] of
    candidates passed over already (they hung or crashed on this file in an earlier child), not tried again.
    """
    opened = []
    try:
        facts = open_reader(path, "pyav", max_read_through=1 << 30)
        opened.append(facts)
        if facts.num_frames <= 0:
            return {"error": "has zero frames"}
        cut = facts.truncation()
        if cut is not None:
            return {"error": f"truncated or corrupt: {cut}"}
        pyav_wrong = pyav_misread(facts)
        reader, chosen, passed = facts, "pyav", []
        for name in _candidates(decoder) if candidates is None else candidates:
            if decoder == "auto" and _loads(name, on_first_load) is not None:
                continue  # not installed here: auto passes it over without a word
            if name in dict(known):
                because = dict(known)[name]
            else:
                if on_try is not None:
                    on_try(name)
                because = _verdict(path, name, facts, pyav_wrong is None, opened)
            if because is None:
                reader, chosen = opened[-1], name
                break
            passed.append(f"{name}: {because}" if decoder == "auto" else because)
        if reader is facts and on_try is not None:
            on_try("pyav")
        problem = (pyav_wrong or _ends(facts, path)) if reader is facts else None
        if problem is not None:  # PyAV's own failure alone (no other decoder tried) is the file's problem
            return {"error": problem if not passed and pyav_wrong is None else "read exactly by no decoder here: "
                    + "; ".join([p if decoder == "auto" else f"{decoder}: {p}" for p in passed] + [f"pyav: {problem}"])}
        return {"num_frames": reader.num_frames, "fps": reader.fps, "height": reader.height, "width": reader.width,
                "pyav_because": "; ".join(passed) or None, "decoded_by": chosen}
    except DataError as exc:
        return {"error": _strip_path(str(exc), path)}
    except Exception as exc:  # noqa: BLE001 - PyAV failing on the container is a property of this file, named
        return {"error": f"unreadable: {type(exc).__name__}: {exc}"}
    finally:
        for r in opened:
            r.close()


def _verdict(path: str, name: str, facts, pixels: bool, opened: list) -> Optional[str]:
    """Why decoder `name` does not read `path` exactly (None when it does): it cannot open it, its index or its
    frames are not the container's (exact.misread, its frames compared with PyAV's `facts` where `pixels`), it
    cannot decode the first or last frame, or it fails in any other way (its library's own errors, e.g.
    torchcodec's "Requested next frame while there are no more frames left to decode"). The reader it opened is
    appended to `opened`."""
    try:
        opened.append(open_reader(path, name, max_read_through=1 << 30))
        return misread(opened[-1], facts, name, pixels=pixels) or _ends(opened[-1], path)
    except DataError as exc:  # PyAV reads the container, this decoder cannot
        return _strip_path(str(exc), path)
    except Exception as exc:  # noqa: BLE001 - whatever a decoder raises on this file, it does not read it
        return f"{name} fails on it: {type(exc).__name__}: {first_line(exc)}"


def _loads(name: str, on_first_load: Optional[Callable[[], None]]) -> Optional[str]:
    """Why decoder `name` cannot load here (None when it loads), imported the first time a file needs it (a file
    decord reads never pays for importing torchcodec); `on_first_load` runs after that first import."""
    first = name not in _ASKED
    _ASKED.add(name)
    why = unavailable(name)
    if first and on_first_load is not None:
        on_first_load()
    return why


_ASKED: set = set()  # the decoders this process has tried to load


def _ends(reader, path: str) -> Optional[str]:
    """What keeps `reader` from reading the video's first and last frames; None when it reads both."""
    n = reader.num_frames
    if n <= 0:
        return "has zero frames"
    if reader.height <= 0 or reader.width <= 0:
        return f"unreadable video stream ({reader.width}x{reader.height} frames)"
    try:
        reader.get([0])
    except DataError as exc:
        return f"unreadable: frame 0 does not decode ({_strip_path(str(exc), path)})"
    try:
        last = reader.get([n - 1])
    except DataError as exc:
        return (f"truncated or corrupt: the container claims {n} frames but frame {n - 1} does not decode "
                f"({_strip_path(str(exc), path)})")
    if last.shape[0] != 1:
        return f"truncated or corrupt: frame {n - 1} of the claimed {n} does not decode"
    return None


def _strip_path(message: str, path: str) -> str:
    return message[len(path) + 2:] if message.startswith(path + ": ") else message


def _child_main() -> None:
    decoder, candidates = sys.argv[1], sys.argv[2:]
    files = json.loads(sys.stdin.read())  # [path, [[decoder, why it was passed over], ...]] each
    # import PyAV and the first decoder that loads (and has not hung or crashed on the first file) before the first
    # file's clock starts; auto's later ones load when a file first needs them, and the clock starts again after
    _loads("pyav", None)
    for name in candidates:
        if name not in dict(files[0][1] if files else ()) and _loads(name, None) is None:
            break
    # a test hook: every file's decode takes at least this long (with RAYSTREAM_PROBE_DELAY_IN, only that decoder's
    # part of it), a stuck decode the tests can rely on
    delay_s = float(os.environ.get("RAYSTREAM_PROBE_DELAY_S", "0"))
    delay_in = os.environ.get("RAYSTREAM_PROBE_DELAY_IN")

    def trying(name: str) -> None:
        print(json.dumps({"trying": name}), flush=True)
        if delay_s and name == delay_in:
            time.sleep(delay_s)

    for i, (path, known) in enumerate(files):
        print(json.dumps({"started": i}), flush=True)
        if delay_s and not delay_in:
            time.sleep(delay_s)
        restart = functools.partial(print, json.dumps({"started": i}), flush=True)
        print(json.dumps({"i": i, **_probe_one(path, decoder, candidates, restart, trying, known)}), flush=True)


if __name__ == "__main__":
    _child_main()
