"""A run's videos as MLflow dataset inputs: the UI's "Datasets used", and `mlflow.search_runs` filters on them.

Every run logs its training videos, its held-out videos and its probe set, each an MLflow dataset input with the
context `training`, `heldout` or `probe` (MLflow's `mlflow.data.context` input tag). The dataset (`VideoSet`, an
`mlflow.data` Dataset) is named by what the config gave (a directory's or manifest's name, the demo's kind), its
source is where the videos are (`mlflow.data`'s sources: a local path, `s3://`, `gs://`), and its digest is a hash
of the video index: every video's name, size in bytes and frame count (probe sets: name, size, label). Two runs on
the same videos show the same digest, whatever the machine or path they were read from:

    mlflow.search_runs(filter_string="dataset.digest = '<digest>'")            # the runs on these videos
    mlflow.search_runs(filter_string="dataset.context = 'heldout' AND dataset.name = 'val'")

The profile (shown beside the digest) holds the counts (frames: null for held-out videos no index records) and
the first `MAX_URIS` videos' URIs.

The driver makes the events before Ray starts (`input_events`: the training videos from the stream it has opened
anyway, the held-out videos and the probe set from their listing and index, none of them decoded) and appends them
to the run's record; the mirror writes them with `MlflowClient.log_inputs` (`log`), which MLflow keeps once per
(run, name, digest): a replay writes no second input.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

TRAINING, HELDOUT, PROBE = "training", "heldout", "probe"
CONTEXT_TAG = "mlflow.data.context"  # MLflow's own input tag (what `mlflow.log_input(..., context=)` sets)
MAX_URIS = 100  # in a dataset's profile

Row = Tuple[str, Optional[int], Optional[int], str]  # (name, size in bytes, frames or label, URI)


def digest(rows: Iterable[Row]) -> str:
    """The hash of a video index: each video's name, size and frame count (or label), in order."""
    text = json.dumps([[name, size, count] for name, size, count, _ in rows], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]  # MLflow's advice: at most 10 characters


def dataset(name: str, source: str, rows: Sequence[Row], context: str) -> Dict[str, Any]:
    """The fields of the MLflow dataset entity (name, digest, source_type, source, schema, profile) of the video
    index `rows` read from `source` (a path or URI), made with mlflow.data's own objects."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source  # lazy: MLflow
    from mlflow.data.meta_dataset import MetaDataset  # lazy: MLflow

    class VideoSet(MetaDataset):
        """A set of videos, by its index: MLflow's metadata-only dataset with the index's digest and profile."""

        @property
        def profile(self) -> Dict[str, Any]:
            counted = [c for _, _, c, _ in rows if c is not None]
            count = "labels" if context == PROBE else "frames"
            return {"videos" if context != PROBE else "samples": len(rows),
                    "bytes": sum(s for _, s, _, _ in rows if s is not None),
                    count: len(set(counted)) if context == PROBE else (sum(counted) if counted else None),
                    "uris": [u for _, _, _, u in rows[:MAX_URIS]]}

        def to_dict(self) -> Dict[str, str]:
            return {**super().to_dict(), "profile": json.dumps(self.profile)}

    with warnings.catch_warnings():  # a local path matches two of MLflow's local sources, which are one class
        warnings.simplefilter("ignore", UserWarning)
        where = resolve_dataset_source(_source_uri(source))
    entity = VideoSet(where, name=name, digest=digest(rows))._to_mlflow_entity()
    return {"name": entity.name, "digest": entity.digest, "source_type": entity.source_type,
            "source": entity.source, "schema": entity.schema, "profile": entity.profile}


def _source_uri(source: str) -> str:
    return source if "://" in source else os.path.abspath(os.path.expanduser(source))


def _size(path: str, listed: Optional[int]) -> Optional[int]:
    if listed is not None:
        return int(listed)
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _given(spec: Any) -> Tuple[str, str]:
    """(dataset name, source) of a config's video spec: a path or URI as it is (its last part names it); a list
    by its first video's folder."""
    if isinstance(spec, str):
        return _name(spec) or spec, spec
    first = str(list(spec)[0])
    folder = first.rsplit("/", 1)[0] if "/" in first else "."
    return f"{_name(folder)} ({len(list(spec))} videos)", folder


def video_rows(videos: Sequence[Any]) -> List[Row]:
    """The index rows of probed videos (`data.videos.listing.VideoInfo`: a stream's videos)."""
    rows = []
    for v in videos:
        uri = v.source.uri if v.source is not None else v.path
        rows.append((_name(uri), _size(v.path, v.source.size if v.source is not None else None), int(v.num_frames),
                     uri))
    return rows


