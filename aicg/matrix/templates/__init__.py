"""Each matrix template's rules, by template name (the names of space.toml)."""
from __future__ import annotations

from .base import Geometry, GpuLimits, TemplateRules
from .gemv import GemvRules
from .mma import MmaRules
from .wgmma import WgmmaRules

RULES: dict[str, TemplateRules] = {r.name: r for r in (WgmmaRules(), MmaRules(), GemvRules())}

__all__ = ["RULES", "Geometry", "GpuLimits", "TemplateRules"]
