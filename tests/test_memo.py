"""The bounded lookup the runtime's caches share (aicg/runtime/memo.py)."""
from aicg.runtime.memo import Memo


def test_a_full_lookup_starts_afresh_but_a_known_key_is_replaced_in_place():
    memo = Memo(kept=2)
    memo["a"], memo["b"] = 1, 2
    memo["b"] = 3                      # known: replaced, nothing forgotten
    assert memo == {"a": 1, "b": 3}
    memo["c"] = 4                      # new and full: the rest forgotten
    assert memo == {"c": 4} and memo.get("a") is None
