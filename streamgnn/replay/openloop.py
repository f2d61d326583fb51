"""The open-loop sender: each op goes out at its intended time, whatever happened to the
ops before it, and every latency is measured from that intended time, so a slow system
shows as growing latencies rather than a quietly slower sender (no coordinated omission).

`send_open_loop` walks a trace once, sleeping until each op is due (or sending it at
once when late) and handing it to a `Sink`; the sink must not block (writes and queries
go to a producer's buffer, reads to a thread pool). How late the sender itself was is
recorded too (``send-lateness``, and per interval the peak ``late_s``: ops due and
not yet sent are that times the rate). Owns the schedule; must not import torch, kafka
or the graph store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from streamgnn.replay.recorder import Recorder
from streamgnn.replay.trace import READ_OPS, WRITE_OPS, TraceOp

TICK_S = 0.25


class Sink(Protocol):
    """Where ops go. Each call returns at once; latencies are recorded by the sink
    against ``intended`` (a `time.time()`)."""

    def write(self, op: TraceOp, intended: float) -> None: ...
    def read(self, op: TraceOp, intended: float) -> None: ...
    def query(self, op: TraceOp, intended: float) -> None: ...
    def outstanding(self) -> dict[str, int]:
        """Ops sent and not yet completed, by what they wait for."""
        ...


@dataclass(frozen=True)
class Schedule:
    """When op ``i`` (trace time ``t``) is due, in seconds from the start: ``i / rate``
    (``constant``), or ``t`` scaled so the trace's mean rate ``trace_rate`` becomes
    ``rate`` (``trace``: keeps its Poisson or recorded gaps). Ops due after
    ``duration`` are not sent."""

    rate: float
    trace_rate: float
    pacing: str = "trace"  # or "constant"
    duration: float | None = None

    def offset(self, i: int, t: float) -> float:
        if self.pacing == "constant":
            return i / self.rate
        return t * self.trace_rate / self.rate


@dataclass
class SendStats:
    """What the sender did: ops ``sent``, wall times of the first op's intended send and
    of the last op's actual send, and how late it fell at worst (s)."""

    sent: int = 0
    started: float = 0.0
    ended: float = 0.0
    max_late_s: float = 0.0
    interrupted: bool = False


def send_open_loop(ops: Iterable[TraceOp], schedule: Schedule, sink: Sink, recorder: Recorder,
                   on_tick: Callable[[SendStats], None] = lambda s: None,
                   stop: threading.Event | None = None) -> SendStats:
    """Send ``ops`` to ``sink`` on ``schedule`` starting at ``recorder.start``; calls
    ``on_tick`` about every `TICK_S` (progress, backlog samples). ``stop`` or Ctrl-C
    ends it early (``interrupted``)."""
    stats = SendStats(started=recorder.start, ended=recorder.start)
    try:
        _send(ops, schedule, sink, recorder, on_tick, stop, stats)
    except KeyboardInterrupt:
        stats.interrupted = True
    return stats


def _send(ops: Iterable[TraceOp], schedule: Schedule, sink: Sink, recorder: Recorder,
          on_tick: Callable[[SendStats], None], stop: threading.Event | None,
          stats: SendStats) -> None:
    next_tick = recorder.start
    for i, op in enumerate(ops):
        offset = schedule.offset(i, op.t)
        if schedule.duration is not None and offset > schedule.duration:
            break
        intended = recorder.start + offset
        while (now := time.time()) < intended:
            if now >= next_tick:
                next_tick = _tick(now, sink, recorder, stats, on_tick)
            time.sleep(min(intended, next_tick) - now)
            if stop is not None and stop.is_set():
                break
        if stop is not None and stop.is_set():
            stats.interrupted = True
            break
        late = max(now - intended, 0.0)
        recorder.latency("send-lateness", late, completes=False)
        recorder.peak("late_s", now, late)
        stats.max_late_s = max(stats.max_late_s, late)
        _dispatch(sink, op, intended, recorder)
        recorder.op_sent(op.op, now)
        stats.sent += 1
        stats.ended = now
        if now >= next_tick:
            next_tick = _tick(now, sink, recorder, stats, on_tick)


def drain(sink: Sink, recorder: Recorder, stats: SendStats, timeout_s: float,
          on_tick: Callable[[SendStats], None] = lambda s: None,
          settle_s: float = 3.0) -> dict[str, int]:
    """Wait for the ops in flight to complete, sampling as the sender does, until none
    is left, or none has completed for ``settle_s`` (what is left will not: e.g. writes
    whose batch changed no label), or ``timeout_s`` passed; returns what is left."""
    deadline = time.time() + timeout_s
    left, moved = sink.outstanding(), time.time()
    while sum(left.values()) and (now := time.time()) < min(deadline, moved + settle_s):
        _tick(now, sink, recorder, stats, on_tick)
        time.sleep(TICK_S)
        if (latest := sink.outstanding()) != left:
            left, moved = latest, time.time()
    return left


def _dispatch(sink: Sink, op: TraceOp, intended: float, recorder: Recorder) -> None:
    kind = "write" if op.op in WRITE_OPS else "read" if op.op in READ_OPS else "query"
    try:
        getattr(sink, kind)(op, intended)
    except Exception as e:  # a failed send is an error of the run, never its end
        recorder.error(f"{kind}:{type(e).__name__}")


def _tick(now: float, sink: Sink, recorder: Recorder, stats: SendStats,
          on_tick: Callable[[SendStats], None]) -> float:
    for what, n in sink.outstanding().items():
        recorder.peak(what, now, float(n))
    on_tick(stats)
    return now + TICK_S
