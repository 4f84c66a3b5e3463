"""Does a decoder index a video as its container lays it out? If not, the stream reads that video with another one.

decord 0.6 finds frame i by its own index of the file (frame count, timestamps, keyframes) and seeks by it; torchcodec
builds its own index too (seek_mode="exact"). Where such an index disagrees with the packets of the container, the
decoder returns other frames than those asked for, with no error. Measured (tests/data/decode/test_codecs.py): on
HEVC with open GOPs (x265's default) decord counts keyframes in decode order, not presentation order, so every seek
past the first keyframe lands on the wrong frame. `misread` compares a decoder's index with PyAV's frame table (one
demuxing pass, no decoding), which indexes frame i as the i-th frame in presentation order; the probe
(videos/probing.py) then streams such a file with the next decoder that reads it exactly, PyAV at the latest.
"""

from __future__ import annotations

from typing import Optional


def misread(reader, pyav_reader, name: str = "decord") -> Optional[str]:
    """Why `reader` (decoder `name`) would read other frames of this video than those a clip names; None when its
    index (frame count, keyframes, timestamps) agrees with the container's packets. A reader without a whole
    timestamp list (torchcodec) has the times of its second, middle and last frames checked (`times_of`)."""
    times = pyav_reader.frame_times
    if not times:  # the packets carry no timestamps: nothing to check the decoder against
        return None
    if reader.num_frames != len(times):
        return f"{name} counts {reader.num_frames} frames, the container has {len(times)}"
    keys, expected = reader.keyframes, pyav_reader.keyframes
    if keys != expected:
        diff = next(i for i, (a, b) in enumerate(zip(keys + [None], expected + [None])) if a != b)
        return (f"{name} puts keyframe {diff} at frame {(keys + [None])[diff]}, the container at frame "
                f"{(expected + [None])[diff]} (an open GOP: {name} would seek to the wrong frames)")
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    tolerance = min(gaps) / 2 if gaps else 1e-3
    if hasattr(reader, "frame_times"):
        checked = list(enumerate(reader.frame_times))
    else:
        sample = sorted({min(1, len(times) - 1), len(times) // 2, len(times) - 1})
        checked = list(zip(sample, reader.times_of(sample)))
    for i, a in checked:
        if abs(a - times[i]) > tolerance:
            return f"{name} times frame {i} at {a:.3f} s, the container at {times[i]:.3f} s"
    return None
