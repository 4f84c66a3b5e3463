"""Video probe sets as published: Something-Something v2 (labels JSON, train/validation JSON, .webm videos) and
`path label` lists (VideoMAE's / V-JEPA's, space or comma separated, with or without a header), local or in a
bucket; eval.protocol=vjepa's attentive and linear probes on them. Videos are VP9 .webm written by PyAV."""

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from raystream.data import DataError
from raystream.eval.loaders import load_probe_source
from raystream.eval.probe_sets import list_probe_set
from raystream.models import build_scenario
from raystream.models.scenario import encoder_heads
from rs_eval_helpers import bucket_holding, tiny_cfg

TEMPLATES = ["Putting [something] on [something]", "Pushing [something] from left to right", "Holding [something]"]
COLOURS = [(230, 40, 40), (40, 230, 40), (40, 40, 230)]


def write_webm(path: Path, label: int, frames: int = 20, fps: int = 24, size: int = 32) -> Path:
    """A VP9 .webm: a square of the class's colour on a grey that tells the frame: frame i's is 20 + 10 i."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libvpx-vp9", rate=Fraction(fps))
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "10", "b": "0", "deadline": "realtime", "cpu-used": "8"}
        for i in range(frames):
            img = np.full((size, size, 3), 20 + 10 * i, np.uint8)
            img[8:24, 8:24] = COLOURS[label]
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_ssv2(root: Path, train_per_class=3, val_per_class=1) -> Path:
    """SSv2's files: the labels JSON, train.json and validation.json, videos in 20bn-something-something-v2/."""
    labels = {t.replace("[", "").replace("]", ""): str(i) for i, t in enumerate(TEMPLATES)}
    root.mkdir(parents=True, exist_ok=True)
    (root / "something-something-v2-labels.json").write_text(json.dumps(labels))
    vid = 100
    for name, per_class in (("train.json", train_per_class), ("validation.json", val_per_class)):
        entries = []
        for c, template in enumerate(TEMPLATES):
            for _ in range(per_class):
                vid += 1
                write_webm(root / "20bn-something-something-v2" / f"{vid}.webm", c)
                entries.append({"id": str(vid), "label": template.replace("[something]", "a cup"),
                                "template": template, "placeholders": ["a cup"] * template.count("[")})
        (root / name).write_text(json.dumps(entries))
    return root


@pytest.fixture(scope="module")
def ssv2(tmp_path_factory):
    return write_ssv2(tmp_path_factory.mktemp("ssv2"))


def vjepa_cfg(dataset, *extra):
    return tiny_cfg(dataset, "vjepa", "[linear,attentive]", "eval.vjepa.batch_size=4", "eval.vjepa.iterations=3",
                    "eval.vjepa.warmup_iterations=1", "eval.vjepa.frames_per_clip=4", "eval.vjepa.fps=12", *extra)


def test_ssv2_labels_come_from_the_template_without_brackets(ssv2):
    listing = list_probe_set(str(ssv2))
    assert listing.layout == "something-something-v2" and listing.kind == "videos"
    assert listing.class_names == ("Putting something on something", "Pushing something from left to right",
                                   "Holding something")
    assert [s.label for s in listing.train] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [Path(s.path).name for s in listing.test] == ["110.webm", "111.webm", "112.webm"]


