"""ReadAhead: the next chunk of a forward read is loaded in the background and handed over, frames stay exact
whatever the read pattern, and a speculative load that fails never surfaces unless its frames are asked for."""

import pytest
import torch
from rs_data_helpers import read_block, write_block_video

from raystream.data.backends import open_reader
from raystream.data.errors import DataError
from raystream.data.readahead import ReadAhead


def _ahead(reader):
    return ReadAhead(reader.get, reader.num_frames, close=reader.close)


def _ids(frames):
    return [read_block(torch.from_numpy(f).permute(2, 0, 1))[1] for f in frames]


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return str(write_block_video(tmp_path_factory.mktemp("ra") / "v3.mp4", 3, 60, gop=10))


@pytest.mark.parametrize("decoder", ["decord", "pyav"])
def test_forward_chunks_come_from_read_ahead(video, decoder):
    reader = _ahead(open_reader(video, decoder, decord_reset_frames=6))
    try:
        got = []
        for start in range(0, 60, 8):  # lattice 2: frames 0, 2, 4, ... in chunks of 4
            got += _ids(reader.get(list(range(start, min(60, start + 8), 2))))
        assert got == list(range(0, 60, 2))
        assert reader.misses == 4 and reader.hits == 26  # only the first chunk was read on demand
    finally:
        reader.close()


@pytest.mark.parametrize("decoder", ["decord", "pyav"])
def test_any_read_pattern_gives_the_asked_frames(video, decoder):
    reader = _ahead(open_reader(video, decoder))
    try:
        for ask in ([0, 1, 2], [3, 4, 5, 6, 7], [8, 9], [5, 6], [20, 25, 30], [35, 40, 45], [59], [1], [2, 3]):
            assert _ids(reader.get(ask)) == ask
        with pytest.raises(ValueError, match="at least one frame"):
            reader.get([])
    finally:
        reader.close()


def test_a_failed_speculative_read_only_raises_when_its_frames_are_asked_for(video):
    inner = open_reader(video, "pyav")
    inner.num_frames = 70  # the container claims 10 frames more than decode
    reader = _ahead(inner)
    try:
        assert _ids(reader.get(list(range(50, 60)))) == list(range(50, 60))  # read-ahead of 60..69 fails
        assert _ids(reader.get([57, 58])) == [57, 58]
        with pytest.raises(DataError, match="v3.mp4.*ran out of frames"):
            reader.get([65])
    finally:
        reader.close()


def test_close_ends_its_daemon_thread_after_closing_the_reader(video):
    inner = open_reader(video, "pyav")
    reader = _ahead(inner)
    thread = reader._pool.thread
    assert thread.daemon  # a decode stuck in a corrupt file must not keep the process from exiting
    reader.get([0, 1])  # leaves a read-ahead of 2..3 in flight
    reader.close()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert inner._container is None  # the PyAV reader was closed, after the read in flight
