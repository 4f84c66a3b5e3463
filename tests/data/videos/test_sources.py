"""Bad input is caught before the stream starts, naming the file and the problem; `on_bad_video=skip` skips it
with a warning and records it; listings (directory, manifests) resolve to the right files."""

from __future__ import annotations

import shutil
import time
from fractions import Fraction

import av
import numpy as np
import pytest
from rs_data_helpers import data_cfg, read_block, stream_cfg, write_block_video

from raystream.data import DataError, build_stream
from raystream.data.decode.backends import installed_decoders
from raystream.data.videos.listing import resolve_videos


def _zero_frames(path):
    with av.open(str(path), "w") as c:  # an AVI with a video stream and not one frame
        s = c.add_stream("mpeg4", rate=Fraction(30))
        s.width = s.height = 32
        s.pix_fmt = "yuv420p"
        c.start_encoding()


def _audio_only(path):
    with av.open(str(path), "w") as c:
        s = c.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.rate = 16000
        for i in range(10):
            frame.pts = i * 1024
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    good = write_block_video(d / "good.mp4", 5, 30)
    write_block_video(d / "fast.mp4", 6, 30, gop=5, faststart=True)
    data = (d / "good.mp4").read_bytes()
    (d / "truncated.mp4").write_bytes(data[: len(data) // 2])  # index (moov) at the end: cut off
    fast = (d / "fast.mp4").read_bytes()
    (d / "truncated_payload.mp4").write_bytes(fast[: int(len(fast) * 0.6)])  # index intact, frames cut off
    (d / "not_a_video.mp4").write_text("this is a text file, not a video\n" * 50)
    (d / "empty.mp4").write_bytes(b"")
    _zero_frames(d / "zero_frames.avi")
    _audio_only(d / "audio_only.mp4")
    write_block_video(d / "short.mp4", 7, 3)
    return d, str(good)


BAD = [
    ("missing.mp4", "file not found"),
    ("not_a_video.mp4", "cannot open it as a video"),
    ("empty.mp4", "empty file"),
    ("truncated.mp4", "cannot open it as a video"),
    ("truncated_payload.mp4", "(truncated or corrupt|cannot open)"),
    ("zero_frames.avi", "zero frames"),
    ("audio_only.mp4", "no video stream"),
    ("short.mp4", "shorter than one clip"),
]


@pytest.mark.parametrize("decoder", ["decord", "pyav"])
@pytest.mark.parametrize("name, problem", BAD, ids=[b[0] for b in BAD])
def test_bad_video_is_an_error_naming_the_file(bad_files, name, problem, decoder):
    d, good = bad_files
    bad = str(d / name)
    with pytest.raises(DataError, match=problem) as err:
        build_stream(data_cfg([good, bad], decoder=decoder), stream_cfg(frames_per_clip=3, fps=15.0))
    assert bad in str(err.value) and "on_bad_video=skip" in str(err.value)
    assert good not in str(err.value)


def test_skip_warns_records_and_streams_the_good_videos(bad_files):
    d, good = bad_files
    bad = [str(d / name) for name, _ in BAD]
    with pytest.warns(UserWarning, match="skipping bad video") as record:
        stream = build_stream(data_cfg([bad[0], good, *bad[1:]], on_bad_video="skip"), stream_cfg(batch_size=2))
    assert len(record) == len(BAD)
    assert [p for p, _ in stream.skipped] == bad
    assert [v.path for v in stream.videos] == [good]
    batches = list(stream.batches())
    assert len(batches) == stream.num_steps > 0
    for b in batches:
        for i, ref in enumerate(b.clips):
            assert ref.video == good
            assert [read_block(b.frames[i, j]) for j in range(3)] == [(5, f) for f in ref.frames]


def test_skip_with_nothing_left_is_an_error(bad_files):
    d, _ = bad_files
    with pytest.warns(UserWarning), pytest.raises(DataError, match="no usable video"):
        build_stream(data_cfg([str(d / "not_a_video.mp4")], on_bad_video="skip"), stream_cfg())


def test_a_stuck_decode_is_a_bounded_failure(bad_files, tmp_path, monkeypatch):
    d, _ = bad_files
    fresh = shutil.copy(d / "good.mp4", tmp_path / "slow.mp4")  # not in the probe cache
    # the probe child's decode takes 30 s (a stuck decode): a 1 ms time-out alone raced the child on a busy machine,
    # whose answer could already be waiting when the driver began to wait for it
    monkeypatch.setenv("RAYSTREAM_PROBE_DELAY_S", "30")
    started = time.monotonic()
    with pytest.raises(DataError, match="decode_timeout_s") as err:
        build_stream(data_cfg([fresh], decode_timeout_s=0.5), stream_cfg())
    assert time.monotonic() - started < 25  # ended by the time-out, not by the decode
    assert "slow.mp4" in str(err.value)


def test_a_decoder_stuck_on_a_file_is_passed_over_and_the_next_reads_it(bad_files, tmp_path, monkeypatch):
    """The first decoder auto tries hangs on the file (the probe child sleeps in it): that decoder is named as
    passed over and a fresh child probes the file with the others, where before the file was refused."""
    d, _ = bad_files
    first, *rest = installed_decoders()
    if not rest:
        pytest.skip("one decoder installed here: nothing to pass on to")
    fresh = shutil.copy(d / "good.mp4", tmp_path / "stuck_in_one.mp4")  # not in the probe cache
    monkeypatch.setenv("RAYSTREAM_PROBE_DELAY_S", "60")
    monkeypatch.setenv("RAYSTREAM_PROBE_DELAY_IN", first)
    with pytest.warns(UserWarning, match="stuck_in_one.mp4"):  # the warning naming the decoder passed over
        stream = build_stream(data_cfg([fresh], decoder="auto", decode_timeout_s=10.0), stream_cfg())
    video = stream.videos[0]
    assert video.decoder("auto") == rest[0] and video.num_frames == 30
    assert video.pyav_because == f"{first}: {first} did not finish decoding within data.decode_timeout_s = 10.0s"
    batch = next(iter(stream))
    assert read_block(batch.frames[0, 0])[1] == batch.clips[0].frames[0]


def test_directory_and_manifests(bad_files, tmp_path):
    d, good = bad_files
    vids = tmp_path / "vids"
    vids.mkdir()
    for name in ("b.mp4", "a.mp4"):
        shutil.copy(good, vids / name)
    (vids / "notes.txt").write_text("not listed")
    assert [e.path for e in resolve_videos(str(vids))] == [str(vids / "a.mp4"), str(vids / "b.mp4")]
    (tmp_path / "list.txt").write_text("# comment\nvids/b.mp4\n\nvids/a.mp4\n")
    assert [e.path for e in resolve_videos(str(tmp_path / "list.txt"))] == [str(vids / "b.mp4"),
                                                                            str(vids / "a.mp4")]
    (tmp_path / "m.csv").write_text("path,label\nvids/a.mp4,cat\nvids/b.mp4,dog\n")
    assert [(e.path, e.label) for e in resolve_videos(str(tmp_path / "m.csv"))] == [
        (str(vids / "a.mp4"), "cat"), (str(vids / "b.mp4"), "dog")]
    stream = build_stream(data_cfg(str(tmp_path / "m.csv")), stream_cfg())
    assert [v.label for v in stream.videos] == ["cat", "dog"]


@pytest.mark.parametrize("spec, problem", [
    ("missing_manifest.txt", "manifest file not found"),
    ("emptydir", "holds no video files"),
    ("nopath.csv", "needs a `path` column"),
    ([], "empty list"),
])
def test_bad_listings_name_the_key(tmp_path, spec, problem):
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "nopath.csv").write_text("file,label\na.mp4,x\n")
    spec = str(tmp_path / spec) if isinstance(spec, str) else spec
    with pytest.raises(DataError, match=problem) as err:
        resolve_videos(spec)
    assert "data.videos" in str(err.value) or "nopath.csv" in str(err.value)


def test_fps_override_changes_the_stride(bad_files):
    _, good = bad_files
    stream = build_stream(data_cfg([good], fps=60.0), stream_cfg(frames_per_clip=3, fps=15.0))
    assert stream.geometry[0].stride == 4 and stream.clip_refs(0)[0][2].frames == [0, 4, 8]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_file_that_goes_bad_mid_run_raises_naming_it(bad_files, tmp_path, prefetch):
    _, good = bad_files
    copy = shutil.copy(good, tmp_path / "vanishing.mp4")
    stream = build_stream(data_cfg([copy], prefetch=prefetch), stream_cfg(batch_size=2))
    (tmp_path / "vanishing.mp4").write_text("overwritten: no longer a video")
    with pytest.raises(DataError, match="vanishing.mp4"):
        list(stream.batches())
