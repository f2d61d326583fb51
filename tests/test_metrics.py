"""`Stats`: bounded memory, percentiles as numpy computes them (to the histogram's
precision), and Prometheus text that parses back to the same figures."""

from __future__ import annotations

import tracemalloc

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from streamgnn.router import Stats
from streamgnn.router.metrics import Histogram


def record_batches(stats: Stats, n: int, rng: np.random.Generator) -> None:
    """What the service records per batch: 100 updates, their latencies, a dead letter."""
    for _ in range(n):
        stats.events += 100
        stats.batches += 1
        stats.updates.update({"add_edge": 60, "update_features": 39})
        stats.dead_letters["unknown_vertex"] += 1
        stats.label_changes += 7
        stats.batch_time.record(rng.lognormal(1, 1))
        stats.latency.record(rng.lognormal(3, 1, 100))


def test_stats_memory_does_not_grow_with_the_number_of_batches():
    stats, rng = Stats(), np.random.default_rng(0)
    record_batches(stats, 200, rng)  # every count and histogram bucket exists by now
    tracemalloc.start()
    try:
        record_batches(stats, 200, rng)
        after_few, _ = tracemalloc.get_traced_memory()
        record_batches(stats, 2000, rng)
        after_many, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stats.batches == 2400 and stats.latency.count == 240_000
    assert after_many - after_few < 4096  # lists of the 200K latencies alone: >= 1.6 MB


@given(st.lists(st.floats(0, 4e6), min_size=1, max_size=300))
def test_recording_many_durations_at_once_is_recording_each(ms):
    whole, each = Histogram(), Histogram()
    whole.record(np.array(ms))
    for m in ms:
        each.record(m)
    a, b = whole._h, each._h
    assert list(a.counts) == list(b.counts) and a.total_count == b.total_count
    assert (a.get_min_value(), a.get_max_value()) == (b.get_min_value(), b.get_max_value())


def test_percentiles_match_numpy_within_the_histograms_precision():
    stats, rng = Stats(), np.random.default_rng(1)
    ms = rng.lognormal(2, 1.5, 50_000)
    stats.latency.record(ms)
    for q in (50, 90, 99, 99.9):
        assert abs(stats.latency.percentile(q) - np.percentile(ms, q)) <= (
            0.01 * np.percentile(ms, q) + 0.002)
    assert abs(stats.latency.sum_ms - ms.sum()) < 1e-6 * ms.sum()


def test_the_prometheus_text_carries_the_same_figures():
    stats, rng = Stats(), np.random.default_rng(2)
    record_batches(stats, 10, rng)
    stats.queries.update({"answered": 3, "wrong_dimension": 1})
    stats.lag = 42
    families = {f.name: f for f in text_string_to_metric_families(
        stats.exposition().decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert samples[("streamgnn_events_consumed_total", ())] == 1000
    assert samples[("streamgnn_updates_applied_total", (("op", "add_edge"),))] == 600
    assert samples[("streamgnn_dead_letters_total", (("reason", "unknown_vertex"),))] == 10
    assert samples[("streamgnn_queries_total", (("result", "wrong_dimension"),))] == 1
    assert samples[("streamgnn_consumer_lag", ())] == 42
    assert samples[("streamgnn_update_latency_seconds_count", ())] == 1000
    buckets = [v for (name, labels), v in samples.items()
               if name == "streamgnn_update_latency_seconds_bucket"]
    assert buckets == sorted(buckets) and buckets[-1] == 1000
    below_50ms = samples[("streamgnn_update_latency_seconds_bucket", (("le", "0.05"),))]
    assert below_50ms > 0
    assert "streamgnn_checkpoint_age_seconds" not in families  # none written yet
