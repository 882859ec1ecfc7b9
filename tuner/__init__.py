"""tuner: find the serving configuration that serves the most users within latency targets."""

__version__ = "0.1.0"
