"""The storage layer (mdd/storage.py), on a local disk and on a real S3 API (moto on 127.0.0.1):
whole-or-nothing files, staged stages that commit or change nothing, roll-forward of an
interrupted commit, quarantine of unreadable shards, refusal of foreign files."""
from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from mdd import storage
from mdd.storage import ShardError, StageFailed, Store, StorageError, dialogue_shards


@pytest.fixture(params=["local", "s3"])
def new_store(request, tmp_path):
    """``new_store(name)``: an empty output root of the kind under test."""
    if request.param == "local":
        return lambda name="out": Store(tmp_path / name)
    new_uri = request.getfixturevalue("s3_server")
    return lambda name="out": Store(new_uri())


@pytest.fixture
def store(new_store) -> Store:
    return new_store()


def _snapshot(store: Store) -> dict[str, bytes]:
    return {f: store.read_bytes(f) for f in store.files(recursive=True)}


def _shard(ids: list[str]) -> pa.Table:
    return pa.table({"dialogue_id": ids, "case_id": [i.split("-")[0] for i in ids],
                     "turns": pa.array([[{"speaker": "doctor", "text": "你好", "topic": None}]] * len(ids))})


def test_write_is_whole_and_repeatable(store):
    t = pa.table({"a": list(range(100))})
    store.write_table(t, "x/t.parquet")
    first = store.read_bytes("x/t.parquet")
    store.write_table(t, "x/t.parquet")
    assert store.read_bytes("x/t.parquet") == first  # same table, same bytes
    assert store.read_table("x").equals(t) and store.files("x") == ["t.parquet"]
    store.write_text("x/.hidden", "leftover")  # hidden names are never listed as outputs
    assert store.files(recursive=True) == ["x/t.parquet"]
    store.update_run_json("a", {"n": 1})
    store.update_run_json("b", 2)
    assert store.read_run_json() == {"a": {"n": 1}, "b": 2}


def test_out_that_is_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(StorageError, match="is a file"):
        Store(tmp_path / "f").check_root()


def _previous(store: Store) -> None:
    store.write_table(pa.table({"v": [1]}), "eval/turns/part-00000.parquet")
    store.write_table(pa.table({"v": [1]}), "eval/rules/part-00000.parquet")
    store.write_text("index/meta.json", "{}")
    store.update_run_json("evaluate", {"old": True})
    store.update_run_json("synthesize", {"kept": True})


def _stage_body(st: storage.Staging) -> None:
    st.out.write_table(pa.table({"v": [2, 2]}), "eval/turns/part-00000.parquet")
    st.out.write_text("index/meta.json", '{"new": true}')
    st.run_json["evaluate"] = {"new": True}


def test_staged_commit_replaces_the_targets_whole(store):
    _previous(store)
    with store.staged("evaluate", ("eval", "index")) as st:
        _stage_body(st)
    assert store.files(recursive=True) == ["eval/turns/part-00000.parquet", "index/meta.json", "run.json"]
    assert store.read_table("eval/turns").column("v").to_pylist() == [2, 2]  # rules/ of the old run is gone
    assert store.read_run_json() == {"evaluate": {"new": True}, "synthesize": {"kept": True}}
    assert not store.exists(storage.STAGING)


def test_failed_stage_changes_nothing_and_says_so(store):
    _previous(store)
    before = _snapshot(store)
    with pytest.raises(StageFailed) as err:
        with store.staged("evaluate", ("eval", "index")) as st:
            _stage_body(st)
            raise ValueError("disk full")
    msg = str(err.value)
    assert "ValueError: disk full" in msg and "unchanged" in msg and "\n" not in msg
    assert _snapshot(store) == before
    assert not store.exists(storage.STAGING)


def test_failed_first_stage_says_nothing_was_written(store):
    with pytest.raises(StageFailed, match="nothing was written"):
        with store.staged("evaluate", ("eval", "index")) as st:
            st.out.write_text("eval/x.json", "{}")
            raise RuntimeError("boom")
    assert store.files(recursive=True) == []


