"""Frame-exact on the codecs of the paper's datasets: H.264 with B-frames (Kinetics, Ego4D), VP9 and VP8 in webm
(SSv2), HEVC 8 and 10 bit, AV1, MPEG-4 part 2 and MJPEG in AVI, and a variable-frame-rate H.264 .mkv. Every frame
of every streamed clip is the source frame the clip names, with both decoders; where decord reads a file wrong,
the stream reads it with PyAV and says so. See rs_codecs for how the videos are written."""

from __future__ import annotations

import av
import pytest
from rs_codecs import CODECS, NAMES, write_coded
from rs_data_helpers import data_cfg, read_block, stream_cfg

from raystream.data import build_stream


def _encoder_missing(encoder: str) -> bool:
    try:
        av.codec.Codec(encoder, "w")
        return False
    except Exception:  # noqa: BLE001 - PyAV raises UnknownCodecError (a ValueError) or FFmpegError by version
        return True


@pytest.fixture(scope="module")
def coded(tmp_path_factory):
    """{name: (path, video id)} of each codec's video this PyAV can write (see rs_codecs.CODECS)."""
    root = tmp_path_factory.mktemp("codecs")
    out = {}
    for vid, (name, file, encoder, pix_fmt, options, pts_ms) in enumerate(CODECS, start=1):
        if not _encoder_missing(encoder):
            out[name] = (str(write_coded(root / file, vid, encoder, pix_fmt, options, pts_ms)), vid)
    return out


def _video(coded, name):
    if name not in coded:
        encoder = CODECS[NAMES.index(name)][2]
        pytest.skip(f"this PyAV has no {encoder} encoder to write the {name} test video")
    return coded[name]


@pytest.mark.parametrize("order", ["batch_along_time", "shuffled"])
@pytest.mark.parametrize("decoder", ["decord", "pyav"])
@pytest.mark.parametrize("name", NAMES)
def test_every_streamed_frame_is_the_frame_its_clip_names(coded, name, decoder, order):
    path, vid = _video(coded, name)
    s = stream_cfg(order=order, batch_size=4, frames_per_clip=3, fps=15.0, clip_shift=1)
    # max_read_through=1: shuffled clips seek for nearly every frame, sequential ones read through
    stream = build_stream(data_cfg([path], decoder=decoder, max_read_through=1, decode_workers=1), s)
    assert stream.videos[0].num_frames == 48
    seen = 0
    for batch in stream.batches():
        for i, ref in enumerate(batch.clips):
            got = [read_block(batch.frames[i, j]) for j in range(len(ref.frames))]
            assert got == [(vid, f) for f in ref.frames], (name, decoder, batch.step, ref.frames)
            seen += len(ref.frames)
    assert seen == stream.num_steps * 4 * 3 > 0
