import os

import pytest

from aicg import cas, digest

OUTPUTS = {"build/a.cubin": b"\x7fELF cubin bytes", "build/a.json": b'{"registers": 32}'}


@pytest.fixture
def store(tmp_path):
    return cas.Store(tmp_path / "cas")


@pytest.fixture
def entry(store):
    """An action entry whose blobs are in the store."""
    outputs = {path: store.put_blob(data) for path, data in OUTPUTS.items()}
    e = cas.ActionEntry(key=digest.of_value({"step": "compile", "n": 1}), step="compile", outputs=outputs)
    store.put_action(e)
    return e


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


# --- blobs -------------------------------------------------------------------

@pytest.mark.parametrize("data", [b"", b"x", bytes(range(256)) * 10])
def test_blob_round_trip(store, data):
    d = store.put_blob(data)
    assert d == digest.of_bytes(data)
    assert store.get_blob(d) == data
    assert store.put_blob(data) == d          # putting it again is harmless


def test_unknown_blob_is_a_miss(store):
    assert store.get_blob(digest.of_bytes(b"never stored")) is None


def test_every_flipped_byte_makes_a_blob_a_miss(store):
    data = b"some artifact bytes"
    d = store.put_blob(data)
    path = store._object_path(d)
    for i in range(len(data)):
        corrupt = bytearray(data)
        corrupt[i] ^= 0xFF
        path.write_bytes(bytes(corrupt))
        assert store.get_blob(d) is None, i


def test_every_truncation_makes_a_blob_a_miss(store):
    data = b"some artifact bytes"
    d = store.put_blob(data)
    for n in range(len(data)):
        store._object_path(d).write_bytes(data[:n])
        assert store.get_blob(d) is None, n


def test_a_blob_file_holding_another_blobs_bytes_is_a_miss(store):
    a, b = store.put_blob(b"blob a"), store.put_blob(b"blob b")
    store._object_path(a).write_bytes(b"blob b")
    assert store.get_blob(a) is None
    assert store.get_blob(b) == b"blob b"


def test_putting_a_blob_again_repairs_a_corrupt_object(store):
    d = store.put_blob(b"artifact")
    store._object_path(d).write_bytes(b"garbage")
    store.put_blob(b"artifact")
    assert store.get_blob(d) == b"artifact"


# --- action entries ----------------------------------------------------------

def test_action_round_trip(store, entry):
    assert store.get_action(entry.key) == entry
    assert store.fetch_outputs(entry) == OUTPUTS


def test_unknown_action_is_a_miss(store):
    assert store.get_action(digest.of_value("nothing")) is None


def test_every_flipped_byte_makes_an_action_a_miss(store, entry):
    path = store._action_path(entry.key)
    good = path.read_bytes()
    for i in range(len(good)):
        corrupt = bytearray(good)
        corrupt[i] ^= 0xFF
        path.write_bytes(bytes(corrupt))
        assert store.get_action(entry.key) is None, i


def test_every_truncation_makes_an_action_a_miss(store, entry):
    path = store._action_path(entry.key)
    good = path.read_bytes()
    for n in range(len(good)):
        path.write_bytes(good[:n])
        assert store.get_action(entry.key) is None, n


@pytest.mark.parametrize("content", [b"not msgpack at all \xc1", digest.pack([b"x", digest.of_bytes(b"x")]),
                                     digest.pack({"a": 1}), digest.pack(42)])
def test_foreign_content_in_an_action_file_is_a_miss(store, entry, content):
    store._action_path(entry.key).write_bytes(content)
    assert store.get_action(entry.key) is None


def test_an_action_entry_under_another_key_is_a_miss(store, entry):
    other = digest.of_value({"step": "compile", "n": 2})
    target = store._action_path(other)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(store._action_path(entry.key).read_bytes())
    assert store.get_action(other) is None
    assert store.get_action(entry.key) == entry


def test_fetch_outputs_is_none_if_any_blob_is_missing(store, entry):
    store._object_path(entry.outputs["build/a.json"]).unlink()
    assert store.fetch_outputs(entry) is None


def test_fetch_outputs_is_none_if_any_blob_is_corrupt(store, entry):
    store._object_path(entry.outputs["build/a.cubin"]).write_bytes(b"\x7fELF other bytes")
    assert store.fetch_outputs(entry) is None


def test_an_entry_whose_blob_is_missing_restores_nothing(store, entry):
    store._object_path(entry.outputs["build/a.json"]).unlink()
    assert store.fetch_outputs(store.get_action(entry.key)) is None


# --- write_atomic ------------------------------------------------------------

def test_write_atomic_creates_and_replaces_leaving_no_temp_files(tmp_path):
    target = tmp_path / "deep" / "dir" / "file.bin"
    cas.write_atomic(target, b"old")
    cas.write_atomic(target, b"new content")
    assert target.read_bytes() == b"new content"
    assert _files(tmp_path) == ["deep/dir/file.bin"]


@pytest.mark.parametrize("fail_in", ["replace", "fsync"])
def test_a_failed_write_keeps_the_old_content_and_no_temp_file(tmp_path, monkeypatch, fail_in):
    target = tmp_path / "file.bin"
    cas.write_atomic(target, b"old content")

    def boom(*args, **kwargs):
        raise OSError("simulated failure")
    monkeypatch.setattr(os, fail_in, boom)
    with pytest.raises(OSError, match="simulated failure"):
        cas.write_atomic(target, b"new content that never lands")
    monkeypatch.undo()

    assert target.read_bytes() == b"old content"
    assert _files(tmp_path) == ["file.bin"]


def test_a_failed_first_write_leaves_no_file(tmp_path, monkeypatch):
    def boom(*args):
        raise OSError("simulated failure")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        cas.write_atomic(tmp_path / "new.bin", b"data")
    assert _files(tmp_path) == []
