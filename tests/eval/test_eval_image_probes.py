"""Image probe sets (an ImageFolder, local or in a bucket) under eval.protocol=dino: DINO's views, kNN at
k 10/20/100/200 and the linear probe, on scikit-learn's digits written as JPEG and PNG class folders and a tiny
DoRA (its teacher's [CLS])."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raystream.config import ConfigError, compose
from raystream.data import DataError
from raystream.eval.loaders import load_probe_source
from raystream.eval.probe_sets import list_probe_set
from raystream.eval.views import dino_sizes, image_view
from raystream.models import build_scenario
from rs_eval_helpers import bucket_holding, tiny_cfg

CLASSES = (0, 1, 7)


def write_image_folder(root: Path, per_class=(8, 4)) -> Path:
    """train/<digit>/ and val/<digit>/ of scikit-learn's digits, 40x48 RGB, alternately .JPEG, .jpg and .png."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    exts = (".JPEG", ".png", ".jpg")
    for c in CLASSES:
        images = digits.images[digits.target == c]
        for split, start, count in (("train", 0, per_class[0]), ("val", per_class[0], per_class[1])):
            (root / split / f"digit{c}").mkdir(parents=True, exist_ok=True)
            for i in range(count):
                gray = (images[start + i] * (255 / 16)).astype(np.uint8)
                img = Image.fromarray(gray).resize((40, 48), Image.NEAREST).convert("RGB")
                ext = exts[i % 3]
                img.save(root / split / f"digit{c}" / f"{i}{ext}", quality=95)
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_image_folder(tmp_path_factory.mktemp("imagefolder"))


def dino_cfg(dataset, *extra):
    return tiny_cfg(dataset, "dino", "[knn,linear]", "eval.dino.batch_size=8", "eval.dino.epochs=2",
                    "eval.dino.warmup_epochs=1", *extra)


def test_an_image_folder_is_listed_with_its_classes_and_splits(folder):
    listing = list_probe_set(str(folder))
    assert listing.kind == "images" and listing.class_names == ("digit0", "digit1", "digit7")
    assert len(listing.train) == 24 and len(listing.test) == 12
    assert sorted({s.label for s in listing.test}) == [0, 1, 2]
    assert {Path(s.path).suffix for s in listing.train} == {".JPEG", ".png", ".jpg"}


def test_a_val_class_missing_from_train_is_named(tmp_path):
    root = write_image_folder(tmp_path / "set", per_class=(2, 1))
    (root / "val" / "digit9").mkdir()
    Image.new("RGB", (8, 8)).save(root / "val" / "digit9" / "a.png")
    with pytest.raises(DataError, match="digit9"):
        list_probe_set(str(root))


def test_dino_views_are_resize_and_centre_crop_scaled_to_the_model():
    assert dino_sizes(224, 256, 224) == (256, 224)
    assert dino_sizes(32, 256, 224) == (37, 32)  # the crop is the model's size, the resize keeps 256 / 224
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8))
    got = image_view(img, "centre", 37, 32, rng)
    want = np.asarray(img.resize((49, 37), Image.BICUBIC).crop((8, 2, 40, 34))).transpose(2, 0, 1)
    assert got.shape == (3, 32, 32) and np.array_equal(got, want)
    a, b = (image_view(img, "augment", 37, 32, np.random.default_rng(s)) for s in (1, 2))
    assert a.shape == (3, 32, 32) and not np.array_equal(a, b)  # random crops


