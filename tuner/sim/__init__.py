"""Serving simulator: SGLang's scheduler as a discrete-event simulation timed by a first-principles
step-time model (see docs/calibration.md)."""

from .simulate import simulate_load_point

__all__ = ["simulate_load_point"]
