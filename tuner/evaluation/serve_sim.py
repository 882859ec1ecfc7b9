"""The ``serve-sim`` backend kind: the live evaluator against ``tuner serve-sim`` servers."""

from __future__ import annotations

from tuner.backends.serve_sim import ServeSimBackend
from tuner.evaluation.live import LiveEvaluator


class ServeSimEvaluator(LiveEvaluator):
    def __init__(self):
        super().__init__(ServeSimBackend())
