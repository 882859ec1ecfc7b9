"""Live progress of a running study (rich), on stderr so --json output stays clean."""

from __future__ import annotations

import textwrap
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tuner.lifecycle import TrialStatus


class StudyProgress:
    def __init__(self, study_name: str, budget: int, *, enabled: bool = True):
        self.console = Console(stderr=True)
        self.study_name = study_name
        self.budget = budget
        self.enabled = enabled
        self.done = 0
        self.best: tuple[int, int] | None = None  # (capacity, trial)
        self.baseline: int | None = None
        self.running: dict[int, dict] = {}
        self.recent: list[str] = []
        self.t0 = time.time()
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False) if enabled else None

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.update(self._render())
            self.live.__exit__(*exc)

    def study_best(self, capacity_users: int | None, trial_number: int | None) -> None:
        """The study's own best once it ran: among trials of equal capacity it picks the one with the
        most headroom to the SLO, which the running display (first to reach it) does not know."""
        if capacity_users is not None and trial_number is not None:
            self.best = (capacity_users, trial_number)

    def line(self, text: str) -> None:
        if self.enabled:
            self.console.print(text)

    def event(self, kind: str, data: dict) -> None:
        if kind == "notice":  # said once, whatever the display (stderr: --json output stays clean)
            self.console.print(data["message"], markup=False, highlight=False, soft_wrap=True)
            return
        if kind == "start":
            self.done = data.get("done", 0)
        elif kind == "trial_start":
            cfg = {k: v for k, v in data["config"].items() if v is not None}
            self.running[data["number"]] = {"config": cfg, "steps": [], "baseline": data.get("baseline")}
        elif kind == "capacity_start":
            r = self.running.get(data["number"])
            if r is not None:
                r["steps"].append(f"(from {data['users']})")
        elif kind == "measurement":
            r = self.running.get(data["number"])
            if r is not None:
                r["steps"].append(f"{data['users']}{'✓' if data['passed'] else '✗'}")
        elif kind == "trial_end":
            self.running.pop(data["number"], None)
            if data.get("launched"):
                self.done += 1
            cap = data.get("capacity")
            if data.get("baseline"):
                self.baseline = cap
            if data["status"] == TrialStatus.COMPLETE and cap is not None and (self.best is None or cap > self.best[0]):
                self.best = (cap, data["number"])
            msg = f"trial {data['number']}: {data['status']}"
            if data["status"] == TrialStatus.COMPLETE:
                msg += f", capacity {cap} users"
            elif data["status"] == TrialStatus.PRUNED:
                msg += f", {_short(data.get('reason'))}"
            elif data.get("reason"):
                msg += f" ({data.get('failure_class') or data['status']}: {_short(data['reason'])})"
            self.recent = (self.recent + [msg])[-6:]
        if self.live:
            self.live.update(self._render())

    def _render(self):
        elapsed = time.time() - self.t0
        head = Text.assemble(
            (f"study {self.study_name}  ", "bold"),
            f"trials {self.done}/{self.budget}  ",
            ("best " + (f"{self.best[0]} users (trial {self.best[1]})" if self.best else "-"), "green"),
            f"  baseline {self.baseline if self.baseline is not None else '-'}  ",
            f"{elapsed:,.0f}s",
        )
        table = Table(show_header=True, header_style="dim", box=None, expand=False)
        table.add_column("trial")
        table.add_column("configuration")
        table.add_column("users tried")
        for n, r in sorted(self.running.items()):
            cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
            table.add_row(str(n) + (" (baseline)" if r["baseline"] else ""), cfg[:110], " ".join(r["steps"]))
        return Group(head, table, Text("\n".join(self.recent), style="dim"))


def _short(reason, width: int = 140) -> str:
    """A reason for the live display: whole words, and an ellipsis where it was cut."""
    return textwrap.shorten(str(reason or ""), width=width, placeholder=" …")
