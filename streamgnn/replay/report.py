"""A replay's report: `build_report` (plain data, the verdict on the offered rate), the
report directory (`write_report`: report.json plus PNG plots; `load_report`) and
`render_plots` / `summary_rows`, which `streamgnn replay report DIR` reruns from
report.json alone (the latency histograms travel in it, HdrHistogram-encoded).

Plots (matplotlib, Agg): ``throughput.png`` (sent and completed ops/s against the offered
rate), ``latency_cdf.png`` (one CDF per measure), ``label_changes.png`` (per second) and
``backlog.png`` (how late the sender was, and what was in flight: not yet acknowledged,
not yet visible, reads and queries waiting). Owns the report; must not import torch,
kafka or the graph store.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram

from streamgnn.extras import needs
from streamgnn.plotstyle import series_style
from streamgnn.replay.openloop import Schedule, SendStats
from streamgnn.replay.recorder import Recorder

with needs("the replay report"):  # here, so that `replay run` refuses to start
    import matplotlib

REPORT = "report.json"
PLOTS = ("throughput.png", "latency_cdf.png", "label_changes.png", "backlog.png")


def build_report(settings: dict[str, Any], trace_header: dict[str, Any], schedule: Schedule,
                 stats: SendStats, recorder: Recorder, at_send_end: dict[str, int],
                 left: dict[str, int], ended: float) -> dict[str, Any]:
    """The report of a run. The offered rate held unless the sender fell more than
    ``lag_limit_s`` behind its schedule, or when sending stopped more than
    ``lag_limit_s`` worth of ops at the offered rate were still in flight."""
    data = recorder.summary()
    sending_s = max(stats.ended - stats.started, 1e-9)
    completed = sum(data["series"].get("completed", []))
    limit = settings["lag_limit_s"]
    reasons = []
    if stats.max_late_s > limit:
        reasons.append(f"the sender fell up to {stats.max_late_s:.2f} s behind its schedule "
                       f"(limit {limit:g} s): this client could not offer "
                       f"{schedule.rate:,.0f} ops/s")
    in_flight = sum(at_send_end.values())
    if in_flight > limit * schedule.rate:
        reasons.append(f"{in_flight:,} ops were still in flight when sending stopped "
                       f"(more than {limit:g} s of the offered rate): the service did not "
                       "keep up")
    if stats.interrupted:
        reasons.append("interrupted before the end of the trace")
    return {
        "settings": settings, "trace": trace_header,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(stats.started)),
        "wall_s": round(ended - stats.started, 3),
        "rate": {"offered_ops_per_s": schedule.rate, "pacing": schedule.pacing,
                 "sent_ops_per_s": round(max(stats.sent - 1, 0) / sending_s, 1),
                 "completed_ops_per_s": round(completed / max(ended - stats.started, 1e-9), 1),
                 "max_send_lateness_s": round(stats.max_late_s, 4),
                 "held": not reasons, "not_held_because": reasons},
        "counts": {"sent": stats.sent, "sent_by_op": data["sent"],
                   "completed": int(completed), **data["counts"],
                   "writes_visible": data["latency_ms"].get("write-to-visible", {}).get(
                       "count", 0)},
        "errors": data["errors"],
        "in_flight_when_sending_stopped": at_send_end,
        "left_after_drain": left,
        "latency_ms": data["latency_ms"],
        "histograms": data["histograms"],
        "series": data["series"],
    }


def write_report(folder: Path, report: dict[str, Any]) -> list[Path]:
    """Write report.json and the plots into ``folder``; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / REPORT).write_text(json.dumps(report, indent=1))
    return [folder / REPORT, *render_plots(folder, report)]


def load_report(folder: Path) -> dict[str, Any]:
    path = folder / REPORT if folder.is_dir() else folder
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no report.json (written by `streamgnn replay run`)")
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    missing = {"rate", "counts", "latency_ms", "histograms", "series"} - set(report)
    if missing:
        raise ValueError(f"{path}: not a replay report (no {', '.join(sorted(missing))})")
    return report


