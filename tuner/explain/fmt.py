"""Numbers as the sentences of a diagnosis write them."""

from __future__ import annotations


def tokens(v: float | None) -> str:
    """0.72 M, 21 k, 950."""
    if v is None:
        return "?"
    v = float(v)
    if abs(v) >= 1e5:
        return f"{v / 1e6:.2g} M" if abs(v) < 1e6 else f"{v / 1e6:.3g} M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.3g} k"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.2g} k"
    return f"{v:.0f}"


def pct(v: float | None) -> str:
    return "?" if v is None else f"{100 * v:.0f}%"


def seconds(v: float | None) -> str:
    if v is None:
        return "?"
    if v < 1:
        return f"{v * 1000:.3g} ms"
    return f"{v:.3g} s"


def ms(v: float | None) -> str:
    return "?" if v is None else f"{v * 1000:.3g} ms"


def ratio(v: float | None) -> str:
    return "?" if v is None else f"{v:.2g}x"
