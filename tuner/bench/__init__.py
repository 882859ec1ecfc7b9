"""Benchmarks: measurements of tuner itself that print a figure (`tuner bench ...`).

* ``client``: how much streaming the replay client can take before it distorts what it measures;
* ``search`` (with ``table``): how few trials each sampler needs to find the best configuration,
  against the exhaustive grid measured on the simulator;
* ``simulator_cost``: the simulator's CPU time per load point and per capacity search;
* ``fidelity``: the simulator's predictions against committed real measurements (MAPE, SLO verdicts);
* ``dashboard`` (in ``tuner.report``): dashboard latency under concurrent GETs.

Each module computes a JSON-ready document; ``tuner.cli.bench`` prints it.
"""