def test_dino_protocol_reports_knn_at_four_k_and_the_linear_probe(folder):
    cfg = dino_cfg(folder)
    sc = build_scenario(cfg.scenario, cfg.stream)
    source = load_probe_source(cfg.data, cfg.stream, cfg.eval)
    x = source.load(source.train[:2], "centre", np.random.default_rng(0))
    assert x.shape == (2, 1, 3, 32, 32) and 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    out = sc.evaluate(sc.model, cfg.eval, probe=source)
    assert set(out) == {"eval/knn_top1_k10", "eval/knn_top1_k20", "eval/knn_top1_k100", "eval/knn_top1_k200",
                        "eval/linear_top1"}
    assert all(0.0 <= v <= 1.0 for v in out.values())
    assert out["eval/knn_top1_k10"] > 0.5  # digits 0, 1, 7 are told apart by random ViT features
    # k is capped by the training set (24 images): k 100 and k 200 are both the vote of every training image
    assert out["eval/knn_top1_k100"] == out["eval/knn_top1_k200"]
    cached = sc.evaluate(sc.model, dino_cfg(folder, "eval.linear_features=cached").eval, probe=source)
    assert {k: v for k, v in cached.items() if "knn" in k} == {k: v for k, v in out.items() if "knn" in k}


def test_the_augmented_linear_probe_encodes_fresh_views_each_epoch_and_cached_does_not(folder):
    cfg = dino_cfg(folder, "eval.metrics=[linear]")
    source = load_probe_source(cfg.data, cfg.stream, cfg.eval)
    sc = build_scenario(cfg.scenario, cfg.stream)
    seen = {"n": 0}
    encode = sc.encode

    def counting(model, clips):
        seen["n"] += clips.shape[0]
        return encode(model, clips)

    sc.encode = counting
    sc.evaluate(sc.model, cfg.eval, probe=source)
    assert seen["n"] == 24 + 12 + 2 * 24  # centre views once, then 2 epochs of augmented training views
    seen["n"] = 0
    sc.evaluate(sc.model, dino_cfg(folder, "eval.metrics=[linear]", "eval.linear_features=cached").eval,
                probe=source)
    assert seen["n"] == 24 + 12


def test_a_video_encoder_sees_each_image_repeated_over_its_frames(folder):
    """VideoMAE (tubelets of 2 frames) on an image probe set: each image becomes a still clip of stream frames."""
    cfg = compose(["scenario=videomae", "stream.resolution=32", f"eval.dataset={folder}", "eval.protocol=dino",
                   "eval.metrics=[knn]", "eval.max_probe_samples=6"])
    sc = build_scenario(cfg.scenario, cfg.stream)
    seen = []
    encode = sc.encode
    sc.encode = lambda model, clips: seen.append(tuple(clips.shape)) or encode(model, clips)
    out = sc.evaluate(sc.model, cfg.eval, probe=load_probe_source(cfg.data, cfg.stream, cfg.eval))
    assert set(out) == {f"eval/knn_top1_k{k}" for k in (10, 20, 100, 200)}
    assert {s[1:] for s in seen} == {(cfg.stream.frames_per_clip, 3, 32, 32)}


def test_a_protocol_without_the_probe_is_refused_by_the_config():
    with pytest.raises(ConfigError, match="eval.metrics"):
        compose(["eval.protocol=dino", "eval.metrics=[attentive]"])
    with pytest.raises(ConfigError, match="eval.linear_features"):
        compose(["eval.linear_features=some"])


def test_an_image_folder_in_a_bucket_gives_the_metrics_of_the_local_copy(folder, tmp_path, monkeypatch):
    local = dino_cfg(folder, "eval.linear_features=cached")
    sc = build_scenario(local.scenario, local.stream)
    want = sc.evaluate(sc.model, local.eval, probe=load_probe_source(local.data, local.stream, local.eval))
    files = {f"imagenet/{f.relative_to(folder).as_posix()}": f for f in folder.rglob("*") if f.is_file()}
    with bucket_holding(tmp_path, files, monkeypatch) as bucket:
        remote = dino_cfg(f"{bucket}/imagenet/", "eval.linear_features=cached",
                          f"data.cache_dir={tmp_path / 'cache'}")
        source = load_probe_source(remote.data, remote.stream, remote.eval)
        assert all(s.path.startswith("s3://") for s in source.train)
        got = sc.evaluate(sc.model, remote.eval, probe=source)
    assert got == want
    assert len(list((tmp_path / "cache").rglob("*.png"))) == 12  # fetched into the node cache
