"""aicg/jit_cache.py: a JIT's compiled kernels are used only where their record and cubin check out."""
import logging

from aicg import digest
from aicg.jit_cache import CubinCache

KEY = "0123456789abcdef"


def test_a_kept_kernel_comes_back_with_its_record_and_its_outcome(tmp_path):
    cache = CubinCache(tmp_path)
    record = cache.put(KEY, b"cubin bytes", {"candidate": "c", "resources": {"registers": 32}})
    assert record["key"] == KEY and record["cubin_digest"] == digest.of_bytes(b"cubin bytes")
    cache.keep_outcome(record, "GPU A", "passed")
    cubin, again = CubinCache(tmp_path).get(KEY, tables=("validation", "resources"))
    assert cubin == b"cubin bytes" and again["validation"] == {"GPU A": "passed"} and again["candidate"] == "c"


def test_a_damaged_or_incomplete_entry_is_a_miss_said_in_the_log(tmp_path, caplog):
    cache = CubinCache(tmp_path)
    cache.put(KEY, b"cubin bytes", {"candidate": "c"})
    assert cache.get("fedcba9876543210") is None                     # nothing under that key: no word of it
    assert cache.get(KEY, tables=("validation", "resources")) is None   # no resources table
    cache.cubin_path(KEY).write_bytes(b"other bytes")
    with caplog.at_level(logging.WARNING, logger="aicg.jit"):
        assert cache.get(KEY) is None
    assert "does not match its digest" in caplog.text
    cache.cubin_path(KEY).unlink()
    assert cache.get(KEY) is None


def test_with_a_signing_key_an_unsigned_record_is_not_read(tmp_path):
    CubinCache(tmp_path).put(KEY, b"cubin bytes", {"candidate": "forged"})
    assert CubinCache(tmp_path, b"k" * 32).get(KEY) is None
    signed = CubinCache(tmp_path, b"k" * 32)
    signed.put(KEY, b"cubin bytes", {"candidate": "mine"})
    assert signed.get(KEY)[1]["candidate"] == "mine"
    assert CubinCache(tmp_path, b"j" * 32).get(KEY) is None
