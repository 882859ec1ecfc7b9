"""Memory planner: weights, KV capacity and OOM risk of an SGLang configuration on a GPU."""

from .memory import MemoryPlan, kv_cell_bytes, plan_memory, resolve_checkpoint
from .parallel import ParallelLayout, parse_layout

__all__ = ["MemoryPlan", "ParallelLayout", "kv_cell_bytes", "parse_layout", "plan_memory", "resolve_checkpoint"]
