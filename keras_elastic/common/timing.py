"""Per-phase wall-clock timers: the phase table of a worker's steps that the
benches and the job summary print."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

# The phases of the table, in display order.
PHASES = ("get_batch", "input_wait", "compute", "pull", "push")

PHASE_HELP = {
    "get_batch": "get tasks + read records (overlapped with training)",
    "input_wait": "training waited for input (dataset_fn + batching not hidden)",
    "compute": "forward + backward pass",
    "pull": "decode + assign new model values",
    "push": "send gradients, PS applies, reply arrives",
    "lookup": "the step waited for embedding rows (looked up, or looked up ahead)",
    "evaluate": "evaluation, including waits for the epoch's end and the round",
    "predict": "prediction, including writing outputs",
}


class PhaseTimer:
    """Thread-safe accumulator of seconds per phase."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self._totals[phase] = self._totals.get(phase, 0.0) + seconds

    @contextmanager
    def time(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - start)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self._totals)


def format_table(totals: dict[str, float], total_time: float | None = None) -> str:
    """Formats seconds per phase as the seed's markdown-like table."""
    phases = [p for p in PHASES if p in totals] + sorted(
        p for p in totals if p not in PHASES)
    head = (["total"] if total_time is not None else []) + phases
    row = ([f"{total_time:.1f}"] if total_time is not None else []) + [
        f"{totals[p]:.1f}" for p in phases]
    widths = [max(len(h), len(r)) for h, r in zip(head, row)]
    lines = [" | ".join(h.rjust(w) for h, w in zip(head, widths)),
             " | ".join("-" * w for w in widths),
             " | ".join(r.rjust(w) for r, w in zip(row, widths))]
    return "\n".join(lines)
