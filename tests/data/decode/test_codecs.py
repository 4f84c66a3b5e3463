"""Frame-exact on the codecs of the paper's datasets: H.264 with B-frames (Kinetics, Ego4D), VP9 and VP8 in webm
(SSv2), HEVC 8 and 10 bit, AV1, MPEG-4 part 2 and MJPEG in AVI, and a variable-frame-rate H.264 .mkv. Every frame
of every streamed clip is the source frame the clip names, with every installed decoder (torchcodec, decord, PyAV)
and with `auto`; where a decoder reads a file wrong, the stream reads it with another one and says so. See rs_codecs
for how the videos are written."""

from __future__ import annotations

import json
import os
import time
import warnings

import av
import pytest
import torch
from rs_codecs import CODECS, NAMES, write_coded
from rs_data_helpers import data_cfg, read_block, stream_cfg

from raystream.data import DataError, build_stream
from raystream.data.decode.backends import installed_decoders, open_reader
from raystream.data.decode.exact import misread
from raystream.data.videos.index import write_index
from raystream.data.videos.probing import _probe_one


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


@pytest.fixture(scope="module")
def probed(coded):
    """probed(decoder): every codec video probed with `decoder` once, in one probe child for all of them. The probe
    (videos/probing.py) caches each file's verdict per decoder, so the tests below stream from it; a child that loads
    torchcodec imports torch, seconds of CPU per child, which one child per file paid for every video."""
    done = set()

    def probe(decoder: str) -> None:
        if decoder not in done:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # decord's misreads are said and checked in the tests below
                build_stream(data_cfg([p for p, _ in coded.values()], decoder=decoder), stream_cfg()).close()
            done.add(decoder)
    return probe


# the codec campaign runs against each decoder installed here (and auto); the others are named as skipped
CAMPAIGN = [pytest.param(d, marks=pytest.mark.skipif(d not in installed_decoders(), reason=f"{d} is not installed"))
            for d in ("torchcodec", "decord", "pyav")] + ["auto"]
needs_decord = pytest.mark.skipif("decord" not in installed_decoders(), reason="decord is not installed")


@pytest.mark.filterwarnings("ignore:.*would read:UserWarning")  # said and checked in the tests below
@pytest.mark.parametrize("order", ["batch_along_time", "shuffled"])
@pytest.mark.parametrize("decoder", CAMPAIGN)
@pytest.mark.parametrize("name", NAMES)
def test_every_streamed_frame_is_the_frame_its_clip_names(coded, probed, name, decoder, order):
    path, vid = _video(coded, name)
    probed(decoder)
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


@needs_decord
def test_files_decord_misreads_are_read_with_pyav_said_once(coded):
    """One warning names each video decord would read wrong and why; decord alone does read those wrong (the
    check is not over-eager: on the others decord streams exactly, the test above)."""
    paths = {path: name for name, (path, _) in coded.items()}
    with pytest.warns(UserWarning, match="decord would read") as record:
        stream = build_stream(data_cfg(sorted(paths), decoder="decord"), stream_cfg(batch_size=4))
    said = [str(w.message) for w in record if "decord would read" in str(w.message)]
    assert len(said) == 1
    fallback = {v.path: v.pyav_because for v in stream.videos if v.decoder("decord") == "pyav"}
    assert fallback and all(f"{p}: {why}" in said[0] for p, why in fallback.items())
    assert not any(p in said[0] for p in set(paths) - set(fallback))
    for path in fallback:
        try:
            reader = open_reader(path, "decord")
        except DataError:
            continue  # decord cannot open it at all (AV1 with decord 0.6's FFmpeg)
        wanted = [5, 7, 9, 30, 34]
        got = [read_block(torch.from_numpy(f).permute(2, 0, 1))[1] for f in reader.get(wanted)]
        assert got != wanted, f"decord reads {paths[path]} right: the fallback is not needed ({fallback[path]})"


def _truncate(src: str, dst, keep: float) -> str:
    data = open(src, "rb").read()
    with open(dst, "wb") as f:
        f.write(data[: int(len(data) * keep)])
    return str(dst)