def test_validation_refuses_a_file_that_does_not_read_back(store):
    _previous(store)
    before = _snapshot(store)
    with pytest.raises(StageFailed, match="rows written"):
        with store.staged("evaluate", ("eval", "index")) as st:
            _stage_body(st)
            st.out.written["eval/turns/part-00000.parquet"] = 3  # as if the store had lost a row
    assert _snapshot(store) == before


def test_interrupted_commit_is_rolled_forward_by_the_next_run(new_store, monkeypatch):
    """A crash at every step after the commit point: the next run of the stage finishes it."""
    clean = new_store("clean")
    _previous(clean)
    with clean.staged("evaluate", ("eval", "index")) as st:
        _stage_body(st)
    expected = _snapshot(clean)
    steps = 0
    for crash_at in range(1, 30):
        store = new_store(f"crash{crash_at}")
        _previous(store)
        calls = {"n": 0}

        def crashing(fn):
            def wrapper(self, *a, **kw):
                calls["n"] += 1
                if calls["n"] == crash_at:
                    raise OSError("killed")
                return fn(self, *a, **kw)
            return wrapper

        with monkeypatch.context() as m:
            for name in ("move", "delete", "update_run_json"):
                m.setattr(Store, name, crashing(getattr(Store, name)))
            try:
                with store.staged("evaluate", ("eval", "index")) as st:
                    _stage_body(st)
                    calls["n"] = 0  # count from the commit on
            except StorageError as exc:
                assert "interrupted" in str(exc)
            else:
                steps = crash_at - 1
                break
        store.recover("evaluate")
        assert _snapshot(store) == expected, crash_at
    assert steps >= 4  # the commit has that many steps, each crashed once above


def test_unreadable_shard_is_quarantined_and_logged(store, caplog):
    store.write_table(_shard(["A-v0", "A-v1"]), "synth/part-a.parquet")
    store.write_bytes("synth/part-b.parquet", store.read_bytes("synth/part-a.parquet")[:-20])  # truncated
    store.write_bytes("synth/part-c.parquet", b"not parquet at all")
    with pytest.raises(ShardError, match="part-b.parquet cannot be read"):
        dialogue_shards(store, quarantine=False)
    assert store.files("synth") == ["part-a.parquet", "part-b.parquet", "part-c.parquet"]  # nothing moved
    with caplog.at_level(logging.WARNING, logger="mdd.storage"):
        shards, moved = dialogue_shards(store, quarantine=True)
    assert shards == {"part-a.parquet": ["A-v0", "A-v1"]}
    assert [m["moved_to"] for m in moved] == ["quarantine/synth/part-b.parquet", "quarantine/synth/part-c.parquet"]
    assert store.files("quarantine/synth") == ["part-b.parquet", "part-c.parquet"]
    lines = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in x for x in lines)
    store.write_bytes("synth/part-b.parquet", b"broken again")  # a second one of the same name keeps both
    dialogue_shards(store, quarantine=True)
    assert store.files("quarantine/synth") == ["part-b.parquet", "part-b.parquet.1", "part-c.parquet"]


def test_foreign_parquet_is_refused_and_never_moved(store):
    store.write_table(_shard(["A-v0"]), "synth/part-a.parquet")
    store.write_table(pa.table({"name": ["x"], "score": [1.0]}), "synth/notes.parquet")
    for quarantine in (True, False):
        with pytest.raises(ShardError) as err:
            dialogue_shards(store, quarantine=quarantine)
        assert "notes.parquet is not a dialogue shard" in str(err.value) and "\n" not in str(err.value)
    assert store.files("synth") == ["notes.parquet", "part-a.parquet"]


def test_describe_error_reaches_the_innermost_cause():
    try:
        try:
            raise KeyError("inner")
        except KeyError as exc:
            raise RuntimeError("wrapper\nwith a traceback") from exc
    except RuntimeError as exc:
        assert storage.describe_error(exc) == "KeyError: 'inner'"
