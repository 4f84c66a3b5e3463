"""Decode processes (data.decode_backend=processes, raystream/data/decode/processes.py): the same batches as threads
in every order and after a restore across kinds; a worker that dies fails the stream at once naming the video and
the worker; no child process and no shared-memory mapping outlives the stream (ended, failed, closed, at exit, and
when the parent is killed)."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch
from rs_data_helpers import data_cfg, stream_cfg

from raystream.data import DataError, build_stream
from raystream.data.config import DATA_CHECKS
from raystream.data.decode import processes
from raystream.data.decode.workers import choose_backend
from raystream.data.stream.orders import ORDERS

OVERLAP = dict(frames_per_clip=3, fps=15.0, clip_shift=1)


def _all(stream, start=0):
    return [(b.step, b.clips, b.frames) for b in stream.batches(start)]


def _children():
    """This process's decode processes still running."""
    return [p for p in psutil.Process().children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            and "raystream.data.decode.processes" in " ".join(p.cmdline())]


def _segments():
    """This process's mappings of decode processes' shared memory (memfds named raystream-decode)."""
    gc.collect()
    with open("/proc/self/maps") as f:
        return [line for line in f if "memfd:raystream-decode" in line]


@pytest.mark.parametrize("order", ORDERS)
def test_processes_decode_the_batches_threads_decode_and_resume_across_kinds(block_videos, order):
    s = stream_cfg(order=order, batch_size=2, epochs=2, **OVERLAP)
    base = _all(build_stream(data_cfg(block_videos, decode_workers=1, decode_backend="threads"), s, rank=1,
                             world_size=2))
    stream = build_stream(data_cfg(block_videos, decode_workers=3, decode_backend="processes"), s, rank=1,
                          world_size=2)
    assert stream.decode_backend == "processes"
    got = _all(stream)
    assert len(got) == len(base) > 0
    for (t, c, f), (t2, c2, f2) in zip(base, got):
        assert (t, c) == (t2, c2) and torch.equal(f, f2)
    # stopped mid-stream by processes, restored with threads (and the other way round), inline
    cut = len(base) // 2 + 1
    for first, then in (("processes", "threads"), ("threads", "processes")):
        stream = build_stream(data_cfg(block_videos, decode_workers=2, decode_backend=first), s, rank=1,
                              world_size=2)
        it = iter(stream)
        for _ in range(cut):
            next(it)
        state = json.loads(json.dumps(stream.state_dict()))
        stream.close()
        restored = build_stream(data_cfg(block_videos, decode_workers=2, decode_backend=then, prefetch=0), s,
                                rank=1, world_size=2)
        restored.load_state_dict(state)
        rest = [(b.step, b.clips, b.frames) for b in restored]
        assert [(t, c) for t, c, _ in rest] == [(t, c) for t, c, _ in base[cut:]]
        assert all(torch.equal(f, f2) for (_, _, f), (_, _, f2) in zip(rest, base[cut:]))
    assert not _children() and not _segments()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_dead_worker_fails_the_stream_at_once_naming_the_video_and_the_worker(block_videos, sig):
    s = stream_cfg(order="batch_along_time", batch_size=2, epochs=3, **OVERLAP)
    # a timeout far beyond the test: the error must come from the death, not from data.decode_timeout_s
    stream = build_stream(data_cfg(block_videos, decode_workers=2, decode_backend="processes", prefetch=0,
                                   decode_timeout_s=600.0), s)
    it = iter(stream)
    next(it)
    children = _children()
    assert len(children) == 2
    for child in children:
        os.kill(child.pid, sig)
    with pytest.raises(DataError) as err:
        for _ in it:
            pass
    text = str(err.value)
    assert f"died (killed by {sig.name})" in text and "raystream-decode-r0-" in text, text
    assert any(text.startswith(v) for v in block_videos) and "frames" in text, text
    del err, it  # the traceback holds the failed generator's frames
    assert not _children() and not _segments()


def test_closing_a_stream_midway_ends_its_processes_and_segments(block_videos):
    s = stream_cfg(order="shuffled", batch_size=2, epochs=3, **OVERLAP)
    stream = build_stream(data_cfg(block_videos, decode_workers=2, decode_backend="processes"), s)
    it = iter(stream)
    next(it)
    held = next(it)
    assert len(_children()) == 2 and _segments()  # jobs decoded ahead are held in shared memory
    stream.close()
    del it, held
    assert not _children() and not _segments()


