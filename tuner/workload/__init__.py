"""Workloads: session model, fitting, trace importers, replay client and metrics."""
