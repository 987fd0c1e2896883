import math
from pathlib import Path

import pytest
import xxhash

from aicg import digest


def test_dict_insertion_order_does_not_change_the_encoding():
    a = {"b": 1, "a": [1, 2, {"y": 2.5, "x": None}], "c": {"q": b"\x00", "p": "s"}}
    b = {"c": {"p": "s", "q": b"\x00"}, "a": [1, 2, {"x": None, "y": 2.5}], "b": 1}
    assert a == b and list(a) != list(b)
    assert digest.pack(a) == digest.pack(b)
    assert digest.of_value(a) == digest.of_value(b)


@pytest.mark.parametrize("x, y", [
    ({"a": 1}, {"a": 2}),
    ({"a": 1}, {"b": 1}),
    ({"a": [1]}, {"a": [1, 1]}),
    ([1, 2], [2, 1]),
    (1, 1.0),
    (True, 1),
    (None, 0),
    ("1", 1),
    (b"a", "a"),
    (0.1, math.nextafter(0.1, 1.0)),   # floats keep their full binary value
    (0.0, -0.0),
])
def test_different_values_give_different_digests(x, y):
    assert digest.of_value(x) != digest.of_value(y)


def test_tuples_and_lists_encode_alike():
    assert digest.pack((1, (2, "x"), {"k": (3,)})) == digest.pack([1, [2, "x"], {"k": [3]}])


def test_a_path_encodes_as_its_posix_string():
    assert digest.pack({"p": Path("a/b.cuh")}) == digest.pack({"p": "a/b.cuh"})


def test_unpack_inverts_pack():
    value = {"a": [1, -2, 3.5, math.nextafter(0.1, 1.0)], "b": {"c": None, "d": b"\xff"}, "e": True}
    assert digest.unpack(digest.pack(value)) == value


def test_of_bytes_is_xxh3_128_and_of_file_agrees(tmp_path):
    data = b"aicg\x00\x01"
    assert digest.of_bytes(data) == xxhash.xxh3_128_hexdigest(data)
    assert len(digest.of_bytes(data)) == 32
    (tmp_path / "f").write_bytes(data)
    assert digest.of_file(tmp_path / "f") == digest.of_bytes(data)


def test_equal_dicts_with_int_and_str_keys_digest_alike():
    a = {1: "int key", "1": "str key"}
    b = {"1": "str key", 1: "int key"}
    assert a == b
    assert digest.of_value(a) == digest.of_value(b)
