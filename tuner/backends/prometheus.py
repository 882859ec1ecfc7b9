"""A server's Prometheus ``/metrics`` text, read into numbers, and the change over a load point.

SGLang with ``--enable-metrics`` exports counters (``sglang:evicted_tokens_total``), gauges
(``sglang:num_queue_reqs``) and histograms (``sglang:time_to_first_token_seconds_bucket|sum|count``).
A load point keeps what changed while it ran: counter and histogram ``_sum``/``_count`` deltas,
and gauges as last read. Label sets are summed (one server, several DP ranks), buckets dropped;
for the labels named in ``split_labels`` each value is also kept on its own, as
``name{label=value}`` (e.g. ``sglang:cached_tokens_total{cache_source=host}``: prefix tokens loaded
back from the host cache; ``sglang:realtime_tokens_total{dp_rank=3}``: one attention-DP rank's).
"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([^\s]+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
MAX_BYTES = 4 * 2**20
MAX_LABEL_VALUE_CHARS = 64
# labels whose values say where work went: cache tier, prefill/decode mode, attention-DP rank
BREAKDOWN_LABELS = ("cache_source", "mode", "dp_rank")


def labelled(name: str, label: str, value: str) -> str:
    """The key under which one label value of a metric is kept."""
    return f"{name}{{{label}={value}}}"


def base_name(key: str) -> str:
    return key.split("{", 1)[0]


def parse_metrics(text: str, *, prefix: str = "", split_labels: tuple[str, ...] = ()) -> dict[str, float]:
    """``{metric name: value summed over label sets}``, histogram buckets left out; plus
    ``name{label=value}`` sums for each label in ``split_labels`` that a line carries."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, raw = m.groups()
        if (prefix and not name.startswith(prefix)) or name.endswith("_bucket") or name.endswith("_created"):
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[name] = out.get(name, 0.0) + value
        if split_labels and labels:
            for label, lv in _LABEL.findall(labels):
                if label in split_labels and len(lv) <= MAX_LABEL_VALUE_CHARS and lv.replace("_", "").isalnum():
                    key = labelled(name, label, lv)
                    out[key] = out.get(key, 0.0) + value
    return out


def scrape(url: str, *, timeout_s: float = 10.0, prefix: str = "",
           split_labels: tuple[str, ...] = ()) -> dict[str, float] | None:
    """Metrics at ``url`` (None if the server does not answer or exports none)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            if resp.status != 200:
                return None
            text = resp.read(MAX_BYTES).decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return parse_metrics(text, prefix=prefix, split_labels=split_labels) or None


def is_cumulative(name: str) -> bool:
    return base_name(name).endswith(("_total", "_sum", "_count"))


def window_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """Counters and histogram sums/counts as the change between two reads; gauges as last read."""
    if not after:
        return None
    before = before or {}
    out: dict[str, float] = {}
    for name, value in after.items():
        if is_cumulative(name):
            delta = value - before.get(name, 0.0)
            out[name] = round(delta if delta >= 0 else value, 6)  # a restart resets counters
        else:
            out[name] = round(value, 6)
    return out
