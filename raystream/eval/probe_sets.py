"""Probe sets as their authors publish them, listed (nothing decoded): `eval.dataset` names one of

- an ImageFolder root (ImageNet's layout): `train/<class>/<image>` and `val/<class>/<image>` (.JPEG, .jpg, .png);
- Something-Something v2: `something-something-v2-labels.json` ({"template text": "index"}) with
  `something-something-v2-train.json` and `-validation.json` as the original release names them, or `labels.json`,
  `train.json` and `validation.json` as the plain names in use (entries {id, label, template, placeholders}; the
  class is the template with its brackets removed), and the videos `<id>.webm` anywhere under the root (SSv2
  unpacks them into `20bn-something-something-v2/`);
- a folder of `path label` lists (VideoMAE's and V-JEPA's for SSv2 and Kinetics-400): `train.csv` (or .txt) and
  `val.csv` (or `validation.*`, `test.*`); lines `path label`, space or comma separated, an optional header line,
  integer labels, paths relative to the list's folder or absolute (or URIs).

Each may be local or under a bucket prefix (`s3://bucket/prefix/`, `gs://...`); objects are listed once here and
fetched into the node cache only when loaded. Anything else is None: the caller falls back to labelled video
folders.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from raystream.data.errors import DataError
from raystream.data.videos import remote
from raystream.data.videos.remote import RemoteObject, join_uri, stat_objects
from raystream.uris import is_uri

KEY = "eval.dataset"
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")
SSV2_RELEASE = "something-something-v2-"  # the original release's prefix of each file name
SSV2_LABELS = f"{SSV2_RELEASE}labels.json"
SSV2_SPLITS = ("train", "validation")
LIST_TRAIN = ("train.csv", "train.txt")
LIST_TEST = ("val.csv", "val.txt", "validation.csv", "validation.txt", "test.csv", "test.txt")


@dataclass(frozen=True)
class Sample:
    """One labelled image or video: a local path or a URI (with its listed object), and its class index."""

    path: str
    label: int
    source: Optional[RemoteObject] = None


@dataclass
class ProbeListing:
    """The samples of a published probe set: `kind` is "images" or "videos"; `layout` names the format."""

    kind: str
    layout: str
    train: List[Sample]
    test: List[Sample]
    class_names: Tuple[str, ...]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def list_probe_set(dataset: str) -> Optional[ProbeListing]:
    """The listing of `dataset` when it is one of the published layouts above, else None."""
    root = _Root(dataset)
    if root.is_file(SSV2_LABELS) or (root.is_file("labels.json") and root.is_file("train.json")):
        return _ssv2(root)
    train_list = next((n for n in LIST_TRAIN if root.is_file(n)), None)
    if train_list is not None:
        return _lists(root, train_list)
    if root.has_image_folder():
        return _image_folder(root)
    return None


class _Root:
    """A folder or bucket prefix: which files it has, their text, the files under it with given extensions."""

    def __init__(self, dataset: str):
        self.dataset = dataset
        self.remote = is_uri(dataset)
        self.base = dataset.rstrip("/") if self.remote else str(Path(dataset).expanduser())
        self._listed: Dict[Tuple[str, ...], List[Tuple[str, str, Optional[RemoteObject]]]] = {}

    def join(self, rel: str) -> str:
        if is_uri(rel) or (not self.remote and os.path.isabs(rel)):
            return rel
        return join_uri(self.base + "/", rel) if self.remote else os.path.normpath(os.path.join(self.base, rel))

    def is_file(self, name: str) -> bool:
        return self.text(name, required=False) is not None

    def text(self, name: str, required: bool = True) -> Optional[str]:
        if self.remote:
            found = remote.read_text(self.join(name), KEY)
        else:
            p = Path(self.join(name))
            found = p.read_text() if p.is_file() else None
        if found is None and required:
            raise DataError(f"{KEY} = {self.dataset!r}: {name} not found")
        return found

    def files(self, extensions: Sequence[str]) -> List[Tuple[str, str, Optional[RemoteObject]]]:
        """(path relative to the root with '/', full path or URI, listed object) of every file under the root whose
        name ends in one of `extensions`, sorted."""
        exts = tuple(extensions)
        if exts not in self._listed:
            if self.remote:
                objects = remote.list_prefix(self.base + "/", KEY, exts, recursive=True)
                found = [(o.uri[len(self.base) + 1:], o.uri, o) for o in objects]
            else:
                found = []
                for folder, _, names in os.walk(self.base, followlinks=True):  # datasets are often linked in
                    for name in names:
                        if os.path.splitext(name)[1].lower() in exts:
                            full = os.path.join(folder, name)
                            found.append((os.path.relpath(full, self.base).replace(os.sep, "/"), full, None))
            self._listed[exts] = sorted(found)
        return self._listed[exts]

    def has_image_folder(self) -> bool:
        if not self.remote:
            return (Path(self.base) / "train").is_dir() and (Path(self.base) / "val").is_dir()
        return any(rel.startswith("train/") for rel, _, _ in self.files(IMAGE_EXTENSIONS))


def _image_folder(root: _Root) -> ProbeListing:
    by_split: Dict[str, List[Tuple[str, str, Optional[RemoteObject]]]] = {"train": [], "val": []}
    for rel, full, obj in root.files(IMAGE_EXTENSIONS):
        parts = rel.split("/")
        if len(parts) == 3 and parts[0] in by_split:
            by_split[parts[0]].append((parts[1], full, obj))
    names = tuple(sorted({c for c, _, _ in by_split["train"]}))
    if len(names) < 2:
        raise DataError(f"{KEY} = {root.dataset!r}: an image folder needs train/<class>/<image> for at least 2 "
                        f"classes ({', '.join(IMAGE_EXTENSIONS)}), found {list(names)}")
    unknown = sorted({c for c, _, _ in by_split["val"]} - set(names))
    if unknown:
        raise DataError(f"{KEY} = {root.dataset!r}: val/ has classes that train/ lacks: {unknown[:5]}")
    if not by_split["val"]:
        raise DataError(f"{KEY} = {root.dataset!r}: val/<class>/ holds no images ({', '.join(IMAGE_EXTENSIONS)})")
    index = {c: i for i, c in enumerate(names)}
    train, test = ([Sample(full, index[c], obj) for c, full, obj in by_split[s]] for s in ("train", "val"))
    return ProbeListing("images", "image folder", train, test, names)


def _ssv2_file(root: _Root, name: str) -> str:
    """`something-something-v2-<name>.json` (the release's name) or `<name>.json`, whichever the root has; a
    DataError naming both when it has neither."""
    names = (f"{SSV2_RELEASE}{name}.json", f"{name}.json")
    found = next((n for n in names if root.is_file(n)), None)
    if found is None:
        raise DataError(f"{KEY} = {root.dataset!r}: a Something-Something v2 folder without its {name} split: "
                        f"looked for {names[0]} and {names[1]}")
    return found


def _ssv2(root: _Root) -> ProbeListing:
    labels_file = _ssv2_file(root, "labels")
    labels = _json(root, labels_file)
    if not isinstance(labels, dict):
        raise DataError(f"{root.join(labels_file)}: expected an object {{\"template\": \"index\"}}")
    names_by_index = {int(v): k for k, v in labels.items()}
    names = tuple(names_by_index[i] for i in sorted(names_by_index))
    videos = {os.path.splitext(rel.rsplit("/", 1)[-1])[0]: (full, obj) for rel, full, obj in root.files((".webm",))}
    splits = []
    for split in [_ssv2_file(root, name) for name in SSV2_SPLITS]:
        entries, samples = _json(root, split), []
        for i, e in enumerate(entries):
            try:
                vid, template = str(e["id"]), str(e["template"])
            except (KeyError, TypeError):
                raise DataError(f"{root.join(split)}: entry {i} is {e!r}; expected {{id, label, template, "
                                "placeholders}") from None
            cls = template.replace("[", "").replace("]", "")
            if cls not in labels:
                raise DataError(f"{root.join(split)}: entry {i} (id {vid}) has template {template!r}, which is not "
                                f"in {labels_file} (with its brackets removed: {cls!r})")
            if vid not in videos:
                raise DataError(f"{KEY} = {root.dataset!r}: video {vid}.webm of {split} (entry {i}) not found "
                                "under the root")
            samples.append(Sample(videos[vid][0], int(labels[cls]), videos[vid][1]))
        splits.append(samples)
    return ProbeListing("videos", "something-something-v2", splits[0], splits[1], names)


def _json(root: _Root, name: str):
    try:
        return json.loads(root.text(name))
    except json.JSONDecodeError as exc:
        raise DataError(f"{root.join(name)}: not JSON ({exc})") from None


def _lists(root: _Root, train_name: str) -> ProbeListing:
    test_name = next((n for n in LIST_TEST if root.is_file(n)), None)
    if test_name is None:
        raise DataError(f"{KEY} = {root.dataset!r}: has {train_name} but no test list (one of "
                        f"{', '.join(LIST_TEST)})")
    train, test = (_read_list(root, n) for n in (train_name, test_name))
    classes = 1 + max(s.label for s in train + test)
    if root.remote:
        found = stat_objects([s.path for s in train + test if is_uri(s.path)], KEY)
        train, test = ([Sample(s.path, s.label, found.get(s.path)) for s in part] for part in (train, test))
    return ProbeListing("videos", "path label lists", train, test, tuple(str(c) for c in range(classes)))


def _read_list(root: _Root, name: str) -> List[Sample]:
    out, first = [], True
    for n, line in enumerate((ln.strip() for ln in root.text(name).splitlines()), 1):
        if not line or line.startswith("#"):
            continue
        header, first = first, False
        parts = line.rsplit(",", 1) if "," in line else line.rsplit(None, 1)  # the label is the last field
        path, label = (p.strip() for p in parts) if len(parts) == 2 else (parts[0], "")
        if not label.isdigit():
            if header:
                continue  # a header line (e.g. `path,label`)
            raise DataError(f"{root.join(name)}, line {n}: {line!r}; expected `path label` (space or comma "
                            "separated) with an integer label")
        out.append(Sample(root.join(path), int(label)))
    if not out:
        raise DataError(f"{root.join(name)}: lists no videos; expected `path label` lines")
    return out
