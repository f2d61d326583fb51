"""`Recorder`: what a replay run measures, in bounded memory: one HdrHistogram of
latencies per measure (microseconds, 3 significant digits, up to an hour), counters
(ops sent by op, errors by kind) and fixed-interval time series (sums and peaks per
interval). Thread-safe: the sender, the REST readers and the Kafka threads all record.

Owns the measurements; must not import torch, kafka or the graph store.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from hdrh.histogram import HdrHistogram

_HIGHEST_US = 3600 * 10**6
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, _HIGHEST_US, 3)


class Recorder:
    """Latencies by measure, counters and time series from ``start`` (a `time.time()`)
    in ``interval_s`` bins."""

    def __init__(self, start: float, interval_s: float = 1.0) -> None:
        self.start, self.interval_s = start, interval_s
        self.histograms: dict[str, HdrHistogram] = {}
        self.sent: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.series: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def latency(self, measure: str, seconds: float, at: float | None = None,
                completes: bool = True) -> None:
        """One latency of ``measure`` (clamped to [1 us, 1 h]); unless not ``completes``,
        an op completed at ``at`` (default now) in the time series."""
        us = min(max(int(seconds * 1e6), 1), _HIGHEST_US)
        with self._lock:
            h = self.histograms.get(measure)
            if h is None:
                h = self.histograms[measure] = new_histogram()
            h.record_value(us)
            if completes:
                self._add("completed", time.time() if at is None else at, 1.0)

    def op_sent(self, op: str, at: float) -> None:
        with self._lock:
            self.sent[op] += 1
            self._add("sent", at, 1.0)

    def error(self, kind: str, at: float | None = None) -> None:
        with self._lock:
            self.errors[kind] += 1
            self._add("errors", time.time() if at is None else at, 1.0)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def add(self, series: str, at: float, value: float) -> None:
        """Add ``value`` to ``series``'s bin of time ``at``."""
        with self._lock:
            self._add(series, at, value)

    def peak(self, series: str, at: float, value: float) -> None:
        """Raise ``series``'s bin of time ``at`` to ``value`` if larger."""
        with self._lock:
            values = self._bins(series, at)
            i = max(int((at - self.start) / self.interval_s), 0)
            values[i] = max(values[i], value)

    def _add(self, series: str, at: float, value: float) -> None:
        self._bins(series, at)[max(int((at - self.start) / self.interval_s), 0)] += value

    def _bins(self, series: str, at: float) -> list[float]:
        """The series, grown to the bin of ``at`` (earlier times: the first bin)."""
        values = self.series.setdefault(series, [])
        n = max(int((at - self.start) / self.interval_s), 0) + 1
        if len(values) < n:
            values.extend([0.0] * (n - len(values)))
        return values

    def summary(self) -> dict[str, Any]:
        """Everything as plain data: percentiles in ms per measure, the histograms
        encoded (HdrHistogram's compressed base64, for `replay report`), counters and
        the series, all the same length."""
        with self._lock:
            n = max((len(v) for v in self.series.values()), default=0)
            return {
                "latency_ms": {m: percentiles_ms(h) for m, h in sorted(self.histograms.items())},
                "histograms": {m: h.encode().decode() for m, h in sorted(self.histograms.items())},
                "sent": dict(self.sent), "errors": dict(self.errors), "counts": dict(self.counts),
                "series": {"interval_s": self.interval_s,
                           **{k: v + [0.0] * (n - len(v)) for k, v in sorted(self.series.items())}},
            }


def percentiles_ms(h: HdrHistogram) -> dict[str, float]:
    """count, mean, p50, p90, p99, p99.9 and max of ``h`` (microseconds) in ms."""
    out = {"count": h.get_total_count(), "mean": round(h.get_mean_value() / 1e3, 3)}
    for p in PERCENTILES:
        out[f"p{p:g}"] = round(h.get_value_at_percentile(p) / 1e3, 3)
    out["max"] = round(h.get_max_value() / 1e3, 3)
    return out
