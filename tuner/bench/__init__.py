"""Benchmarks of tuner itself: how well it predicts and searches (the fidelity benchmark is
``tuner.bench.fidelity``)."""
