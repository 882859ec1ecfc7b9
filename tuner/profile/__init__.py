"""``tuner profile``: SGLang's own operator times at the shapes each GPU sees, as tables the
simulator interpolates (``tuner.sim.optable``), plus the check that they compose into whole steps.

GPU code lives in ``sglang_kernels`` (imports torch and sglang lazily); everything else runs on a
CPU with ``FakeKernels`` / ``FakeTimer``.
"""

from .compose import compose, fit_step_overhead, read_whole_steps
from .kernels import FakeKernels, Kernels
from .plan import ProfilePlan, build_plan
from .runner import run_profile, write_profile
from .timing import CudaGraphTimer, FakeTimer, Runnable, Timer

__all__ = ["CudaGraphTimer", "FakeKernels", "FakeTimer", "Kernels", "ProfilePlan", "Runnable", "Timer", "build_plan",
           "compose", "fit_step_overhead", "read_whole_steps", "run_profile", "write_profile"]
