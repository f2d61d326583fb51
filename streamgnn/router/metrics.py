"""`Stats`: what a service did since it started, in memory that does not grow with time —
counters, gauges and `Histogram`s (HdrHistogram, fixed size) — and the same figures in
Prometheus' text format from a registry of the service's own (`Stats.registry`, never the
global one: several services in one process do not clash). The in-process summary reads
the histograms' percentiles; ``/metrics`` (`streamgnn.api`) renders `Stats.exposition`.

`Counts`: what the service did to its state since the state was bootstrapped, kept in
every checkpoint: a restart resumes them from its checkpoint and counts the replayed
batches again, so they equal an uninterrupted run's (`Stats.state_counts`).

Owns the service's metrics only; must not import kafka, torch or mpi4py.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from hdrh.histogram import HdrHistogram
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

_HIGHEST_US = 3_600_000_000  # one hour, in microseconds
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
             30.0, 60.0)
"""Upper bounds of the Prometheus histogram buckets, seconds."""


class Histogram:
    """Durations in milliseconds, kept as an HdrHistogram (1 µs to 1 h, 2 significant
    digits: about 27 KB, whatever it records; longer durations count as 1 h) plus their
    exact sum: percentiles here, cumulative buckets for Prometheus."""

    def __init__(self) -> None:
        self._h = HdrHistogram(1, _HIGHEST_US, 2)
        self.sum_ms = 0.0

    def record(self, ms: float | np.ndarray) -> None:
        """Record durations (a batch's thousand latencies: each bucket once, with its
        count)."""
        ms = np.atleast_1d(np.asarray(ms, np.float64))
        us = np.clip(np.rint(ms * 1000), 1, _HIGHEST_US).astype(np.int64)
        h = self._h  # a value's bucket: its top bits (HdrHistogram._counts_index_for)
        _, magnitude = np.frexp((us | h.sub_bucket_mask).astype(np.float64))
        shift = magnitude - h.unit_magnitude - h.sub_bucket_half_count_magnitude - 1
        lowest, counts = np.unique(us >> shift << shift, return_counts=True)
        for value, count in zip(lowest.tolist(), counts.tolist(), strict=True):
            h.record_value(value, count)
        self.sum_ms += float(ms.sum())

    @property
    def count(self) -> int:
        return self._h.get_total_count()

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile in ms (0 when empty)."""
        return self._h.get_value_at_percentile(q) / 1000

    def cumulative(self, bounds_ms: np.ndarray) -> np.ndarray:
        """How many durations are <= each of ``bounds_ms`` (to the histogram's
        precision)."""
        counts = np.ctypeslib.as_array(self._h.counts)[:self._h.counts_len].copy()
        return np.cumsum(counts)[np.searchsorted(_upper_us(self._h), bounds_ms * 1000,
                                                 "right") - 1]

    def reset(self) -> None:
        self._h.reset()
        self.sum_ms = 0.0


_UPPER_US: dict[int, np.ndarray] = {}


def _upper_us(h: HdrHistogram) -> np.ndarray:
    """The highest value each count of ``h`` stands for (the same for every histogram
    of one shape)."""
    if h.counts_len not in _UPPER_US:
        _UPPER_US[h.counts_len] = np.array([
            h.get_highest_equivalent_value(h.get_value_from_index(i))
            for i in range(h.counts_len)], np.float64)
    return _UPPER_US[h.counts_len]


@dataclass
class Counts:
    """Counters of the stream's effect on the state, by what they count: records consumed
    (``events``), batches applied, updates applied by op, label changes published, dead
    letters by reason. Queries are not among them: REST queries are not replayed, so a
    count kept across restarts could not be exact."""

    events: int = 0
    batches: int = 0
    label_changes: int = 0
    updates: Counter = field(default_factory=Counter)
    dead_letters: Counter = field(default_factory=Counter)

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.events + other.events, self.batches + other.batches,
                      self.label_changes + other.label_changes,
                      self.updates + other.updates, self.dead_letters + other.dead_letters)

    def to_json(self) -> dict:
        return {"events": self.events, "batches": self.batches,
                "label_changes": self.label_changes, "updates": dict(self.updates),
                "dead_letters": dict(self.dead_letters)}

    @classmethod
    def from_json(cls, raw: dict) -> Counts:
        return cls(raw["events"], raw["batches"], raw["label_changes"],
                   Counter(raw["updates"]), Counter(raw["dead_letters"]))


