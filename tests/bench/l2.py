"""The benchmarks' eviction of the L2 before a timed call (PyTorch only: every bench script takes it)."""
from __future__ import annotations

import torch


def l2_flush(mode: str):
    """A call that evicts the L2: by reading twice its size (clean lines left) or by a memset (dirty ones)."""
    if mode not in ("read", "write"):
        raise ValueError(f"AICG_BENCH_FLUSH={mode!r}: expected 'read' or 'write'")
    buffer = torch.zeros(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, dtype=torch.int32, device="cuda")
    total = torch.empty((), dtype=torch.int64, device="cuda")
    return (lambda: torch.sum(buffer, dim=0, out=total)) if mode == "read" else buffer.zero_
