"""The held-out probe images of the Table 1 miniature (raystream/data/demo/probe_images.py): an ImageFolder that
eval.dataset reads, written once and then found, with no digit image in both splits."""

from __future__ import annotations

import os

from raystream.data.demo.probe_images import ensure_digit_probe
from raystream.eval.probe_sets import list_probe_set


def test_the_held_out_probe_is_an_image_folder_with_no_image_in_both_splits(tmp_path):
    root = ensure_digit_probe(tmp_path / "probe")
    listing = list_probe_set(str(root))
    assert listing.kind == "images" and listing.num_classes == 10
    assert len(listing.train) + len(listing.test) == 720 and min(len(listing.train), len(listing.test)) > 350

    def digit(p):
        return os.path.basename(p).rsplit("_", 1)[0]
    assert not {digit(s.path) for s in listing.train} & {digit(s.path) for s in listing.test}
    marker = (root / "DONE").stat().st_mtime_ns
    assert ensure_digit_probe(tmp_path / "probe") == root and (root / "DONE").stat().st_mtime_ns == marker
