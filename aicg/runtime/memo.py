"""A lookup that forgets everything once it is full.

A serving loop meets a few hundred shapes or call signatures; a sweep over
thousands must not grow a lookup without bound. Starting afresh costs each key
one recomputation, and reads stay plain dict reads on the hot path.
"""
from __future__ import annotations

KEPT = 4096


class Memo(dict):
    def __init__(self, kept: int = KEPT):
        super().__init__()
        self.kept = kept

    def __setitem__(self, key, value):
        if len(self) >= self.kept and key not in self:
            self.clear()
        super().__setitem__(key, value)
