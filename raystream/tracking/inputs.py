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

The driver makes the events before Ray starts from plain values the train layer hands it (`input_events` of
`VideoSet`s: each set's context, name, source and index rows, made by train/inputs.py from what data/ resolved, none
of the videos decoded) and appends them to the run's record; the mirror writes them with
`MlflowClient.log_inputs` (`log`), which MLflow keeps once per (run, name, digest): a replay writes no second input.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from dataclasses import dataclass
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


@dataclass(frozen=True)
class VideoSet:
    """One dataset input as plain values: its context (training, heldout, probe), name, source (a path or URI)
    and index rows."""

    context: str
    name: str
    source: str
    rows: Sequence[Row]


def input_events(run_id: str, sets: Iterable[VideoSet]) -> List[Dict[str, Any]]:
    """The record's `input` events of a run, one per set. A set MLflow cannot describe is said on stderr and left
    out: the inputs never stop a run."""
    from raystream.tracking import events  # lazy: events imports nothing heavy, but keeps this module's top light

    out = []
    for one in sets:
        try:
            fields = dataset(one.name, one.source, list(one.rows), one.context)
        except Exception as exc:
            print(f"raystream: WARNING: the {one.context} videos are not logged as an MLflow dataset input "
                  f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})", file=sys.stderr,
                  flush=True)
            continue
        out.append(events.dataset_input(run_id, one.context, fields))
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