@pytest.fixture(scope="module")
def bad_containers(coded, tmp_path_factory):
    """Broken files of the containers that keep no frame count (webm, mkv) or keep one in a header (avi)."""
    d = tmp_path_factory.mktemp("bad_containers")
    bad = {}
    for name, keep in (("vp9_webm", 0.5), ("h264_vfr_mkv", 0.8), ("mjpeg_avi", 0.5)):
        if name in coded:
            path = coded[name][0]
            bad[_truncate(path, d / f"truncated_{os.path.basename(path)}", keep)] = "truncated or corrupt"
    (d / "empty.webm").write_bytes(b"")
    bad[str(d / "empty.webm")] = "empty file"
    (d / "not_a_video.mkv").write_text("a text file, not a video\n" * 40)
    bad[str(d / "not_a_video.mkv")] = "cannot open it as a video"
    return bad


@pytest.mark.parametrize("decoder", CAMPAIGN)
def test_truncated_empty_or_non_video_files_are_named_before_the_stream_or_skipped(coded, bad_containers, decoder):
    """Skipped first: that probes every file in one child (a torchcodec child imports torch, seconds of CPU), and
    each file's verdict, cached by the probe, then names it in the error of a stream of it alone."""
    good, vid = _video(coded, "vp9_webm")
    with pytest.warns(UserWarning, match="skipping bad video"):
        stream = build_stream(data_cfg([good, *bad_containers], decoder=decoder, on_bad_video="skip"), stream_cfg())
    assert [p for p, _ in stream.skipped] == list(bad_containers) and [v.path for v in stream.videos] == [good]
    batch = next(iter(stream))
    assert read_block(batch.frames[0, 0]) == (vid, batch.clips[0].frames[0])
    for path, problem in bad_containers.items():
        with pytest.raises(DataError, match=problem) as err:
            build_stream(data_cfg([good, path], decoder=decoder), stream_cfg())
        assert path in str(err.value) and good not in str(err.value)


@needs_decord
def test_the_index_keeps_the_decord_verdict(coded, tmp_path):
    """`raystream data index` records why decord would misread a video; a stream built from the index (no probe)
    reads it with PyAV all the same, and exactly."""
    path, vid = _video(coded, "hevc_mp4")
    copy = tmp_path / "hevc.mp4"
    copy.write_bytes(open(path, "rb").read())
    written, bad = write_index(str(tmp_path), data_cfg(str(tmp_path), decoder="decord"))
    assert bad == [] and "open GOP" in json.loads(open(written[0]).read())["videos"]["hevc.mp4"]["pyav_because"]
    with pytest.warns(UserWarning, match="decord would read 1 video"):
        stream = build_stream(data_cfg(str(tmp_path), decoder="decord"), stream_cfg(order="shuffled"))
    assert stream.videos[0].decoder("decord") == "pyav"
    for batch in stream.batches():
        for i, ref in enumerate(batch.clips):
            assert [read_block(batch.frames[i, j]) for j in range(3)] == [(vid, f) for f in ref.frames]


@needs_decord
def test_the_check_names_each_way_decord_and_the_container_can_disagree(coded, block_videos):
    """exact.misread on real readers of two files that differ in one respect each: frame count, keyframes,
    timestamps (the same 48 frames and keyframes at constant and at variable frame rate); same file: agreement."""
    h264, vfr = _video(coded, "h264_bframes_mp4")[0], _video(coded, "h264_vfr_mkv")[0]
    decord_h264 = open_reader(h264, "decord")
    assert misread(decord_h264, open_reader(h264, "pyav")) is None
    assert misread(open_reader(vfr, "decord"), open_reader(vfr, "pyav")) is None
    assert "decord counts 48 frames, the container has 40" in misread(decord_h264, open_reader(block_videos[0], "pyav"))
    # within half the shortest frame interval (16.5 ms) is the same time: frames 1-3 are, frame 4 is not
    assert "decord times frame 4 at 0.133 s, the container at 0.156 s" in misread(decord_h264, open_reader(vfr, "pyav"))
    hevc = _video(coded, "hevc_mp4")[0]
    assert "decord puts keyframe 1 at frame 9, the container at frame 12" in misread(open_reader(hevc, "decord"),
                                                                                    open_reader(hevc, "pyav"))