# the parent holds the decode processes themselves, as a stream does (their exit handler and the children's watch on
# it are what is tested), without the stream: a stream would import torch, 2-3 CPU-seconds of the parent's start
_SCRIPT = textwrap.dedent("""
    import sys
    from raystream.data.decode import processes
    from raystream.data.decode.plan import Job
    videos = {videos!r}
    workers = processes.DecodeProcesses(2, [processes.ReaderRecipe(v, 32, 32, "pyav") for v in videos[:2]],
                                        processes.ReaderSettings(8))
    def job(i):
        return Job(id=i, video=i % 2, segment=0, gop=0, piece=0, first=0, last=0, frames=[i % 3, i % 3 + 1, i % 3 + 2])
    ahead = [workers.submit(job(i)) for i in range(4)]
    ahead[0].result(timeout=120)
    print("running", flush=True)
    if {mode!r} == "exit":
        sys.stdin.readline()  # once the test has listed the children (an exit before that raced the listing)
        sys.exit(0)  # jobs in flight, the workers never closed: the exit handler ends their processes
    i = 4
    while True:  # 4 jobs in flight at any time, until killed
        ahead.pop(0).result(timeout=120)
        workers.release(i - 4)
        ahead.append(workers.submit(job(i)))
        i += 1
""")


@pytest.mark.parametrize("mode", ["exit", "killed"])
def test_no_process_or_segment_outlives_its_parent(block_videos, mode):
    code = _SCRIPT.format(videos=block_videos, mode=mode)
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "running"
        children = [p for p in psutil.Process(parent.pid).children()
                    if "raystream.data.decode.processes" in " ".join(p.cmdline())]
        assert len(children) == 2
        if mode == "exit":
            parent.stdin.write("exit\n")
            parent.stdin.flush()
        if mode == "killed":
            time.sleep(0.5)  # mid-stream: jobs in flight hold segments
            parent.kill()
        parent.wait(timeout=60)
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"decode processes outlived their parent ({mode}): {alive}"
        # their shared memory has no name in /dev/shm or elsewhere: it went with the last process mapping it
    finally:
        if parent.poll() is None:
            parent.kill()


def test_decode_backend_is_checked_and_auto_picks_by_workers_device_and_platform(monkeypatch):
    check = {c.key: c for c in DATA_CHECKS}["decode_backend"]
    assert all(check.predicate(v) for v in ("auto", "threads", "processes")) and not check.predicate("fork")
    assert choose_backend("auto", 2) == "threads" and choose_backend("auto", 8) == "processes"
    assert choose_backend("auto", 16, "cuda") == "threads" and choose_backend("processes", 1) == "processes"
    with pytest.raises(ValueError, match="data.decode_backend = 'fork'"):
        choose_backend("fork", 2)
    from raystream.data.decode import workers

    monkeypatch.setattr(workers, "PROCESSES_UNSUPPORTED", "decode processes need Linux (memfd, SOCK_SEQPACKET)")
    assert choose_backend("auto", 16) == "threads"
    with pytest.raises(ValueError, match="data.decode_backend = processes: decode processes need Linux"):
        choose_backend("processes", 2)


def test_a_decoder_error_in_a_worker_reaches_the_stream_naming_the_file(block_videos, tmp_path):
    import shutil

    videos = [shutil.copy(v, tmp_path / os.path.basename(v)) for v in block_videos[:2]]
    s = stream_cfg(order="batch_along_video", batch_size=2, **OVERLAP)
    stream = build_stream(data_cfg([str(v) for v in videos], decode_workers=2, decode_backend="processes"), s)
    with open(videos[1], "r+b") as f:  # spoiled after the probe: the worker's reader meets it
        f.write(b"not a video any more" * 64)
    with pytest.raises(DataError, match=str(videos[1]).replace(".", r"\.")):
        for _ in stream:
            pass
    assert not _children()


def test_a_job_too_large_to_send_fails_naming_the_video_instead_of_waiting(block_videos):
    from raystream.data.decode.plan import Job

    recipe = processes.ReaderRecipe(block_videos[0], 32, 32, "pyav")
    workers = processes.DecodeProcesses(1, [recipe], processes.ReaderSettings(8))
    try:
        future = workers.submit(Job(0, 0, 0, 0, 0, 0, 0, frames=list(range(10 ** 5, 4 * 10 ** 5))))
        error = future.exception(timeout=60)
        assert isinstance(error, DataError) and str(error).startswith(block_videos[0]), error
        assert "could not be sent to decode worker raystream-decode-0" in str(error)
        ok = workers.submit(Job(1, 0, 0, 0, 0, 0, 0, frames=[0, 1, 2]))  # the worker still serves the next job
        assert ok.result(timeout=120).shape == (3, 3, 8, 8)
    finally:
        workers.close()
    assert not _children()
