"""Does a decoder read a video's frames as its container lays them out? If not, the stream reads it with another one.

decord 0.6 finds frame i by its own index of the file (frame count, timestamps, keyframes) and seeks by it; torchcodec
builds its own index too (seek_mode="exact"). Where such an index disagrees with the packets of the container, the
decoder returns other frames than those asked for, with no error. Measured (tests/data/decode/test_codecs.py): on
HEVC with open GOPs (x265's default) decord counts keyframes in decode order, not presentation order, so every seek
past the first keyframe lands on the wrong frame; on MPEG-4 Part 2 with B-frames (DivX, Xvid: in AVI, packed or not,
and with a decoder that returns frames in decode order) decord and torchcodec both do, and read frames in decode
order (tests/data/decode/test_reordered.py); on MPEG-2 with B-frames (tests/data/decode/test_mpeg2.py) decord puts
keyframes at their place in decode order, or, on a transport stream with closed GOPs, indexes the file as the
container does and reads every frame 13 late, a shift that only the frames give away. Frames whose order differs are
found only past the first B-frame, so the checks look there (`checked_frames`), not only at a video's ends.

`misread` compares a decoder with PyAV (pyav_reader.py): its index (frame count, keyframes, timestamps) with PyAV's
frame table (one demuxing pass, no decoding), which indexes frame i as the i-th frame in presentation order, and
the frames it decodes at `checked_frames` with PyAV's. `pyav_misread` asks the same of PyAV itself: that it finds
every frame from the start to past the first B-frame and the second keyframe, and each checked frame by a seek.
The probe (videos/probing.py) streams a file with the first decoder that reads it exactly, and refuses, naming it,
a file that none does.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from raystream.data.errors import DataError

# frames `pyav_misread` reads one by one, at most (from the keyframe before the first B-frame on)
SEQUENTIAL_LIMIT = 300
# frames on each side of a checked frame that `_other_frame` compares a decoder's frame with (a decoder returning
# frames in decode order is one or two off, decord on MPEG-2 three (a camera's program stream) to 13 (a transport
# stream), a GOP of MPEG-2 as DVDs and broadcast have it is 12 or 15 frames)
SHIFT_WINDOW = 16
# pixels along the long side of the grid the frames are compared on (every k-th pixel, each way)
COMPARED_SIDE = 320


def checked_frames(pyav_reader) -> List[int]:
    """The frames the checks decode: the second, middle and last; a few on each side of the first B-frame (the
    first frame decoded after one shown after it, `first_reordered`) and of the keyframe before it, read on from the
    frames before that keyframe (a stream that turns to B-frames at a keyframe, as one cut from two encodings does,
    got torchcodec 0.13 off by one from there when it decoded through, right after a seek); and around the second
    keyframe."""
    n, first = pyav_reader.num_frames, pyav_reader.first_reordered
    keys = [k for k in pyav_reader.keyframes if k > 0]
    picked = {1, n // 2, n - 1}
    if first is not None:
        before = max([0] + [k for k in keys if k <= first])
        picked |= set(range(before - 2, before + 3)) | set(range(first - 1, first + 4))
    if keys:
        picked |= {keys[0] - 1, keys[0], keys[0] + 1}
    return sorted(i for i in picked if 0 <= i < n)


def misread(reader, pyav_reader, name: str = "decord", pixels: bool = True) -> Optional[str]:
    """Why `reader` (decoder `name`) would read other frames of this video than those a clip names; None when its
    index (frame count, keyframes, timestamps) agrees with the container's packets and, with `pixels`, the frames it
    decodes at `checked_frames` are PyAV's. A reader without a whole timestamp list (torchcodec) has the times of
    the checked frames compared (`times_of`)."""
    times = pyav_reader.frame_times
    if not times:  # the packets carry no timestamps: nothing to check the decoder against
        return None
    if reader.num_frames != len(times):
        return f"{name} counts {reader.num_frames} frames, the container has {len(times)}"
    keys, expected = reader.keyframes, pyav_reader.keyframes
    if keys != expected:
        diff = next(i for i, (a, b) in enumerate(zip(keys + [None], expected + [None])) if a != b)
        return (f"{name} puts keyframe {diff} at frame {(keys + [None])[diff]}, the container at frame "
                f"{(expected + [None])[diff]} (an open GOP or B-frames: {name} would seek to the wrong frames)")
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    tolerance = min(gaps) / 2 if gaps else 1e-3
    sample = checked_frames(pyav_reader)
    if hasattr(reader, "frame_times"):
        checked = list(enumerate(reader.frame_times))
    else:
        checked = list(zip(sample, reader.times_of(sample)))
    for i, a in checked:
        if abs(a - times[i]) > tolerance:
            return f"{name} times frame {i} at {a:.3f} s, the container at {times[i]:.3f} s"
    return _other_frame(reader, pyav_reader, name, sample) if pixels else None


def _other_frame(reader, pyav_reader, name: str, sample: List[int]) -> Optional[str]:
    """Where `reader` (decoder `name`) decodes, as frame i of `sample`, a frame nearer one of PyAV's frames i -
    SHIFT_WINDOW to i + SHIFT_WINDOW than PyAV's frame i (by mean absolute difference, by more than a grey level:
    decoders convert colours a little differently, and a still scene's neighbouring frames are alike), which; None
    where it decodes PyAV's frames. The window catches frames in decode order (one or two off) and a constant
    shift of the whole video (decord 0.6 read an MPEG-2 program stream with B-frames three frames late), named as
    such where every checked frame that tells is shifted alike."""
    n = pyav_reader.num_frames
    mine = _host(reader.get(sample))
    step = max(1, max(mine.shape[1:3]) // COMPARED_SIDE)
    ref = {}
    for j in sorted({j for i in sample for j in range(i - SHIFT_WINDOW, i + SHIFT_WINDOW + 1) if 0 <= j < n}):
        frame = pyav_reader.get([j])[0]  # one by one, ascending: read through, never a stack of full frames
        if frame.shape != mine.shape[1:]:
            return None  # another size (a decoder's own scaling): nothing to compare pixel by pixel
        ref[j] = frame[::step, ::step].astype(np.int16)
    shifts = []  # (i, the frame of PyAV's it is, mean difference from that one, from PyAV's frame i)
    for i, frame in zip(sample, mine):
        own = frame[::step, ::step].astype(np.int16)
        dist = {j: float(np.abs(own - ref[j]).mean()) for j in range(i - SHIFT_WINDOW, i + SHIFT_WINDOW + 1)
                if j in ref}
        near = min((d, j) for j, d in dist.items() if j != i) if len(dist) > 1 else (float("inf"), i)
        if dist[i] > near[0] + 1.0:
            shifts.append((i, near[1], near[0], dist[i]))
    if not shifts:
        return None
    offsets = [j - i for i, j, _, _ in shifts]
    common = max(offsets, key=lambda d: (offsets.count(d), -offsets.index(d)))  # the most frequent, first seen
    i, j, near, own = shifts[offsets.index(common)]
    alike = offsets.count(common)
    constant = f"; {alike} of the {len(sample)} checked frames i are the container's frame i{common:+d}" if alike > 1 else ""
    return (f"{name} decodes frame {j} of the container as frame {i} (mean difference {near:.1f} grey levels, "
            f"against {own:.1f} from frame {i}){constant}")


def _host(frames):
    return frames.cpu().numpy() if hasattr(frames, "cpu") else frames


def pyav_misread(pyav_reader) -> Optional[str]:
    """Why PyAV would not give every frame of this video as the frame its index names; None when it reads one by
    one the frames from the keyframe before the first B-frame to past it (with packed B-frames: to past the next
    keyframe, where the count of frames is checked; at most SEQUENTIAL_LIMIT), and each of `checked_frames` after
    a seek. (A frame PyAV finds is the frame its index names: it matches decoded frames to the packets' timestamps,
    or counts them from a keyframe, pyav_reader.py.)"""
    n, first = pyav_reader.num_frames, pyav_reader.first_reordered or 0
    keys = pyav_reader.keyframes
    start = max(k for k in keys if k <= first)
    later = [k for k in keys if k > first]
    end = later[0] + 2 if pyav_reader.packed and later else first + 4
    try:
        for i in range(start, min(n, end, start + SEQUENTIAL_LIMIT)):
            pyav_reader.get([i])
        for i in reversed(checked_frames(pyav_reader)):  # backwards: every one a seek
            pyav_reader.get([i])
    except DataError as exc:
        message = str(exc)
        return message.split(": ", 1)[1] if message.startswith(pyav_reader.path + ": ") else message
    return None
