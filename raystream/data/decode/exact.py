"""Does a decoder read a video's frames as its container lays them out? If not, the stream reads it with another one.

decord 0.6 finds frame i by its own index of the file (frame count, timestamps, keyframes) and seeks by it; torchcodec
builds its own index too (seek_mode="exact"). Where such an index disagrees with the packets of the container, the
decoder returns other frames than those asked for, with no error. Measured (tests/data/decode/test_codecs.py): on
HEVC with open GOPs (x265's default) decord counts keyframes in decode order, not presentation order, so every seek
past the first keyframe lands on the wrong frame; on MPEG-4 Part 2 with B-frames (DivX, Xvid: in AVI, packed or not,
and with a decoder that returns frames in decode order) decord and torchcodec both do, and read frames in decode
order (tests/data/decode/test_reordered.py). Frames whose order differs are found only past the first B-frame, so
the checks look there (`checked_frames`), not only at a video's ends.

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
    """Where `reader` decodes, as frame i of `sample`, a frame nearer PyAV's frame i-1 or i+1 than PyAV's frame i
    (by mean absolute difference, by more than a grey level: decoders convert colours a little differently, and a
    still scene's neighbouring frames are alike), which; None where it decodes PyAV's frames."""
    n = pyav_reader.num_frames
    wanted = sorted({j for i in sample for j in (i - 1, i, i + 1) if 0 <= j < n})
    mine = np.asarray(_host(reader.get(sample)), dtype=np.float32)
    ref = dict(zip(wanted, np.asarray(pyav_reader.get(wanted), dtype=np.float32)))
    for i, frame in zip(sample, mine):
        if frame.shape != ref[i].shape:
            return None  # another size (a decoder's own scaling): nothing to compare pixel by pixel
        own = float(np.abs(frame - ref[i]).mean())
        near = min((float(np.abs(frame - ref[j]).mean()), j) for j in (i - 1, i + 1) if j in ref)
        if own > near[0] + 1.0:
            return (f"{name} decodes frame {near[1]} of the container as frame {i} (mean difference "
                    f"{near[0]:.1f} grey levels, against {own:.1f} from frame {i})")
    return None


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