def test_auto_takes_per_file_the_first_installed_decoder_that_reads_it_exactly(coded):
    """The probe's choice under data.decoder=auto, for a given list of installed decoders: a file the first one
    would misread (HEVC's open GOP for decord) or cannot open (AV1 for decord 0.6) goes to the next, PyAV at the
    latest, and says why; a file it reads exactly stays with it. With torchcodec installed, nothing goes to PyAV."""
    hevc, h264 = _video(coded, "hevc_mp4")[0], _video(coded, "h264_bframes_mp4")[0]
    if "decord" in installed_decoders():
        got = _probe_one(hevc, "auto", ["decord"])
        assert got["decoded_by"] == "pyav" and "decord: decord puts keyframe 1 at frame 9" in got["pyav_because"]
        assert _probe_one(h264, "auto", ["decord"])["decoded_by"] == "decord"
        if "av1_mp4" in coded:
            got = _probe_one(coded["av1_mp4"][0], "auto", ["decord"])
            assert got["decoded_by"] == "pyav" and got["pyav_because"].startswith("decord: ")
    assert _probe_one(hevc, "auto", [])["decoded_by"] == "pyav"
    if "torchcodec" not in installed_decoders():
        return
    assert _probe_one(hevc, "auto", ["decord", "torchcodec"]) == {
        **_probe_one(hevc, "pyav", []), "decoded_by": "torchcodec",
        "pyav_because": _probe_one(hevc, "auto", ["decord"])["pyav_because"]}  # decord passed over, saying why
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        stream = build_stream(data_cfg([p for p, _ in coded.values()], decoder="auto"), stream_cfg())
    by = {p: v.decoder("auto") for p, v in zip([p for p, _ in coded.values()], stream.videos)}
    assert set(by.values()) <= set(installed_decoders()) - {"pyav"} and by[hevc] == "torchcodec"  # never PyAV
    passed_over = "\n".join(str(w.message) for w in said if "would read" in str(w.message))
    assert (hevc in passed_over) == (by[h264] == "decord")  # said once, where decord is passed over
    if "decord" in installed_decoders():  # the fastest exact one first: decord keeps what it reads exactly
        assert by[h264] == "decord" and f"{hevc}: decord: " in passed_over and f"{h264}:" not in passed_over


@pytest.mark.parametrize("decoder", CAMPAIGN)
def test_the_variable_frame_rate_mkv_streams_within_seconds(coded, decoder):
    """Before frame tables, PyAV looked for frame 0 of this file until data.decode_timeout_s ran out (its indices
    came from timestamp x rate, which skips some here); every decoder now streams it whole well within 10 s."""
    path, vid = _video(coded, "h264_vfr_mkv")
    stream = build_stream(data_cfg([path], decoder=decoder, decode_timeout_s=10.0, max_read_through=1),
                          stream_cfg(order="shuffled"))
    start = time.monotonic()
    for batch in stream.batches():
        assert [read_block(batch.frames[0, j]) for j in range(3)] == [(vid, f) for f in batch.clips[0].frames]
    assert time.monotonic() - start < 10.0


def test_a_decoder_that_is_not_installed_is_named_before_any_file_is_opened(coded, tmp_path):
    missing = [d for d in ("torchcodec", "decord") if d not in installed_decoders()]
    if not missing:
        pytest.skip("every decoder is installed here (tests/test_wheel.py runs without them)")
    with pytest.raises(DataError, match=f"data.decoder = {missing[0]}: {missing[0]} is not installed"):
        build_stream(data_cfg([_video(coded, "h264_bframes_mp4")[0]], decoder=missing[0]), stream_cfg())
