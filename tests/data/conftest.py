"""Fixtures of tests/data: the block-coded test videos (see rs_data_helpers)."""

import pytest
from rs_data_helpers import BLOCK_VIDEOS, write_block_video


@pytest.fixture(scope="session")
def block_videos(tmp_path_factory) -> list:
    root = tmp_path_factory.mktemp("block_videos")
    return [str(write_block_video(root / f"v{vid}.mp4", vid, n, w, h, gop)) for vid, n, w, h, gop in BLOCK_VIDEOS]
