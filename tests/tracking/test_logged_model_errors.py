"""MLflow's answers told apart by their error code (`MlflowException.error_code`), not by their message text:
a registered model or alias the store lacks, one made twice (tracking/logged_model.py, tracking/registry.py).
A real sqlite store."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from raystream.tracking import logged_model, registry
from raystream.tracking.store import prepare_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    prepare_store(uri)
    return uri, MlflowClient(tracking_uri=uri, registry_uri=uri)


def test_the_store_s_codes_say_missing_and_made_twice(store):
    _, client = store
    with pytest.raises(Exception) as missing:
        client.get_registered_model("raystream-nothing")
    assert logged_model.error_code(missing.value) in logged_model.NOT_FOUND
    client.create_registered_model("raystream-twice")
    with pytest.raises(Exception) as twice:
        client.create_registered_model("raystream-twice")
    assert logged_model.error_code(twice.value) in logged_model.ALREADY_EXISTS
    assert logged_model.error_code(ValueError("RESOURCE_DOES_NOT_EXIST")) == ""  # the text alone says nothing


@pytest.mark.parametrize("uri", ["models:/raystream-nothing@s0", "models:/raystream-twice@s9",
                                 "models:/raystream-nothing/3", "models:/m-0123456789abcdef0123456789abcdef"])
def test_a_uri_naming_nothing_is_said_as_such_not_as_a_server_away(store, uri):
    where, _ = store
    with pytest.raises(registry.ModelUriError) as got:
        registry.model_id_of(uri, where)
    assert "no such model, alias or version" in str(got.value) and uri in str(got.value)


def test_a_server_that_does_not_answer_is_said_as_such(tmp_path):
    with pytest.raises(registry.ModelUriError) as got:
        registry.model_id_of("models:/raystream-nothing@s0", "http://127.0.0.1:9")
    assert "did not answer" in str(got.value)