def test_an_ssv2_entry_with_an_unknown_template_or_video_is_named(ssv2, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("something-something-v2-labels.json", "train.json"):
        (bad / f).write_text((ssv2 / f).read_text())
    (bad / "20bn-something-something-v2").symlink_to(ssv2 / "20bn-something-something-v2")
    (bad / "validation.json").write_text(json.dumps([{"id": "110", "label": "x", "template": "Juggling [something]",
                                                      "placeholders": []}]))
    with pytest.raises(DataError, match=r"validation.json: entry 0 \(id 110\).*Juggling something"):
        list_probe_set(str(bad))
    (bad / "validation.json").write_text(json.dumps([{"id": "999", "label": "x", "template": TEMPLATES[2],
                                                      "placeholders": []}]))
    with pytest.raises(DataError, match="999.webm"):
        list_probe_set(str(bad))


RELEASE = "something-something-v2-"


@pytest.mark.parametrize("naming", ["release", "plain"])
def test_ssv2_files_named_as_the_release_or_plainly_are_both_read(ssv2, tmp_path, naming):
    """The release names its splits something-something-v2-train.json / -validation.json; others use labels.json,
    train.json, validation.json: both list the same samples. A missing split names both names it looked for."""
    renamed = tmp_path / naming
    renamed.mkdir()
    for name in ("labels", "train", "validation"):
        source = ssv2 / (f"{RELEASE}labels.json" if name == "labels" else f"{name}.json")
        (renamed / (f"{RELEASE}{name}.json" if naming == "release" else f"{name}.json")).write_text(source.read_text())
    (renamed / "20bn-something-something-v2").symlink_to(ssv2 / "20bn-something-something-v2")
    listing, original = list_probe_set(str(renamed)), list_probe_set(str(ssv2))
    assert listing is not None and listing.layout == "something-something-v2"
    assert listing.class_names == original.class_names
    assert [(Path(s.path).name, s.label) for s in listing.train + listing.test] == \
        [(Path(s.path).name, s.label) for s in original.train + original.test]
    (renamed / (f"{RELEASE}validation.json" if naming == "release" else "validation.json")).unlink()
    with pytest.raises(DataError, match=f"looked for {RELEASE}validation.json and validation.json"):
        list_probe_set(str(renamed))


@pytest.mark.parametrize("train_text, val_name, val_text", [
    ("a/101.webm 0\na/102.webm 1\n", "val.csv", "a/110.webm 2\n"),  # VideoMAE's: space separated, no header
    ("path,label\na/101.webm,0\na/102.webm,1\n", "test.csv", "path,label\na/110.webm,2\n"),  # header, commas
    ("# V-JEPA\n{root}/a/101.webm 0\n\n{root}/a/102.webm 1\n", "val.txt", "{root}/a/110.webm 2\n"),  # absolute
])
def test_path_label_lists_in_every_spelling(tmp_path, train_text, val_name, val_text):
    (tmp_path / "train.csv").write_text(train_text.format(root=tmp_path))
    (tmp_path / val_name).write_text(val_text.format(root=tmp_path))
    listing = list_probe_set(str(tmp_path))
    assert [(s.path, s.label) for s in listing.train] == [(str(tmp_path / "a/101.webm"), 0),
                                                          (str(tmp_path / "a/102.webm"), 1)]
    assert [(s.path, s.label) for s in listing.test] == [(str(tmp_path / "a/110.webm"), 2)]
    assert listing.num_classes == 3


def test_a_bad_list_line_is_named_with_its_file_and_line(tmp_path):
    (tmp_path / "train.csv").write_text("a.webm 0\nb.webm cat\n")
    (tmp_path / "val.csv").write_text("c.webm 1\n")
    with pytest.raises(DataError, match=r"train.csv, line 2: 'b.webm cat'.*integer label"):
        list_probe_set(str(tmp_path))
    (tmp_path / "val.csv").unlink()
    with pytest.raises(DataError, match="no test list"):
        list_probe_set(str(tmp_path))


def test_vjepa_protocol_reads_the_middle_clip_and_reports_attentive_and_linear(ssv2):
    cfg = vjepa_cfg(ssv2)
    sc = build_scenario(cfg.scenario, cfg.stream)
    assert encoder_heads(sc.model) == 3  # the attentive probe's heads: the tiny ViT's
    source = load_probe_source(cfg.data, cfg.stream, cfg.eval)
    clips = source.load(source.train[:2], "centre", np.random.default_rng(0))
    assert clips.shape == (2, 4, 3, 32, 32)  # eval.vjepa.frames_per_clip frames
    # 20 frames at 24 fps, 4 frames at 12 fps: stride 2, span 6, 14 clips; the middle one (7) starts at frame 7
    grey = [round((float(f[:, :4, :4].mean()) * 255 - 20) / 10) for f in clips[0]]
    assert grey == [7, 9, 11, 13]
    out = sc.evaluate(sc.model, cfg.eval, probe=source)
    assert set(out) == {"eval/attentive_top1", "eval/linear_top1"} and all(0 <= v <= 1 for v in out.values())


def test_lists_in_a_bucket_give_the_metrics_of_the_local_copy(ssv2, tmp_path, monkeypatch):
    videos = sorted((ssv2 / "20bn-something-something-v2").glob("*.webm"))
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "train.csv").write_text("".join(f"videos/{v.name} {i % 3}\n" for i, v in enumerate(videos[:9])))
    (lists / "val.csv").write_text("".join(f"videos/{v.name} {i}\n" for i, v in enumerate(videos[9:])))
    (lists / "videos").symlink_to(ssv2 / "20bn-something-something-v2")
    local = vjepa_cfg(lists, "eval.metrics=[knn,linear]")
    sc = build_scenario(local.scenario, local.stream)
    want = sc.evaluate(sc.model, local.eval, probe=load_probe_source(local.data, local.stream, local.eval))
    files = {**{f"k400/{n}": lists / n for n in ("train.csv", "val.csv")},
             **{f"k400/videos/{v.name}": v for v in videos}}
    with bucket_holding(tmp_path, files, monkeypatch) as bucket:
        remote = vjepa_cfg(f"{bucket}/k400", "eval.metrics=[knn,linear]", f"data.cache_dir={tmp_path / 'cache'}")
        source = load_probe_source(remote.data, remote.stream, remote.eval)
        assert source.train[0].path == f"{bucket}/k400/videos/{videos[0].name}" and source.train[0].source
        got = sc.evaluate(sc.model, remote.eval, probe=source)
    assert got == want and set(got) == {"eval/knn_top1", "eval/linear_top1"}


def test_class_folders_of_videos_still_load_as_before(ssv2, tmp_path):
    """Not a published layout: eval.dataset falls back to raystream/eval/labelled_videos.py (clips in memory, 70/30
    split)."""
    for c in range(2):
        (tmp_path / f"class{c}").mkdir()
        for v in (101 + 3 * c, 102 + 3 * c, 103 + 3 * c):
            (tmp_path / f"class{c}" / f"{v}.webm").symlink_to(ssv2 / "20bn-something-something-v2" / f"{v}.webm")
    assert list_probe_set(str(tmp_path)) is None
    cfg = tiny_cfg(tmp_path, "default", "[knn]", "stream.frames_per_clip=2", "stream.fps=12")
    source = load_probe_source(cfg.data, cfg.stream, cfg.eval)
    assert source.kind == "clips" and source.num_classes == 2 and len(source.train) + len(source.test) > 0