def summary_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline figures as (measure, value) rows."""
    r, c = report["rate"], report["counts"]
    rows = [("offered / sent / completed ops/s",
             f"{r['offered_ops_per_s']:,.0f} / {r['sent_ops_per_s']:,.0f} / "
             f"{r['completed_ops_per_s']:,.0f}"),
            ("rate held", "yes" if r["held"] else "NO: " + "; ".join(r["not_held_because"])),
            ("ops sent", ", ".join(f"{k} {v:,}" for k, v in sorted(c["sent_by_op"].items()))
             or "0"),
            ("label changes seen", f"{c.get('label_changes', 0):,}"),
            ("writes visible / in batches without label change / unresolved",
             f"{c['writes_visible']:,} / {c.get('writes_without_label_change', 0):,} / "
             f"{c.get('writes_unresolved', 0):,}"),
            ("errors", ", ".join(f"{k} {v:,}" for k, v in sorted(report["errors"].items()))
             or "0")]
    return rows


def render_plots(folder: Path, report: dict[str, Any]) -> list[Path]:
    """Write the `PLOTS` of ``report`` into ``folder``; returns their paths."""
    return [_save(fig, folder / name) for name, fig in figures(report)]


def figures(report: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Each of the `PLOTS` of ``report`` as (file name, matplotlib figure)."""
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = report["series"]
    dt = series["interval_s"]
    n = max((len(v) for k, v in series.items() if k != "interval_s"), default=0)
    t = [i * dt for i in range(n)]

    def line(ax, name: str, label: str, scale: float = 1.0) -> None:
        if name in series:
            ax.plot(t, [v * scale for v in series[name]], label=label, drawstyle="steps-post",
                    **series_style(len(ax.lines)))

    fig, ax = plt.subplots(figsize=(8, 4))
    line(ax, "sent", "sent", 1 / dt)
    line(ax, "completed", "completed", 1 / dt)
    ax.axhline(report["rate"]["offered_ops_per_s"], color="gray", ls="--", label="offered")
    _finish(ax, "ops/s", "throughput")
    yield "throughput.png", fig

    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (measure, encoded) in enumerate(sorted(report["histograms"].items())):
        xs, ys = _cdf(HdrHistogram.decode(encoded.encode()))
        ax.plot(xs, ys, label=measure, drawstyle="steps-post", **series_style(i))
    ax.set_xscale("log")
    ax.set_xlabel("latency from intended send time (ms)")
    ax.set_ylabel("fraction of ops")
    ax.set_title("latency CDF")
    ax.grid(alpha=0.3)
    if report["histograms"]:
        ax.legend(fontsize=7)
    yield "latency_cdf.png", fig

    fig, ax = plt.subplots(figsize=(8, 4))
    line(ax, "label_changes", "label changes/s", 1 / dt)
    _finish(ax, "label changes/s", "label changes published")
    yield "label_changes.png", fig

    fig, (late, flight) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    line(late, "late_s", "sender lateness (peak)", 1e3)
    _finish(late, "ms", "what the sender could not send on time (ops due and unsent: "
            "lateness x rate)", xlabel=False)
    for name in ("not_acked", "not_visible", "reads_in_flight", "queries_waiting"):
        line(flight, name, name.replace("_", " "))
    _finish(flight, "ops (peak)", "in flight (not_visible ~ consumer lag, in updates)")
    yield "backlog.png", fig


def _cdf(h: HdrHistogram) -> tuple[list[float], list[float]]:
    total = h.get_total_count()
    xs, ys, seen = [], [], 0
    for item in h.get_recorded_iterator():
        seen += item.count_added_in_this_iter_step
        xs.append(item.value_iterated_to / 1e3)
        ys.append(seen / total)
    return xs, ys


def _finish(ax: Any, ylabel: str, title: str, xlabel: bool = True) -> None:
    if xlabel:
        ax.set_xlabel("seconds since the start")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
