"""Does decord index a video as its container lays it out? If not, the stream reads that video with PyAV.

decord 0.6 finds frame i by its own index of the file (frame count, timestamps, keyframes) and seeks by it. Where
that index disagrees with the packets of the container, decord returns other frames than those asked for, with
no error. Measured (tests/data/decode/test_codecs.py): on HEVC with open GOPs (x265's default) decord counts
keyframes in decode order, not presentation order, so every seek past the first keyframe lands on the wrong
frame. `misread` compares decord's index with PyAV's frame table (one demuxing pass, no decoding), which indexes
frame i as the i-th frame in presentation order; the probe (videos/probing.py) then streams such a file with PyAV.
"""

from __future__ import annotations

from typing import Optional


def misread(decord_reader, pyav_reader) -> Optional[str]:
    """Why decord would read other frames of this video than those a clip names; None when its index (frame count,
    keyframes, timestamps) agrees with the container's packets."""
    times = pyav_reader.frame_times
    if not times:  # the packets carry no timestamps: nothing to check decord against
        return None
    if decord_reader.num_frames != len(times):
        return f"decord counts {decord_reader.num_frames} frames, the container has {len(times)}"
    keys, expected = decord_reader.keyframes, pyav_reader.keyframes
    if keys != expected:
        diff = next(i for i, (a, b) in enumerate(zip(keys + [None], expected + [None])) if a != b)
        return (f"decord puts keyframe {diff} at frame {(keys + [None])[diff]}, the container at frame "
                f"{(expected + [None])[diff]} (an open GOP: decord would seek to the wrong frames)")
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    tolerance = min(gaps) / 2 if gaps else 1e-3
    for i, (a, b) in enumerate(zip(decord_reader.frame_times, times)):
        if abs(a - b) > tolerance:
            return f"decord times frame {i} at {a:.3f} s, the container at {b:.3f} s"
    return None
