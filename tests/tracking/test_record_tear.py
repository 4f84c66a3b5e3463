"""A run's record survives its own tear (issue 51): a kill or a full disk can cut `events.jsonl` at any byte. A
reader leaves a torn last line out and names it, a writer reopening the record cuts it off before appending, and
a torn line in the middle (written by an older writer that appended after the tear) is named and skipped; the
upload and the resume go on, and every whole event reaches MLflow (a real sqlite store) exactly once."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raystream.tracking import client as make_client
from raystream.tracking import events, mirror, start_run

STEPS = 8


def _record(path, run_id: str, uri: str) -> bytes:
    """A finished run's record: open, STEPS metric lines, a tag, the end. Returns its bytes."""
    lines = [events.opened(run_id, uri)]
    lines += [events.metrics(run_id, s, {"loss": 1.0 / (s + 1)}, 1000 + s) for s in range(STEPS)]
    lines += [events.tag(run_id, "k", "v"), events.end(run_id, "FINISHED")]
    data = b"".join(json.dumps(e, sort_keys=True).encode() + b"\n" for e in lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def _whole(data: bytes):
    return [json.loads(line) for line in data.split(b"\n") if line.strip()]


def _last_lines_offsets(data: bytes, lines: int):
    """Every byte offset inside the last `lines` lines (a cut there leaves the lines before whole)."""
    start = len(data.rstrip(b"\n").rsplit(b"\n", lines)[0]) + 1
    return range(start, len(data))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    return uri, make_client(uri)


def test_a_record_cut_at_any_byte_of_its_last_lines_is_read_and_sealed(tmp_path, capsys):
    """Without MLflow, at every offset: the reader gives the whole events before the cut and names the torn line;
    reopened for append, the record holds those events, then the new ones, and no line is broken."""
    path = tmp_path / "run" / events.FILE_NAME
    data = _record(path, "r", "sqlite:///x.db")
    for cut in _last_lines_offsets(data, 3):
        path.write_bytes(data[:cut])
        before = _whole(data[:data.rfind(b"\n", 0, cut) + 1])
        record = events.Record(str(path))
        assert [e for e, _ in record.read()] == before
        if data[cut - 1:cut] != b"\n":
            line, offset, size = record.torn()
            assert (line, offset + size) == (len(before) + 1, cut)
        record.append([events.opened("r", "sqlite:///x.db"), events.end("r", "FINISHED")])
        record.close()
        assert record.torn() is None
        assert [e for e, _ in events.Record(str(path)).read()] == [*before, events.opened("r", "sqlite:///x.db"),
                                                                  events.end("r", "FINISHED")]
    assert "was cut short" in capsys.readouterr().err


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_record_cut_anywhere_resumes_and_uploads_every_whole_event_once(store, tmp_path_factory, data):
    """A run mirrored part way, killed mid-line, resumed (its writer reopens the record and appends two more steps
    and its end), then uploaded: MLflow holds every step exactly once and the run FINISHED."""
    uri, client = store
    run_id = start_run(client, experiment="tear", uri=uri, run_name="r")
    path = tmp_path_factory.mktemp("tear") / "run" / events.FILE_NAME
    whole = _record(path, run_id, uri)
    offsets = _last_lines_offsets(whole, 4)
    cut = data.draw(st.integers(offsets.start, offsets.stop - 1), label="cut")
    mirrored = data.draw(st.integers(1, 4), label="lines mirrored before the kill")
    path.write_bytes(b"".join(line + b"\n" for line in whole.split(b"\n")[:mirrored]))
    assert mirror.main(str(path)) == 0
    path.write_bytes(whole[:cut])  # the kill: the rest of the record, cut at `cut`
    kept = [e["step"] for e in _whole(whole[:whole.rfind(b"\n", 0, cut) + 1]) if e["kind"] == "metrics"]

    resumed = events.Record(str(path))  # the resumed run's writer
    resumed.append([events.opened(run_id, uri),
                    *(events.metrics(run_id, s, {"loss": 0.5}, 2000 + s) for s in (STEPS, STEPS + 1)),
                    events.end(run_id, "FINISHED")])
    resumed.close()
    assert mirror.main(str(path)) == 0
    assert mirror.main(str(path)) == 0  # again: nothing written twice
    steps = [m.step for m in client.get_metric_history(run_id, "loss")]
    assert sorted(steps) == sorted({*kept, STEPS, STEPS + 1})
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_torn_line_in_the_middle_is_named_and_the_upload_goes_on(store, tmp_path, capsys):
    """What an older writer left: half a line with the next `open` glued onto it. The upload names the line and
    its offset, and writes the events after it."""
    uri, client = store
    run_id = start_run(client, experiment="tear", uri=uri, run_name="r")
    path = tmp_path / "run" / events.FILE_NAME
    whole = _record(path, run_id, uri)
    lines = whole.split(b"\n")
    glued = lines[4][:20] + json.dumps(events.opened(run_id, uri)).encode()
    path.write_bytes(b"\n".join([*lines[:4], glued, *lines[5:]]))
    offset = len(b"\n".join(lines[:4])) + 1
    assert mirror.main(str(path)) == 0
    err = capsys.readouterr()
    assert f"line 5 (byte {offset}" in err.err and "skipped" in err.err
    assert "mirrored in full" in err.out
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [s for s in range(STEPS) if s != 3]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_an_end_cut_in_half_is_not_called_mirrored_in_full(store, tmp_path, capsys):
    uri, client = store
    run_id = start_run(client, experiment="tear", uri=uri, run_name="r")
    path = tmp_path / "run" / events.FILE_NAME
    whole = _record(path, run_id, uri)
    path.write_bytes(whole[:-20])
    assert mirror.main(str(path)) == 0
    out = capsys.readouterr()
    assert "in full" not in out.out + out.err
    assert f"last line {STEPS + 3}" in out.err and "cut short" in out.err
    assert f"no end of MLflow run {run_id}" in out.err and "RUNNING" in out.err
    assert client.get_run(run_id).info.status == "RUNNING"
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == list(range(STEPS))
