"""The video index (`raystream data index`): a stream takes frame counts and fps from it while the files are as
indexed, and probes (saying so) what changed since."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from rs_data_helpers import data_cfg, stream_cfg

from raystream.data import DataError, build_stream
from raystream.data.videos.index import INDEX_NAME, write_index
from raystream.data.videos.listing import resolve_videos


@pytest.fixture
def folder(block_videos, tmp_path):
    for p in block_videos:
        shutil.copy(p, tmp_path / os.path.basename(p))
    return tmp_path


def test_a_stream_reads_frame_counts_from_the_index_while_the_files_are_as_indexed(folder):
    written, bad = write_index(str(folder), data_cfg(str(folder)))
    assert written == [str(folder / INDEX_NAME)] and bad == []
    index = json.loads((folder / INDEX_NAME).read_text())
    assert index["videos"]["v1.mp4"]["num_frames"] == 40 and index["videos"]["v1.mp4"]["size"] > 0
    assert [e.path for e in resolve_videos(str(folder))] == [str(folder / f"v{i}.mp4") for i in (1, 2, 3, 4)]
    index["videos"]["v1.mp4"]["num_frames"] = 30  # what the stream sees is the index's, not a probe's
    (folder / INDEX_NAME).write_text(json.dumps(index))
    stream = build_stream(data_cfg(str(folder)), stream_cfg())
    assert stream.videos[0].num_frames == 30
    os.utime(folder / "v1.mp4", ns=(1, 1))  # the file changed since (another modification time): probed again
    with pytest.warns(UserWarning, match="changed since their index was written"):
        stream = build_stream(data_cfg(str(folder)), stream_cfg())
    assert stream.videos[0].num_frames == 40


def test_the_index_command_reports_videos_it_cannot_index(folder, capsys):
    from raystream.cli import main

    (folder / "broken.mp4").write_bytes(b"not a video")
    assert main(["data", "index", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "not indexed: " in err and "broken.mp4" in err
    assert "broken.mp4" not in json.loads((folder / INDEX_NAME).read_text())["videos"]


@pytest.mark.parametrize("uri, expected", [("gs://", "expected a bucket after the scheme"),
                                           ("foo://bucket/videos/", "Unrecognized filesystem")])
def test_a_uri_that_cannot_be_opened_names_the_key(uri, expected):
    with pytest.raises(DataError, match=f"`data.videos` = '{uri}': cannot open it .*{expected}"):
        resolve_videos(uri)