@dataclass(eq=False)  # hashable by identity: the registry keys its collectors
class Stats:
    """What the service did since it started (this process), and since its state was
    bootstrapped (`state_counts`: ``restored`` from the checkpoint it resumed from, plus
    this process's). Counters of dicts are keyed by a bounded vocabulary (update ops,
    dead-letter reasons, query error kinds)."""

    events: int = 0
    batches: int = 0
    started_early: int = 0  # batches started before the one before them was finished
    label_changes: int = 0
    updates: Counter = field(default_factory=Counter)       # applied, by op
    dead_letters: Counter = field(default_factory=Counter)  # by reason
    queries: Counter = field(default_factory=Counter)  # "answered", or the error's kind
    latency: Histogram = field(default_factory=Histogram)   # produce -> acknowledged
    batch_time: Histogram = field(default_factory=Histogram)
    query_latency: Histogram = field(default_factory=Histogram)
    lag: int | None = None  # records on the updates topic not consumed yet, if known
    checkpointed: float | None = None  # time.time() of the last checkpoint
    checkpoints_failed: int = 0
    checkpoint_pause: Histogram = field(default_factory=Histogram)  # the loop stood still
    started: float = field(default_factory=time.perf_counter)
    first_input: float | None = None  # perf_counter when the first record came
    last_output: float = 0.0          # ... when the last outputs were acknowledged
    busy_s: float = 0.0
    restored: Counts = field(default_factory=Counts)  # from the checkpoint resumed from
    registry: CollectorRegistry = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(self)

    @property
    def applied(self) -> int:
        return sum(self.updates.values())

    def state_counts(self) -> Counts:
        """The counters since the state was bootstrapped (safe from another thread: the
        dicts are copied in one step each)."""
        return self.restored + Counts(self.events, self.batches, self.label_changes,
                                      Counter(dict.copy(self.updates)),
                                      Counter(dict.copy(self.dead_letters)))

    def throughput(self) -> float:
        """Updates applied per second from the first input to the last acknowledged
        output."""
        if self.first_input is None or self.last_output <= self.first_input:
            return 0.0
        return self.applied / (self.last_output - self.first_input)

    def exposition(self) -> bytes:
        """Every metric in Prometheus' text format."""
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        """The metrics as Prometheus families (the registry calls this on each scrape,
        from its own thread: dicts are copied in one step before they are read)."""
        yield _counter("streamgnn_events_consumed", "Updates (and undecodable records) "
                       "consumed from the updates topic by this process.", self.events)
        yield _counter("streamgnn_updates_applied", "Updates applied by this process, by "
                       "op.", dict.copy(self.updates), "op")
        yield _counter("streamgnn_batches", "Batches applied by this process.", self.batches)
        yield _counter("streamgnn_batches_started_early", "Batches started before the one "
                       "before them was finished (MPI workers go on to them at once).",
                       self.started_early)
        yield _counter("streamgnn_label_changes", "Label changes published by this "
                       "process.", self.label_changes)
        yield _counter("streamgnn_dead_letters", "Dead letters published by this process, "
                       "by reason.", dict.copy(self.dead_letters), "reason")
        yield _counter("streamgnn_queries", "Query requests answered (result=answered) or "
                       "refused (result=the error's kind).", dict.copy(self.queries),
                       "result")
        yield _histogram("streamgnn_batch_seconds", "Time to apply a batch and publish "
                         "its outputs.", self.batch_time)
        yield _histogram("streamgnn_update_latency_seconds", "From an update's event time "
                         "to the broker acknowledging its batch's label changes.",
                         self.latency)
        yield _histogram("streamgnn_query_latency_seconds", "Query latency: from the "
                         "request's event time (stream) or arrival (REST) to the answer.",
                         self.query_latency)
        yield _histogram("streamgnn_checkpoint_pause_seconds", "Time the loop stood still "
                         "for a checkpoint (the files are written by a forked child).",
                         self.checkpoint_pause)
        yield _counter("streamgnn_checkpoints_failed", "Checkpoints whose writing failed "
                       "(the previous complete one stays the restart point).",
                       self.checkpoints_failed)
        state = self.state_counts()
        since = " since the state was bootstrapped (kept in checkpoints: restarts resume it)."
        yield _counter("streamgnn_state_events_consumed", "Updates (and undecodable records) "
                       "consumed" + since, state.events)
        yield _counter("streamgnn_state_updates_applied", "Updates applied, by op," + since,
                       dict(state.updates), "op")
        yield _counter("streamgnn_state_batches", "Batches applied" + since, state.batches)
        yield _counter("streamgnn_state_label_changes", "Label changes published" + since,
                       state.label_changes)
        yield _counter("streamgnn_state_dead_letters", "Dead letters published, by reason,"
                       + since, dict(state.dead_letters), "reason")
        if self.lag is not None:
            yield GaugeMetricFamily("streamgnn_consumer_lag", "Records on the updates "
                                    "topic not consumed yet.", value=self.lag)
        if self.checkpointed is not None:
            yield GaugeMetricFamily("streamgnn_checkpoint_age_seconds", "Seconds since the "
                                    "last checkpoint.", value=time.time() - self.checkpointed)


def _counter(name: str, doc: str, value: int | dict, label: str | None = None
             ) -> CounterMetricFamily:
    if label is None:
        return CounterMetricFamily(name, doc, value=value)
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(value.items()):
        family.add_metric([key], n)
    return family


def _histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    bounds = np.array(BUCKETS_S)
    below = h.cumulative(bounds * 1000)
    return HistogramMetricFamily(
        name, doc, sum_value=h.sum_ms / 1000,
        buckets=[*((f"{b:g}", int(n)) for b, n in zip(bounds, below)), ("+Inf", h.count)])
