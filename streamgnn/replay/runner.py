"""`run_replay`: `streamgnn replay run` end to end. Opens the trace, wires the open-loop
sender to the service (writes and queries to Kafka, reads to REST), follows
``label-changes`` and ``query-results``, drains what is in flight, and returns the
report (`report.build_report`): whether the offered rate held, and why not.

Measures (HdrHistogram, from each op's intended send time): per write op (addlink, ...)
until the broker acknowledged it; ``write-to-visible`` until the label change of its
batch was seen (`matching.Visibility`); per read op until the REST answer; ``query``
until its `QueryResult`; ``send-lateness`` of the sender itself.

Owns the wiring; must not import torch or the graph store (kafka only through
`streamgnn.stream`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from streamgnn.replay.matching import Answers, Visibility
from streamgnn.replay.openloop import Schedule, SendStats, drain, send_open_loop
from streamgnn.replay.recorder import Recorder
from streamgnn.replay.report import build_report
from streamgnn.replay.rest import RestReader
from streamgnn.replay.trace import Trace, TraceOp
from streamgnn.stream.kafka_config import KafkaConfig
from streamgnn.stream.schemas import Topics
from streamgnn.stream.transport import Record


@dataclass
class RunSettings:
    """What `streamgnn replay run` was asked to do (recorded in report.json)."""

    trace: str
    rate: float | None = None
    pacing: str = "trace"
    duration: float | None = None
    kafka: KafkaConfig = field(default_factory=lambda: KafkaConfig("127.0.0.1:19092"))
    topics: Topics = field(default_factory=Topics)
    http: str = "http://127.0.0.1:8080"
    http_token: str | None = None
    read_workers: int = 8
    drain_s: float = 30.0
    interval_s: float = 1.0
    lag_limit_s: float = 1.0

    def public(self) -> dict[str, Any]:
        """The settings for the report (the token only as whether one was given, the
        Kafka client settings, which may hold secrets, only as their file)."""
        out = asdict(self)
        out["kafka"] = {"bootstrap_servers": self.kafka.bootstrap_servers,
                        "config_file": None if self.kafka.file is None else str(self.kafka.file)}
        out["topics"] = self.topics.model_dump()
        out["http_token"] = self.http_token is not None
        return out


class ServiceSink:
    """The `openloop.Sink` of a real service: writes and queries through a Kafka
    producer, reads through `RestReader`; outcomes to the recorder and matchers."""

    def __init__(self, settings: RunSettings, recorder: Recorder) -> None:
        from streamgnn.stream.loadgen import LoadProducer

        self.recorder = recorder
        self.visibility = Visibility(recorder)
        self.answers = Answers(recorder)
        self.reader = RestReader(settings.http, recorder, settings.http_token,
                                 settings.read_workers)
        self.producer = LoadProducer(settings.kafka, settings.topics.updates,
                                     settings.topics.queries)
        self.topics = settings.topics
        self._unacked = 0
        self._lock = threading.Lock()  # _unacked: the sender adds, the producer subtracts

    def write(self, op: TraceOp, intended: float) -> None:
        update = {**op.body, "event_time": intended}
        self._count_unacked(1)

        def acked(partition: int, offset: int) -> None:
            self._count_unacked(-1)
            self.recorder.latency(op.op, time.time() - intended)
            self.visibility.produced(partition, offset, intended)

        self.producer.update(orjson.dumps(update), int(update.get("src", update.get("id"))),
                             acked, self._failed("write"))

    def read(self, op: TraceOp, intended: float) -> None:
        self.reader.read(op, intended)

    def query(self, op: TraceOp, intended: float) -> None:
        request = {**op.body, "event_id": uuid.uuid4().hex, "event_time": intended}
        if self.answers.asked(request["event_id"], intended):
            self.producer.query(orjson.dumps(request), self._failed("query"))

    def _failed(self, kind: str) -> Callable[[BaseException], None]:
        def failed(e: BaseException) -> None:
            if kind == "write":
                self._count_unacked(-1)
            self.recorder.error(f"{kind}:{type(e).__name__}")
        return failed

    def _count_unacked(self, n: int) -> None:
        with self._lock:
            self._unacked += n

    def on_record(self, record: Record) -> None:
        """A record of label-changes or query-results (on the follower's thread)."""
        now = time.time()
        m = orjson.loads(record.value)
        if record.topic == self.topics.labels:
            n = len(m["changes"])
            self.recorder.add("label_changes", now, n)
            self.recorder.count("label_changes", n)
            self.visibility.published(
                [(s["partition"], s["first"], s["last"]) for s in m["sources"]], now)
        else:
            self.answers.answered(m["request_id"], m.get("error"), now)

    def outstanding(self) -> dict[str, int]:
        return {"not_acked": self._unacked, "not_visible": self.visibility.outstanding(),
                "reads_in_flight": self.reader.outstanding(),
                "queries_waiting": self.answers.outstanding()}

    def close(self) -> None:
        self.reader.close()
        self.producer.close()
        self.answers.give_up()
        self.recorder.count("writes_unresolved", self.visibility.outstanding())


def schedule_for(trace: Trace, settings: RunSettings) -> Schedule:
    """The sending schedule: ``settings.rate`` (default the trace's own) ops/s."""
    if settings.pacing not in ("trace", "constant"):
        raise ValueError(f"pacing must be trace or constant, got {settings.pacing!r}")
    if settings.rate is not None and settings.rate <= 0:
        raise ValueError(f"the rate must be positive, got {settings.rate}")
    trace_rate = trace.header.get("rate")
    rate = settings.rate or trace_rate
    if not rate or rate <= 0:
        raise ValueError(f"{trace.path}: its times give no rate (all at one instant): "
                         "pass --rate")
    if settings.pacing == "trace" and not trace_rate:
        return Schedule(rate, rate, "constant", settings.duration)
    return Schedule(rate, trace_rate or rate, settings.pacing, settings.duration)


def run_replay(trace: Trace, settings: RunSettings,
               on_tick: Callable[[SendStats, dict[str, int]], None] = lambda s, o: None,
               stop: threading.Event | None = None) -> dict[str, Any]:
    """Replay ``trace`` against the service; returns the report (see `build_report`)."""
    from streamgnn.stream.loadgen import OutputFollower

    schedule = schedule_for(trace, settings)
    recorder = Recorder(time.time(), settings.interval_s)
    sink = ServiceSink(settings, recorder)
    follower = OutputFollower(settings.kafka, [settings.topics.labels,
                                                   settings.topics.results], sink.on_record)
    ticked = _ticker(sink, follower, recorder, on_tick)
    recorder.start = time.time() + 0.2  # the first op is due shortly after everything is up
    try:
        stats = send_open_loop(trace.ops(), schedule, sink, recorder, ticked, stop)
        at_send_end = left = sink.outstanding()
        if not stats.interrupted:
            left = drain(sink, recorder, stats, settings.drain_s, ticked)
    finally:
        follower.close()
        sink.close()
    return build_report(settings.public(), trace.header, schedule, stats, recorder,
                        at_send_end, left, time.time())


def _ticker(sink: ServiceSink, follower: Any, recorder: Recorder,
            on_tick: Callable[[SendStats, dict[str, int]], None]
            ) -> Callable[[SendStats], None]:
    reported: list[BaseException] = []

    def ticked(stats: SendStats) -> None:
        if follower.error is not None and not reported:
            reported.append(follower.error)
            recorder.error(f"follow:{type(follower.error).__name__}")
        on_tick(stats, sink.outstanding())
    return ticked
