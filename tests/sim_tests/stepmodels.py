"""The simulator's step model of one real SGLang 0.5.17 server, as the step-time tests build it."""

from __future__ import annotations

from tuner.catalog import get_gpu, get_model
from tuner.sim.simulate import _prepare

# the studies' servers: Triton attention, prefill without CUDA graphs
TRITON_EAGER = {"attention-backend": "triton", "disable-prefill-cuda-graph": True}


def server_step_model(model, gpu: str, flags: dict, calibration: dict | None = None, *,
                      base: dict = TRITON_EAGER):
    """``tuner.sim.simulate._prepare``'s step model of a one-GPU server: ``model`` a catalog name or
    spec, ``flags`` over ``base``, the committed calibration (its context's values) unless given."""
    return _prepare(get_model(model), get_gpu(gpu), 1, {**base, **flags}, {}, 1, None, calibration, "0.5.17")[3]
