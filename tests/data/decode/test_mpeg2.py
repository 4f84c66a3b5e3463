"""MPEG-2 video with B-frames in a program stream (.mpg: cameras, DVDs) and a transport stream (.ts: broadcast, many
cameras), with open GOPs and, in the transport stream, closed ones too (rs_codecs.MPEG2). PyAV reads every frame as
written, as the ffmpeg command does. decord 0.6 and torchcodec 0.13 do not: decord puts keyframes at their place in
decode order, or (closed GOPs in a transport stream) indexes the file as the container does and reads every frame
13 late; torchcodec raises "Requested next frame while there are no more frames left to decode" on a transport
stream, which refused the file under `auto` before PyAV was tried. `auto` now tries each installed decoder, passes
over each that does not read a file exactly, saying why, and streams the files exactly."""

from __future__ import annotations

import shutil
import subprocess

import av
import numpy as np
import pytest
import torch
from rs_codecs import FRAMES, MPEG2, SIDE, night_frames, write_mpeg2
from rs_data_helpers import data_cfg, read_block, stream_cfg

from raystream.data import DataError, build_stream
from raystream.data.decode import exact
from raystream.data.decode.backends import installed_decoders, open_reader
from raystream.data.decode.exact import _other_frame, checked_frames, misread, pyav_misread
from raystream.data.decode.pyav_reader import PyAVReader
from raystream.data.videos.probing import _probe_one

NAMES = [name for name, _, _, _ in MPEG2]
VIDEO_ID = {name: 5 + i for i, name in enumerate(NAMES)}  # block codes hold ids up to 15
SCATTERED = [3, 4, 17, 16, 30, 29, 47, 0, 1, 2, 14, 15, 46, 31]  # with seeks back and across keyframes 15, 30, 45
needs = {d: pytest.mark.skipif(d not in installed_decoders(), reason=f"{d} is not installed")
         for d in ("decord", "torchcodec")}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{name: path} of rs_codecs.MPEG2, and "night": a program stream of night_frames."""
    root = tmp_path_factory.mktemp("mpeg2")
    out = {name: str(write_mpeg2(root / file, VIDEO_ID[name], fmt, closed)) for name, file, fmt, closed in MPEG2}
    out["night"] = str(write_mpeg2(root / "night.mpg", 0, "mpeg", frames=night_frames()))
    return out


def _codes(frames) -> list:
    """The frame index each decoded (n, H, W, 3) frame carries."""
    frames = frames.cpu().numpy() if hasattr(frames, "cpu") else frames
    return [read_block(torch.from_numpy(np.array(f)).permute(2, 0, 1))[1] for f in frames]


@pytest.mark.parametrize("name", NAMES)
def test_the_files_hold_b_frames_and_ffmpeg_decodes_every_frame_as_written(files, name):
    path = files[name]
    with av.open(path) as container:
        assert container.format.name == ("mpegts" if path.endswith(".ts") else "mpeg")
        pts = [p.pts for p in container.demux(video=0) if p.size]
    assert len(pts) == FRAMES and pts != sorted(pts)  # B-frames: decode order is not presentation order
    with av.open(path) as container:
        assert _codes(np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])) == list(
            range(FRAMES))
    if shutil.which("ffmpeg") is None:
        return
    raw = subprocess.run(["ffmpeg", "-v", "error", "-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                         capture_output=True, check=True).stdout
    assert _codes(np.frombuffer(raw, dtype=np.uint8).reshape(-1, SIDE, SIDE, 3)) == list(range(FRAMES))


@pytest.mark.parametrize("name", NAMES)
def test_pyav_reads_every_frame_exactly(files, name):
    """In order, all at once, and with a seek for nearly every frame, back and across keyframes."""
    path = files[name]
    reader = open_reader(path, "pyav")
    assert reader.num_frames == FRAMES and reader.fps == 25.0 and reader.first_reordered == 1
    assert _codes(reader.get(range(FRAMES))) == list(range(FRAMES))
    seeking = open_reader(path, "pyav", max_read_through=1)
    assert [_codes(seeking.get([i]))[0] for i in SCATTERED] == SCATTERED
    assert pyav_misread(open_reader(path, "pyav")) is None


@pytest.mark.parametrize("name", NAMES)
def test_auto_tries_every_decoder_and_takes_one_that_reads_each_frame(files, name):
    """The probe's choice with every installed decoder a candidate: the one it takes reads each frame as written;
    each it passes over is named with its reason, and does read some frame wrong or fails on the file."""
    path = files[name]
    candidates = [d for d in installed_decoders() if d != "pyav"]
    probed = _probe_one(path, "auto", candidates)
    assert "error" not in probed and probed["num_frames"] == FRAMES
    chosen = probed["decoded_by"]
    reader = open_reader(path, chosen, max_read_through=1)
    assert [_codes(reader.get([i]))[0] for i in SCATTERED] == SCATTERED
    for decoder in candidates[:candidates.index(chosen)] if chosen in candidates else candidates:
        assert f"{decoder}: " in probed["pyav_because"]
        try:
            got = [_codes(open_reader(path, decoder).get([i]))[0] for i in SCATTERED]
        except DataError:
            continue  # it fails on the file: passed over for that
        assert got != SCATTERED, f"{decoder} reads {name} exactly, yet was passed over: {probed['pyav_because']}"


@needs["torchcodec"]
@pytest.mark.parametrize("name", ["mpeg2_ts", "mpeg2_ts_closed"])
def test_a_decoder_that_raises_on_a_file_is_passed_over_and_another_reads_it(files, name):
    """torchcodec raises near the end of a transport stream; the probe took that for the file's fault and refused
    it ("unreadable: RuntimeError: Requested next frame ..."), PyAV never tried. Now torchcodec is passed over."""
    path = files[name]
    reader = open_reader(path, "torchcodec")
    with pytest.raises(DataError, match="no more frames left to decode"):
        reader.get(range(reader.num_frames))
    probed = _probe_one(path, "auto", ["torchcodec"])
    assert probed["decoded_by"] == "pyav" and probed["num_frames"] == FRAMES
    assert probed["pyav_because"].startswith("torchcodec: torchcodec failed to decode frames")
    assert "no more frames left to decode" in probed["pyav_because"]


@needs["decord"]
def test_decord_reads_a_closed_gop_transport_stream_late_with_an_index_that_agrees(files):
    """decord indexes the file as the container does (frame count, keyframes, times) and returns frame i + 13 for
    frame i: only its frames give it away, which the check compares with PyAV's up to SHIFT_WINDOW frames away."""
    path = files["mpeg2_ts_closed"]
    pyav, decord = open_reader(path, "pyav"), open_reader(path, "decord")
    assert decord.num_frames == FRAMES and decord.keyframes == pyav.keyframes
    assert decord.frame_times == pytest.approx(pyav.frame_times, abs=1e-3)
    assert _codes(decord.get([0, 5, 20])) == [13, 18, 33]
    why = misread(decord, pyav, "decord")
    assert why.startswith("decord decodes frame 13 of the container as frame 0 (mean difference 0.0 grey levels")
    assert "checked frames i are the container's frame i+13" in why


