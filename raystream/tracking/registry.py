"""`models:/` URIs as starts: `scenario.backbone.init=models:/raystream-table1-start@s0` on any machine that reaches
the tracking server.

`resolve(uri)` asks MLflow which LoggedModel the URI names (`models:/<model_id>`, `models:/<name>@<alias>`,
`models:/<name>/<version>`; registry and tracking at the same URI), then fetches the model's files once into the
node's cache the caller names (`<cache>/<model_id>`; train/model_uri.py passes `<cache root>/models`; written under
a temporary name and renamed into place, so two workers of a node never read half a download) and returns its
`data/model.pth` (a raystream model saved by `tracking/logged_model.py`; train hands the models package that local
file for a `models:/` init, which `models.checkpoint` reads as a state dict).

Which tracking server: the one `use(uri)` named in this process (the driver's run and each worker set the run's),
else `MLFLOW_TRACKING_URI` or the embedded default (`store.tracking_uri`). A URI that names no model, alias or
version, or a server that does not answer, is a ModelUriError naming the URI and the server, raised at once (no
minutes of HTTP retries): train/model_uri.py makes it a CheckpointError, the driver's check before Ray starts a
ConfigError.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Tuple

from raystream.tracking.logged_model import NOT_FOUND, error_code


SCHEME = "models"
MODEL_FILE = os.path.join("data", "model.pth")  # MLflow's PyTorch flavour: the pickled module (models/saved.py)
_USED: Optional[str] = None
# the store answered that the URI names nothing: no such model or version (RESOURCE_DOES_NOT_EXIST), or no such
# alias (MLflow 3 answers INVALID_PARAMETER_VALUE for an alias a registered model lacks)
NO_SUCH_MODEL = (*NOT_FOUND, "INVALID_PARAMETER_VALUE")


class ModelUriError(ValueError):
    """A `models:/` URI that names no model, or a server that does not answer; the message names both."""


def use(tracking_uri: Optional[str]) -> None:
    """`models:/` URIs resolved in this process go to `tracking_uri` (None: the default again)."""
    global _USED
    _USED = tracking_uri


def current_uri() -> str:
    from raystream.tracking.store import tracking_uri  # lazy: store reads the config module's defaults

    return _USED or tracking_uri()


def model_id_of(uri: str, tracking_uri: Optional[str] = None) -> Tuple[str, str]:
    """(model id, what the URI named: `model m-...`, `raystream-table1-start version 2 (alias s0)`) of a
    `models:/` URI; ModelUriError naming the URI and the server when there is no such model or no answer."""
    from raystream.tracking.store import client, failing_fast  # lazy: MLflow

    where = tracking_uri or current_uri()
    rest = uri[len(f"{SCHEME}:/"):].strip("/")
    if not rest:
        raise ModelUriError(f"scenario.backbone.init = {uri!r}: expected models:/<model_id>, "
                              "models:/<name>@<alias> or models:/<name>/<version>")
    try:
        with failing_fast():
            mlflow = client(where)
            if "@" in rest:
                name, alias = rest.split("@", 1)
                version = mlflow.get_model_version_by_alias(name, alias)
                return _of_version(version, uri), f"{name} version {version.version} (alias {alias})"
            if "/" in rest:
                name, number = rest.split("/", 1)
                version = mlflow.get_model_version(name, number)
                return _of_version(version, uri), f"{name} version {version.version}"
            return mlflow.get_logged_model(rest).model_id, f"model {rest}"
    except ModelUriError:
        raise
    except Exception as exc:
        raise ModelUriError(f"scenario.backbone.init = {uri!r}: {_why(exc, where)}") from None


def _of_version(version, uri: str) -> str:
    model_id = getattr(version, "model_id", None)
    found = re.search(r"(?:^models:/|/models/)(m-[0-9a-f]+)(?:/artifacts)?/?$", str(version.source))
    if not model_id and found:  # a store that keeps no model id on its versions: the source names it
        model_id = found.group(1)
    if not model_id:
        raise ModelUriError(f"scenario.backbone.init = {uri!r}: version {version.version} of {version.name} is "
                              f"not a LoggedModel (source {version.source}); register one logged by raystream")
    return model_id


def _why(exc: BaseException, where: str) -> str:
    text = " ".join(str(exc).split())
    if error_code(exc) in NO_SUCH_MODEL:  # the store's error code, not its message text
        return f"no such model, alias or version in the MLflow registry at {where} ({text[:300]})"
    return (f"the MLflow tracking server at {where} did not answer ({type(exc).__name__}: {text[:300]}); "
            "check that it runs and that mlflow.tracking_uri or $MLFLOW_TRACKING_URI names it")


def resolve(uri: str, cache: Path, tracking_uri: Optional[str] = None) -> Path:
    """The local `data/model.pth` of the model `uri` names, fetched into `cache` (the node's cache of models, which
    the caller names: train/model_uri.py) on first use."""
    from raystream.tracking.store import client, failing_fast  # lazy: MLflow

    where = tracking_uri or current_uri()
    model_id, _ = model_id_of(uri, where)
    final = Path(cache) / model_id
    if (final / MODEL_FILE).is_file():
        return final / MODEL_FILE
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_id}.", dir=final.parent))
    try:
        import mlflow.artifacts  # lazy: MLflow

        with failing_fast(), _no_progress_bar():  # the model's own location: `models:/` would ask the default store
            location = client(where).get_logged_model(model_id).artifact_location
            got = Path(mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=str(tmp),
                                                           tracking_uri=where, registry_uri=where))
        if not (got / MODEL_FILE).is_file():
            raise ModelUriError(f"scenario.backbone.init = {uri!r}: model {model_id} holds no {MODEL_FILE} "
                                "(not a PyTorch model logged by raystream)")
        try:
            os.rename(got, final)
        except OSError:  # another worker of this node moved its copy in first
            if not (final / MODEL_FILE).is_file():
                raise
    except ModelUriError:
        raise
    except Exception as exc:
        raise ModelUriError(f"scenario.backbone.init = {uri!r}: cannot fetch model {model_id}: "
                            f"{_why(exc, where)}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final / MODEL_FILE


@contextmanager
def _no_progress_bar():
    """MLflow's download progress bar off (one line a file in a worker's log)."""
    before = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = before


def pinned(uri: str, tracking_uri: Optional[str] = None) -> str:
    """`models:/<model_id>` for any `models:/` URI: what a run's workers load, so an alias moved while the run
    trains (or before it resumes) does not change its start."""
    return f"{SCHEME}:/{model_id_of(uri, tracking_uri)[0]}"

