"""MLflow's tracking server (the Flask app `mlflow server` serves, `mlflow.server.app`, over a sqlite store) on
127.0.0.1, in this test process, which a test stops (the port closed: connections refused, as when the server
died) and starts again on the same port: a tracking outage, for the tests of raystream's buffered metric logging.

In-process because `mlflow server` takes 10 s (idle machine) to over a minute (the shared CI machine) to start,
and a test starts it twice. One store per test session: MLflow's handlers keep the first store they open.
"""

from __future__ import annotations

import os
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from local_cloud import free_port

_ROOT: Optional[Path] = None


def _app():
    global _ROOT
    if _ROOT is None:
        from mlflow.server import ARTIFACT_ROOT_ENV_VAR, BACKEND_STORE_URI_ENV_VAR

        _ROOT = Path(tempfile.mkdtemp(prefix="raystream-mlflow-server-"))
        os.environ[BACKEND_STORE_URI_ENV_VAR] = f"sqlite:///{_ROOT / 'mlflow.db'}"
        os.environ[ARTIFACT_ROOT_ENV_VAR] = (_ROOT / "artifacts").as_uri()
    from mlflow.server import app

    return app


class RestartableMlflow:
    def __init__(self):
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self._server = None
        self._thread = None

    def start(self) -> None:
        from werkzeug.serving import make_server

        self._server = make_server("127.0.0.1", self.port, _app(), threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def kill(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = None


@contextmanager
def restartable_mlflow() -> Iterator[RestartableMlflow]:
    server = RestartableMlflow()
    server.start()
    try:
        yield server
    finally:
        server.kill()
