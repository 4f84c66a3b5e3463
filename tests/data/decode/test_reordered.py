"""MPEG-4 Part 2 with B-frames as DivX and Xvid files hold it (rs_codecs.REORDERED): in AVI as FFmpeg writes it (the
packets' timestamps out of order in decode order, the first at 1), in AVI with DivX's packed B-frames (the decoder
returns frames in order, stamped out of order), and with a decoder that returns frames in decode order. Each frame
read, by every decoder installed here and by a stream over the file, is the frame written there (its block code),
or the decoder is passed over, saying why; a file no decoder reads exactly is named before any stream starts."""

from __future__ import annotations

import av
import numpy as np
import pytest
import torch
from rs_codecs import FRAMES, LATE_B, REORDERED, write_reordered
from rs_data_helpers import data_cfg, read_block, stream_cfg

from raystream.data import DataError, build_stream
from raystream.data.decode.backends import installed_decoders, open_reader
from raystream.data.decode.exact import _other_frame, checked_frames, misread, pyav_misread
from raystream.data.videos.probing import _probe_one

NAMES = [name for name, _, _ in REORDERED]
VIDEO_ID = {name: 10 + i for i, name in enumerate(NAMES)}
OTHERS = [pytest.param(d, marks=pytest.mark.skipif(d not in installed_decoders(), reason=f"{d} is not installed"))
          for d in ("decord", "torchcodec")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{name: path} of REORDERED, and "untagged": packed B-frames without DivX's user data (FFmpeg's decoder
    returns none of its B-frames)."""
    root = tmp_path_factory.mktemp("reordered")
    out = {name: str(write_reordered(root / file, VIDEO_ID[name], how)) for name, file, how in REORDERED}
    out["untagged"] = str(write_reordered(root / "untagged.avi", 14, "packed_untagged"))
    return out


def _codes(frames) -> list:
    """The frame index each decoded (n, H, W, 3) frame carries."""
    frames = frames.cpu().numpy() if hasattr(frames, "cpu") else frames
    return [read_block(torch.from_numpy(np.ascontiguousarray(f)).permute(2, 0, 1))[1] for f in frames]


def _decoded(path):
    """(timestamp, frame index it carries) of every frame in the order FFmpeg's decoder returns them (PyAV, plain)."""
    with av.open(path) as container:
        return [(f.pts, _codes(f.to_ndarray(format="rgb24")[None])[0]) for f in container.decode(video=0)]


def _packet_pts(path):
    with av.open(path) as container:
        return [p.pts for p in container.demux(video=0) if p.size]


def test_the_files_hold_what_they_stand_for(files):
    """Checked on the files themselves, with PyAV only: what each lays out out of order, and where."""
    plain = _packet_pts(files["mpeg4_bframes_avi"])
    assert plain[0] == 1 and sorted(plain) == list(range(1, FRAMES + 1)) and plain != sorted(plain)
    assert [code for _, code in _decoded(files["mpeg4_bframes_avi"])] == list(range(FRAMES))
    packed = _decoded(files["mpeg4_packed_avi"])  # in order, stamped out of order
    assert [code for _, code in packed] == list(range(FRAMES))
    assert [pts for pts, _ in packed][:5] == [1, 3, 2, 5, 4]
    assert _packet_pts(files["mpeg4_packed_avi"])[:5] == [1, 2, 3, 4, 5]
    order = _decoded(files["mpeg4_decode_order_mkv"])  # out of order, stamped in order
    assert [code for _, code in order][:5] == [0, 3, 1, 2, 6]
    assert [code for _, code in sorted(order)] == list(range(FRAMES))
    late = _packet_pts(files["mpeg4_late_bframes_mkv"])  # in order up to LATE_B, then out of order
    assert late[:LATE_B + 2] == sorted(late[:LATE_B + 2]) and late[LATE_B + 2] < late[LATE_B + 1]
    assert open_reader(files["mpeg4_late_bframes_mkv"], "pyav").first_reordered == LATE_B + 1
    assert len(_decoded(files["untagged"])) < FRAMES  # its B-frames never come out of FFmpeg's decoder


@pytest.mark.parametrize("name", NAMES)
def test_pyav_reads_every_frame_as_written(files, name):
    """In order one by one, all at once, backwards (a seek each), and with a seek for nearly every frame."""
    path = files[name]
    reader = open_reader(path, "pyav")
    assert reader.num_frames == FRAMES and reader.frame_times[0] == 0.0
    assert [_codes(reader.get([i]))[0] for i in range(FRAMES)] == list(range(FRAMES))
    assert _codes(open_reader(path, "pyav").get(range(FRAMES))) == list(range(FRAMES))
    backwards = [FRAMES - 1 - i for i in range(FRAMES)]
    assert [_codes(reader.get([i]))[0] for i in backwards] == backwards
    seeking = open_reader(path, "pyav", max_read_through=1)
    scattered = [3, 4, 13, 14, 30, 29, 47, 0, 1, 2, 11, 12, 46]
    assert [_codes(seeking.get([i]))[0] for i in scattered] == scattered
    assert pyav_misread(open_reader(path, "pyav")) is None


@pytest.mark.parametrize("decoder", OTHERS)
@pytest.mark.parametrize("name", NAMES)
def test_decord_and_torchcodec_misread_them_and_are_passed_over(files, name, decoder):
    """Each reads some frame of each file wrong (read here, frame by frame, against the codes written), and the
    probe's check says why before any stream reads with it; `auto` then reads the file with PyAV, saying why."""
    path = files[name]
    pyav = open_reader(path, "pyav")
    reader = open_reader(path, decoder)
    wanted = list(range(reader.num_frames))
    try:
        got = [_codes(reader.get([i]))[0] for i in wanted]
    except DataError:  # torchcodec: cannot decode the last frame it indexed
        got = None
    assert got != wanted
    assert misread(open_reader(path, decoder), pyav, decoder) is not None
    probed = _probe_one(path, "auto", [decoder])
    assert probed["decoded_by"] == "pyav" and probed["pyav_because"].startswith(f"{decoder}: ")