def listed_rows(spec: Any, key: str) -> List[Row]:
    """The index rows of the videos `spec` lists, frame counts from their directory's `raystream-index.json`
    (None where none is recorded): nothing is opened or downloaded."""
    from raystream.data.videos.index import read_index  # lazy: the data package (decoders) for a run only
    from raystream.data.videos.listing import resolve_videos  # lazy: as above

    entries = resolve_videos(spec, key)
    indexes: Dict[str, Dict[str, dict]] = {}
    rows = []
    for e in entries:
        folder = e.path.rsplit("/", 1)[0] if "://" in e.path else os.path.dirname(os.path.abspath(e.path))
        if folder not in indexes:
            try:
                indexes[folder] = read_index(folder, key)
            except Exception:  # an unreadable index: the frame counts stay unknown, the run is not held up
                indexes[folder] = {}
        frames = indexes[folder].get(_name(e.path), {}).get("num_frames")
        rows.append((_name(e.path), _size(e.path, e.source.size if e.source is not None else None),
                     int(frames) if frames is not None else None, e.path))
    return rows


def probe_rows(dataset_spec: str) -> List[Row]:
    """The rows of a probe set (`eval.dataset`): each sample's name, size and class, train samples first."""
    from raystream.eval.labelled_videos import labelled_entries  # lazy: the eval package (torch, PIL)
    from raystream.eval.probe_sets import list_probe_set  # lazy: as above

    listing = list_probe_set(dataset_spec)
    if listing is not None:
        samples = [(s.path, s.source.size if s.source is not None else None, int(s.label))
                   for s in [*listing.train, *listing.test]]
    else:
        samples = [(e.path, e.source.size if e.source is not None else None, e.label)
                   for e in labelled_entries(dataset_spec)]
    return [(_name(p), _size(p, size), label, p) for p, size, label in samples]


def input_events(cfg, run_id: str, training_videos: Sequence[Any], needs: Iterable[str]) -> List[Dict[str, Any]]:
    """The record's `input` events of a run: its training videos (`training_videos`: the stream's probed videos),
    held-out videos (when its scenario evaluates on them: `needs` holds `heldout`) and probe set (`eval.dataset`,
    when set). A set that cannot be listed is said on stderr and left out: the inputs never stop a run."""
    from raystream.data.demo.videos import demo_dir, ensure_demo_videos  # lazy: the data package, for a run only
    from raystream.tracking import events  # lazy: events imports nothing heavy, but keeps this module's top light

    def training() -> Dict[str, Any]:
        if cfg.data.videos is not None:
            name, source = _given(cfg.data.videos)
        else:
            name, source = f"demo-{cfg.data.demo.kind}", str(demo_dir(cfg.data.demo, False))
        return dataset(name, source, video_rows(training_videos), TRAINING)

    def heldout() -> Optional[Dict[str, Any]]:
        if cfg.data.heldout_videos is not None:
            name, source = _given(cfg.data.heldout_videos)
            return dataset(name, source, listed_rows(cfg.data.heldout_videos, "data.heldout_videos"), HELDOUT)
        if cfg.data.videos is not None or "heldout" not in set(needs):
            return None
        videos = [str(p) for p in ensure_demo_videos(cfg.data.demo, heldout=True)]  # the workers' too: made once
        return dataset(f"demo-{cfg.data.demo.kind}-heldout", str(demo_dir(cfg.data.demo, True)),
                       listed_rows(videos, "data.heldout_videos"), HELDOUT)

    def probe() -> Optional[Dict[str, Any]]:
        if cfg.eval.dataset is None:
            return None
        spec = str(cfg.eval.dataset)
        return dataset(_name(spec) or spec, spec, probe_rows(spec), PROBE)

    out = []
    for context, make in ((TRAINING, training), (HELDOUT, heldout), (PROBE, probe)):
        try:
            fields = make()
        except Exception as exc:  # a listing that fails here fails the run later, where it is read, with its name
            print(f"raystream: WARNING: the {context} videos are not logged as an MLflow dataset input "
                  f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})", file=sys.stderr,
                  flush=True)
            continue
        if fields is not None:
            out.append(events.dataset_input(run_id, context, fields))
    return out


def log(client, run_id: str, context: str, fields: Dict[str, Any], attempt) -> None:
    """Write one `input` event: the dataset as an input of the run, tagged with its context (MLflow keeps one per
    run, name and digest; one already there is left as it is)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag  # lazy: MLflow

    run = attempt(lambda: client.get_run(run_id), "read run inputs")
    for have in (run.inputs.dataset_inputs if run.inputs is not None else []):
        tags = {t.key: t.value for t in have.tags}
        if (have.dataset.name, have.dataset.digest, tags.get(CONTEXT_TAG)) == (fields["name"], fields["digest"],
                                                                                context):
            return
    given = DatasetInput(Dataset(**fields), tags=[InputTag(CONTEXT_TAG, context)])
    attempt(lambda: client.log_inputs(run_id, datasets=[given]), "log dataset input")
