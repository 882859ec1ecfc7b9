"""SGLang-format server logs of decode windows with a known step model (for the decode-step tests)."""

from __future__ import annotations

import numpy as np

START = 1_764_900_000  # epoch seconds


def _stamp(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def write_decode_log(path, *, c_ms: dict[int, float], k_ms_per_ktok: float, tokens_of, seed: int, windows: int = 60,
         prefill_every: int = 4):
    """A log of decode windows (40 steps each) whose step is c[batch] + k x tokens, with a prefill batch
    (and a much slower window) every few windows."""
    rng = np.random.default_rng(seed)
    t, lines, pure, prev = float(START), [], 0, None
    for i in range(windows):
        batch = int(rng.choice(list(c_ms)))
        tokens = int(tokens_of(batch, rng))
        step_s = (c_ms[batch] + k_ms_per_ktok * tokens / 1000) / 1000 * rng.normal(1.0, 0.01)
        wall = 40 * step_s
        if i % prefill_every == 0:
            wall += 0.5
            lines.append(f"[{_stamp(t + wall / 2)}] Prefill batch, #new-seq: 1, #new-token: 2000, #cached-token: 0, "
                         f"token usage: 0.01, #running-req: {batch}, #queue-req: 0,")
        t += wall
        pure += i > 0 and batch == prev and i % prefill_every != 0
        prev = batch
        # the line ending a window carries that window's batch and throughput; the one before it
        # (ending the previous window) carries its batch at the window's start
        lines.append(f"[{_stamp(t)}] Decode batch, #running-req: {batch}, #token: {tokens}, token usage: 0.05, "
                     f"cuda graph: True, gen throughput (token/s): {40 * batch / wall:.2f}, #queue-req: 0")
    path.write_text("\n".join(lines) + "\n")
    return pure  # windows of one batch size without a prefill batch