@pytest.mark.skipif("torchcodec" not in installed_decoders(), reason="torchcodec is not installed")
def test_torchcodec_off_by_one_past_a_late_first_b_frame_is_caught(files):
    """torchcodec reads the late file's frames off by one from its first B-frame's keyframe on when it decodes
    through to there, but not after a seek: the times of the second, middle and last frames (the check before)
    agree with the container's, so `auto` streamed it with torchcodec; the check now reads on into that keyframe."""
    path = files["mpeg4_late_bframes_mkv"]
    pyav, reader = open_reader(path, "pyav"), open_reader(path, "torchcodec")
    old_sample = [1, FRAMES // 2, FRAMES - 1]
    assert reader.times_of(old_sample) == pytest.approx([pyav.frame_times[i] for i in old_sample], abs=1e-3)
    assert _codes(reader.get(range(LATE_B - 2, LATE_B + 3))) == [LATE_B - 2, LATE_B - 1, LATE_B - 1, LATE_B,
                                                                  LATE_B + 1]
    assert {LATE_B - 2, LATE_B - 1, LATE_B} <= set(checked_frames(pyav))
    why = misread(open_reader(path, "torchcodec"), pyav, "torchcodec")
    assert why == f"torchcodec times frame {LATE_B} at 0.633 s, the container at 0.667 s"
    why = _other_frame(open_reader(path, "torchcodec"), pyav, "torchcodec", checked_frames(pyav))
    assert why is not None and why.startswith(f"torchcodec decodes frame {LATE_B - 1} of the container as frame")


@pytest.mark.parametrize("decoder", OTHERS)
def test_the_pixel_check_catches_frames_in_decode_order(files, decoder):
    """Past their index (which alone already gives them away here), the check compares decoded frames with
    PyAV's around the first B-frame: a decoder returning decode order decodes frame 3 as frame 1, and so on."""
    path = files["mpeg4_decode_order_mkv"]
    pyav = open_reader(path, "pyav")
    assert checked_frames(pyav)[:5] == [0, 1, 2, 3, 4]
    why = _other_frame(open_reader(path, decoder), pyav, decoder, checked_frames(pyav))
    assert why is not None and why.startswith(f"{decoder} decodes frame ")
    assert _other_frame(open_reader(path, "pyav"), pyav, "pyav", checked_frames(pyav)) is None


@pytest.mark.filterwarnings("ignore:.*would read:UserWarning")  # decord and torchcodec passed over: said above
def test_a_stream_over_them_gives_the_frames_its_clips_name(files):
    """Shuffled clips with a seek for nearly every frame, with `auto` (PyAV: decord and torchcodec passed over)."""
    stream = build_stream(data_cfg([files[name] for name in NAMES], decoder="auto", max_read_through=1,
                                   decode_workers=1),
                          stream_cfg(order="shuffled", batch_size=4, frames_per_clip=3, fps=15.0))
    assert [(v.num_frames, v.decoder("auto")) for v in stream.videos] == [(FRAMES, "pyav")] * len(NAMES)
    seen = set()
    for batch in stream.batches():
        for i, ref in enumerate(batch.clips):
            got = [read_block(batch.frames[i, j]) for j in range(len(ref.frames))]
            vid = VIDEO_ID[NAMES[[files[n] for n in NAMES].index(ref.video)]]
            assert got == [(vid, f) for f in ref.frames], (batch.step, ref)
            seen.add(vid)
    assert seen == set(VIDEO_ID.values())


def test_along_time_the_stream_reads_each_frame_once_in_order(files):
    """Sequential clips read through the decoders' reordering (no seek between neighbouring frames)."""
    for name in NAMES:
        stream = build_stream(data_cfg([files[name]], decoder="pyav", decode_workers=1),
                              stream_cfg(order="batch_along_time", batch_size=2, frames_per_clip=4, fps=30.0))
        for batch in stream.batches():
            for i, ref in enumerate(batch.clips):
                assert [read_block(batch.frames[i, j]) for j in range(4)] == [(VIDEO_ID[name], f) for f in ref.frames]


@pytest.mark.filterwarnings("ignore:.*would read:UserWarning")  # the good file: decord and torchcodec passed over
@pytest.mark.parametrize("decoder", ["auto", "pyav"])
def test_a_file_no_decoder_reads_exactly_is_named_before_the_stream_or_skipped(files, decoder):
    """Before this check the probe passed it (frames 0 and 47 decode) and the stream failed at its first B-frame,
    inside the decode workers; now the stream is refused, naming the file and each decoder's reason."""
    good, bad = files["mpeg4_bframes_avi"], files["untagged"]
    with pytest.raises(DataError, match="read exactly by no decoder here") as err:
        build_stream(data_cfg([good, bad], decoder=decoder), stream_cfg())
    assert bad in str(err.value) and good not in str(err.value)
    assert "pyav: PyAV's decoder returns keyframe 12 as frame 7" in str(err.value)
    with pytest.warns(UserWarning, match="skipping bad video"):
        stream = build_stream(data_cfg([good, bad], decoder=decoder, on_bad_video="skip"), stream_cfg())
    assert [p for p, _ in stream.skipped] == [bad] and [v.path for v in stream.videos] == [good]
    reader = open_reader(bad, "pyav")
    with pytest.raises(DataError, match="returns keyframe 12 as frame 7"):
        reader.get(range(FRAMES))  # what the workers met before: now the probe meets it first