class _ThreeLate(PyAVReader):
    """A real PyAV reader that returns frame i - 3 for frame i (frame 0 for the first three), as decord read a
    camera's MPEG-2 program stream."""

    def get(self, indices):
        return super().get([max(0, int(i) - 3) for i in indices])


def test_the_check_catches_a_constant_shift_where_neighbouring_frames_look_alike(files, monkeypatch):
    """At night a frame differs from its neighbours by the sensor's noise, about as much from the next as from
    three later: compared with frames i - 1 and i + 1 only (the check before), frames three late pass; compared
    with the frames around, each is the container's frame i - 3 to the grey level."""
    path = files["night"]
    pyav = open_reader(path, "pyav")
    assert misread(open_reader(path, "pyav"), pyav, "pyav") is None
    past_start = [i for i in checked_frames(pyav) if i >= 3]
    why = _other_frame(_ThreeLate(path), pyav, "late", past_start)
    assert why.startswith("late decodes frame ") and "(mean difference 0.0 grey levels" in why
    assert f"{len(past_start)} of the {len(past_start)} checked frames i are the container's frame i-3" in why
    assert misread(_ThreeLate(path), pyav, "late") is not None
    monkeypatch.setattr(exact, "SHIFT_WINDOW", 1)
    assert _other_frame(_ThreeLate(path), pyav, "late", past_start) is None


@pytest.mark.filterwarnings("ignore:.*would read:UserWarning")  # decord and torchcodec passed over: said above
@pytest.mark.parametrize("decoder", ["auto", "pyav"])
def test_a_stream_over_them_gives_the_frames_its_clips_name(files, decoder):
    """Probed in the child process as before Ray, then shuffled clips with a seek for nearly every frame."""
    paths = [files[name] for name in NAMES]
    stream = build_stream(data_cfg(paths, decoder=decoder, max_read_through=1, decode_workers=1),
                          stream_cfg(order="shuffled", batch_size=4, frames_per_clip=3, fps=12.5))
    assert [v.num_frames for v in stream.videos] == [FRAMES] * len(NAMES)
    seen = set()
    for batch in stream.batches():
        for i, ref in enumerate(batch.clips):
            vid = VIDEO_ID[NAMES[paths.index(ref.video)]]
            assert [read_block(batch.frames[i, j]) for j in range(3)] == [(vid, f) for f in ref.frames]
            seen.add(vid)
    assert seen == set(VIDEO_ID.values())
