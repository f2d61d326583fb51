"""`Service`: the streaming loop. Consumes the updates topic through a `Transport`,
decodes and validates (a message holds one update, an array of them, or columns, kept in
columns up to the engine: `Pending`), holds updates that wait for a vertex (`Arrivals`),
cuts batches of ``batch_size`` updates (or fewer after the maximum wait), applies each to
the engine (which places it on its partitions), publishes every changed label (one
message per batch and label-topic partition) and every unusable update (dead letter, with
reason and source offset) through `Outputs`, and checkpoints state, pending updates and
consumed offsets every N batches or seconds. A batch is started (`Engine.submit`: the
graph changes, the shards start) and finished after the loop's next poll has read and
admitted what arrived meanwhile (`Engine.collect`, then the outputs): with MPI workers
the router's reading overlaps the workers' batch, and when a full batch is ready by then
it is started before the one in flight is finished, so the workers go on to it at once
(two batches in flight at most; one alone while records are suspect or reads or query
requests wait). Between two batches it answers query requests from a second transport
(`_answer_queries`): each from the state after the last batch, published on
``query-results`` naming that batch; a request that cannot be answered gets an error
result naming why, and never stops the loop. Reads other threads queue (`Reads`: the REST
API) are answered there too; after each batch the loop refreshes the `ReadView` vertex
reads are served from without waiting for it.

Failure semantics (README, "Reliability"):
- Bad input never stops the loop: any exception one message causes while it is decoded
  and admitted dead-letters that message (kind ``internal``, the exception named).
- The engine failing on a batch (an exception, or an embedding driven to NaN or inf)
  leaves its state suspect: `EngineFailure` ends `run`, and `serve` reopens the service
  from its last checkpoint. A process that died mid-step (any cause, kill -9 included) is
  noticed the same way on restart, from the `Journal`: the records in flight are then
  handled one update at a time, and one alone in flight at two deaths is quarantined
  (dead letter ``quarantined``), never retried forever.
- ``run(stop=...)`` (SIGINT and SIGTERM in `streamgnn serve`) ends the loop at the next
  batch boundary: the batch in flight is finished, everything admitted is applied, and a
  checkpoint whose offsets match the applied state is written.
- Queries change nothing, so they are answered at least once: their offsets are
  checkpointed with the rest, and requests answered after the last checkpoint are
  answered again after a restart (same ``request_id``: consumers drop repeats).
- Exactly once for state, the same outputs on a replay: state, pending updates and
  offsets are checkpointed together, and every batch is journaled before its outputs go
  out, so a restart replays the batches since the checkpoint with the same updates, the
  same label changes and the same event ids, bit for bit.
- A state is not rebuilt behind the user's back: where state was kept but no checkpoint
  verifies, `open` refuses unless asked to rebuild; a new state (fresh or rebuilt) gets a
  new epoch, which its label changes' event ids carry (``lc-{epoch}-{batch}-{part}``), so
  its outputs never reuse an earlier state's ids.

Must not import kafka (the transport is injected) or mpi4py.
"""

from __future__ import annotations

import base64
import gc
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from streamgnn.errors import InvalidInputError, InvalidQueryError, StreamGNNError
from streamgnn.models.zoo import ModelFile, ModelSpec
from streamgnn.npz import write_arrays
from streamgnn.queries import QueryRequest
from streamgnn.router.arrivals import Arrivals, Waiting, referenced
from streamgnn.router.checkpoint import Checkpoints, NoVerifiedStateError, Saved, Writing
from streamgnn.router.journal import Journal, Key, Suspects, spans, step_keys
from streamgnn.router.metrics import Counts, Stats
from streamgnn.router.outputs import Outputs, escaped
from streamgnn.router.pending import AdmittedColumns, Cut, Entry, Item, Origin, Pending, size
from streamgnn.router.reads import Reads
from streamgnn.settings import ServiceConfig
from streamgnn.stream.schemas import (
    DecodedColumns,
    DecodeError,
    QueryResult,
    decode_query,
    decode_updates,
    encode,
    is_array,
)
from streamgnn.stream.transport import Record, Transport
from streamgnn.updates import OP_NAMES, UPDATE_ADAPTER, Update, ValueLimits
from streamgnn.workers import ApplyResult, Engine
from streamgnn.workers.local import Workers


class EngineFailure(StreamGNNError, RuntimeError):
    """The engine failed while applying a batch: its state can no longer be trusted, so
    the service stops; reopening it from its checkpoint recovers (`serve`)."""


@dataclass
class _Flight:
    """A batch the engine works on: its sequence number, updates, their event times, the
    event time of its outputs, and the seconds the service spent starting it."""

    seq: int
    cut: Cut
    times: np.ndarray
    at: float
    seconds: float


@dataclass
class BatchReport:
    seq: int
    size: int
    result: ApplyResult
    seconds: float


class Service:
    def __init__(self, engine: Engine, model: ModelFile, transport: Transport,
                 config: ServiceConfig, checkpoints: Checkpoints | None = None,
                 queries: Transport | None = None, reads: Reads | None = None) -> None:
        """``transport`` consumes the updates topic; ``queries``, if given, the
        query-requests topic; ``reads``, if given, reads asked by other threads (REST)."""
        self.engine = engine
        self.model = model
        self.transport = transport
        self.queries = queries
        self.reads = reads
        self.config = config
        self.checkpoints = checkpoints
        engine.limits = ValueLimits(config.max_abs_feature, config.max_abs_weight)
        self.arrivals: Arrivals[Origin] = Arrivals(engine.contains, config.arrival_wait_s)
        self.pending = Pending()  # admitted, not applied yet
        self.batch_seq = 0
        self.stats = Stats()
        self.outputs = Outputs(transport, config, self.stats)
        self.epoch = new_epoch()  # names this state in its outputs' event ids
        self.journal = Journal(checkpoints.directory) if checkpoints else None
        self.suspects = (Suspects(checkpoints.directory, config.quarantine_after)
                         if checkpoints else None)
        self.script: deque[dict] = deque()  # journaled steps to replay before new ones
        self.held: dict[Key, Item] = {}     # decoded updates the replay has not used yet
        self._stalled_since: float | None = None  # when the replay last found no input
        self._last_batch_s = 0.0
        self._last_checkpoint = (0, time.monotonic())
        self._writing: Writing | None = None  # a checkpoint being written in the background
        self._writing_positions: dict[int, int] = {}  # ... and its offsets
        self._flights: deque[_Flight] = deque()  # batches the engine works on (`_start`)
        self._requests: list[Record] = []  # query requests read, not answered yet
        self._on_batch: Callable[[BatchReport], None] | None = None  # `run`'s

    # ---------------------------------------------------------------- start / resume
    @classmethod
    def open(cls, model_file: Callable[[], ModelFile], bootstrap: Callable[[ModelFile], Engine],
             transport: Transport, config: ServiceConfig,
             checkpoints: Checkpoints | None = None, device: str = "cpu",
             workers: Workers | None = None, queries: Transport | None = None,
             reads: Reads | None = None, rebuild: bool = False) -> Service:
        """Resume from the last checkpoint in ``checkpoints`` that verifies (seeking the
        transport to its offsets, and replaying the journal written since); else
        bootstrap a new engine, under a new epoch, and checkpoint it (the base any
        recovery starts from). Where state was kept but no checkpoint verifies, raises
        `NoVerifiedStateError` unless ``rebuild``. ``workers``: where a restored engine's
        shards run (default: this process); ``queries`` and ``reads``: as for the
        constructor."""
        saved = checkpoints.load(names=("model",)) if checkpoints else None
        if saved is None and checkpoints is not None and not rebuild and (
                checkpoints.corrupt() or Journal(checkpoints.directory).exists()):
            raise NoVerifiedStateError(checkpoints.directory, len(checkpoints.corrupt()))
        if saved is None:
            model = model_file()
            service = cls(bootstrap(model), model, transport, config, checkpoints, queries,
                          reads)
            if service.suspects is not None:
                service.suspects.clear()  # a fresh start: nothing died on this stream yet
            service.checkpoint()
            return service
        state = saved.meta
        model = saved_model(saved)
        engine = Engine.read(model.model(), saved.folder, device, workers)
        service = cls(engine, model, transport, config, checkpoints, queries, reads)
        service.arrivals.waiting = {}
        for item in state["waiting"]:
            (update, origin), (vertex, deadline) = _item(item), item["wait"]
            service.arrivals.waiting.setdefault(vertex, []).append(
                Waiting(update, origin, vertex, deadline))
        service.pending = Pending([_item(item) for item in state["pending"]])
        for update, _ in service.pending.entries:
            service.arrivals.track(update)
        service.batch_seq = state["batch_seq"]
        service.epoch = state["epoch"]
        service.stats.restored = Counts.from_json(state["counts"])
        moved = transport.seek({int(p): o for p, o in state["positions"].items()})
        if queries is not None:
            queries.seek({int(p): o for p, o in state.get("query_positions", {}).items()})
        service._replay_journal(saved.generation)
        if moved:  # the topic no longer holds what the journal names (--offset-reset)
            service._drop_journal(moved)
        return service

    def _drop_journal(self, partitions: set[int]) -> None:
        """The updates topic's ``partitions`` were moved off their saved offsets (the
        topic was recreated or truncated, and the user said where to resume): the
        batches journaled since the checkpoint name records that are gone, so they are
        not replayed, and a checkpoint at once makes the new offsets the base."""
        if self.script:
            warnings.warn(f"{len(self.script)} journaled steps since the checkpoint name "
                          f"records of partitions {sorted(partitions)} that the topic no "
                          "longer holds: not replayed", stacklevel=3)
            self.script.clear()
            self._release_held()
        self.checkpoint()

    def _replay_journal(self, generation: int) -> None:
        """Note where the last process died, and line up the batches it journaled since
        checkpoint ``generation`` (updates not yet applied wait in ``held`` for them)."""
        entries = self.journal.entries(generation)
        death = Journal.death(entries)
        if death is not None:  # counted before this process's entries begin
            self.suspects.died(death)
        self.journal.resume(generation)
        self.script = deque(Journal.steps(entries, self.batch_seq))
        if not self.script:
            return
        waiting = [(w.update, w.source) for ws in self.arrivals.waiting.values() for w in ws]
        self.held = {o.key: (u, o) for u, o in self.pending.items() + waiting}
        self.pending = Pending()
        self.arrivals = Arrivals(self.engine.contains, self.config.arrival_wait_s)

    def checkpoint(self, wait: bool = True) -> None:
        """Checkpoint the state after the last batch: engine, model, pending updates and
        offsets, and start the journal of what follows. The files are written by a forked
        child where the engine's state is all in this process (`Checkpoints.write`), so
        the loop goes on at once; with ``wait`` (start-up, shutdown) this returns once the
        generation is complete. Without ``wait``, a checkpoint still being written makes
        this one wait for the next chance."""
        if self.checkpoints is None:
            return
        if self._writing is not None:
            if not wait and self._writing.done() is None:
                return
            self._written()
        paused = time.perf_counter()
        self._finish()  # the state after the last batch started
        if self._requests:  # read: answered before their offsets are checkpointed
            self._answer_queries()
        self.outputs.settle()  # before the offsets: a restart may repeat them, never lose them
        unapplied = self.pending.items() + sorted(self.held.values(), key=lambda item: item[1].key)
        generation = self.checkpoints.begin()
        positions = self.transport.positions()
        model = {k: t.cpu().numpy() for k, t in self.model.state_dict.items()}
        meta = {
            "spec": asdict(self.model.spec),
            "waiting": [_item_json(w.update, w.source, (w.vertex, w.deadline))
                        for ws in self.arrivals.waiting.values() for w in ws],
            "pending": [_item_json(u, o) for u, o in unapplied],
            "batch_seq": self.batch_seq, "epoch": self.epoch,
            "counts": self.stats.state_counts().to_json(), "positions": positions,
            "query_positions": self.queries.positions() if self.queries else {}}
        self._writing = self.checkpoints.write(
            generation, lambda folder: [write_arrays(folder, "model", model),
                                        *self.engine.write(folder)],
            meta, background=not wait and self.engine.in_host_memory)
        self._writing_positions = positions
        if wait:
            self._written()
        # what follows goes to the new generation's journal; a restart from an older one
        # (this one incomplete) replays the journals from that one on
        self.journal.restart(generation, list(self.script),
                             min(self.checkpoints.kept(), default=generation))
        self._last_checkpoint = (self.batch_seq, time.monotonic())
        if not wait:  # (start-up and shutdown write in place: not a pause of the loop)
            self.stats.checkpoint_pause.record((time.perf_counter() - paused) * 1e3)

    def _written(self) -> None:
        """Wait for the checkpoint being written; once complete, the records before its
        offsets need no watching any more."""
        writing, self._writing = self._writing, None
        if writing.wait():
            self.suspects.forget_before(self._writing_positions)
            self.stats.checkpointed = time.time()
        else:
            self.stats.checkpoints_failed += 1

    def close(self) -> None:
        if self._writing is not None:  # a checkpoint's child is writing: let it finish
            self._written()
        self.transport.close()
        if self.queries is not None:
            self.queries.close()
        if self.journal is not None:
            self.journal.close()

    # ---------------------------------------------------------------- the loop
    def run(self, stop: Callable[[], bool] = lambda: False, idle_exit_s: float | None = None,
            on_batch: Callable[[BatchReport], None] | None = None) -> Stats:
        """Serve until ``stop()`` is true (checked at batch boundaries: safe to flip from a
        signal handler), or until nothing arrived for ``idle_exit_s`` seconds and nothing
        is pending; then apply what was admitted, checkpoint and return the stats. While it
        runs, it answers the ``reads`` queued by other threads between two batches. Raises
        `EngineFailure` if the engine fails (`run_recovering` reopens the service)."""
        gc.collect()
        gc.freeze()  # what exists now (graph, engine, model) lives on: keep GC passes off it
        if self.reads is not None:
            self.reads.open(self)
        self._on_batch = on_batch
        try:
            self._loop(stop, idle_exit_s)
            if not self.script:
                while self.pending:
                    self._next_batch(self.config.batch_size)
            self._finish()
            self.outputs.settle()
            self.checkpoint()
        finally:
            self._on_batch = None
            if self.reads is not None:
                self.reads.close()
        return self.stats

    def _loop(self, stop: Callable[[], bool], idle_exit_s: float | None) -> None:
        """Read, admit and apply updates. A batch still computing (MPI workers, or its
        copy back from the device: `Engine.computing`) is finished after the next poll,
        which reads and admits what arrives meanwhile; if that makes a full batch and
        nothing stands in the way (`_overlaps`), the full batch starts first."""
        cfg = self.config
        per_record = 1.0  # updates per record lately: poll about one batch's worth
        opened = last_input = time.monotonic()
        while not stop():
            if not self._flights:
                self._serve_reads()
                self._reap_checkpoint()
            if self.script:
                self._replay_step()
                last_input = time.monotonic()
                continue
            if self.queries is not None and not self._flights:
                self._answer_queries()
            want = cfg.batch_size - len(self.pending)
            wait = cfg.max_wait_s if self.pending else 0.1
            if self.queries is not None or self.reads is not None:
                wait = min(wait, _ANSWER_POLL_S)  # requests wait on this poll
            if self._flights:  # read while it computes (as long as the last batch took),
                wait = min(wait, self._last_batch_s)  # then its outputs
            records = self.transport.poll(max(1, int(want / per_record)), wait)
            now = time.monotonic()
            self.outputs.record_acks()
            self.stats.lag = self.transport.lag()
            if records:
                if self.stats.first_input is None:
                    self.stats.first_input = time.perf_counter()
                last_input = now
                if not self.pending:
                    opened = now
                admitted = self._admit(records)
                per_record = max(1.0, sum(map(size, admitted)) / len(records))
                self.pending.extend(admitted)
            expired = self.arrivals.expired()
            if expired:
                if self.journal is not None:  # replayed after the last batch started
                    self.journal.expired(Journal.expired_entry(
                        self._last_started,
                        (w.source.key for w in expired)))
                for w in expired:
                    self._expire(w.update, w.source)
            full = len(self.pending) >= cfg.batch_size
            if self._flights and not (full and self._overlaps()):
                self._finish()
                self._between_batches()
            waited = bool(self.pending) and now - opened >= cfg.max_wait_s
            if waited or full:
                while len(self.pending) >= cfg.batch_size or (waited and self.pending):
                    self._next_batch(cfg.batch_size)
                    if not self._flights or self._asked():
                        self._finish()
                        self._between_batches()
                opened = now
                self._maybe_checkpoint()
            elif (idle_exit_s is not None and not self.pending and not len(self.arrivals)
                  and now - last_input >= idle_exit_s):
                return

    def _between_batches(self) -> None:
        """What is answered from the state between two batches: reads, queries; and a
        background checkpoint that finished."""
        self._serve_reads()
        self._reap_checkpoint()
        if self.queries is not None:
            self._answer_queries()

    def _serve_reads(self) -> None:
        """Reads queued by other threads, for about as long as the last batch took (at
        least ``_READ_SLICE_S``)."""
        if self.reads is not None:
            self.reads.serve(max(self._last_batch_s, _READ_SLICE_S))

    # ---------------------------------------------------------------- queries
    def _queries_waiting(self) -> bool:
        """Whether query requests wait (read off their topic, up to ``_QUERIES_AT_ONCE``,
        to be answered next between two batches)."""
        if self.queries is not None and not self._requests:
            self._requests = self.queries.poll(_QUERIES_AT_ONCE, 0)
        return bool(self._requests)

    def _answer_queries(self) -> None:
        """Answer the waiting query requests (those read already, else up to
        ``_QUERIES_AT_ONCE``) from the current state."""
        self._queries_waiting()
        requests, self._requests = self._requests, []
        for record in requests:
            self.transport.publish(self.config.topics.results, None,
                                   encode(self._answer(record)))

    def _answer(self, record: Record) -> QueryResult:
        """The result for one request record: the answer, or the error naming why there
        is none (the record's own position names it when it is not even a request)."""
        at = f"{record.topic}-{record.partition}-{record.offset}"
        base = {"event_id": f"qr-{at}", "request_id": f"unreadable-{at}",
                "batch": self.batch_seq}
        try:
            req = decode_query(record.value)
            base.update(request_id=req.event_id, budget=req.budget, policy=req.policy)
            return self.query(req, req.event_time, base["event_id"])
        except DecodeError as e:
            kind, reason = e.error, str(e)
            self.stats.queries[kind] += 1
        except InvalidInputError as e:  # counted by `query`
            kind, reason = e.kind, str(e)
        except Exception as e:  # one request must never stop the service
            kind, reason = "internal", f"{type(e).__name__}: {e}"
            self.stats.queries[kind] += 1
        return QueryResult(**base, error=kind, reason=escaped(reason))

    def query(self, req: QueryRequest, since: float, event_id: str | None = None
              ) -> QueryResult:
        """``req`` answered from the current state (call it between two batches), counted
        in the stats with its latency from ``since`` (a `time.time`); raises the
        `InvalidInputError` naming why it cannot be answered (counted by its kind).
        ``event_id``: the result's (default: a new one)."""
        try:
            if req.insert:
                raise InvalidQueryError("insert is not served by the service: produce the "
                                        "vertices and edges to the updates topic (the one "
                                        "writer of the graph) and query them after")
            answer = self.engine.query(req)
        except InvalidInputError as e:
            self.stats.queries[e.kind] += 1
            raise
        latency_ms = (time.time() - since) * 1e3
        self.stats.queries["answered"] += 1
        self.stats.query_latency.record(latency_ms)
        return QueryResult(
            **({} if event_id is None else {"event_id": event_id}),
            request_id=req.event_id, batch=self.batch_seq, budget=req.budget,
            policy=req.policy, ids=answer.ids.tolist(), labels=answer.labels.tolist(),
            embeddings=answer.embeddings.tolist() if req.embeddings else None,
            recomputed=int(sum(len(r) for r in answer.recomputed)), latency_ms=latency_ms)

    # ---------------------------------------------------------------- input
    def _admit(self, records: list[Record], gate: bool = True,
               needed: frozenset[tuple[int, int]] = frozenset()) -> list[Entry]:
        """Decode ``records`` and, if ``gate``, admit their updates through `Arrivals` (else
        return them as items):
        each record inside a guard, in journaled steps (one record per step while any of
        them is one a process died on); quarantined records are dead-lettered unread,
        unless the replay ``needed`` them ((partition, offset) pairs)."""
        watched = self.suspects is not None and any(
            self.suspects.suspect(r.partition, r.offset) for r in records)
        steps = [[r] for r in records] if watched else [records]
        out: list[Entry] = []
        for step in steps:
            if self.journal is not None:
                self.journal.admitting(spans((r.partition, r.offset) for r in step))
            for r in step:
                out += self._admit_record(r, gate, (r.partition, r.offset) in needed)
            if self.journal is not None:
                self.journal.ok()
        return out

    def _admit_record(self, r: Record, gate: bool, needed: bool) -> list[Entry]:
        origin = Origin(r)
        if (self.suspects is not None and not needed
                and (n := self.suspects.quarantined(origin.key))):
            self.stats.events += 1
            self.outputs.dead_letter(origin, "quarantined", f"the service died {n} times "
                                     "while this record alone was being decoded or applied")
            return []
        try:
            decoded = self._decode(r)
            if isinstance(decoded, AdmittedColumns):
                if gate and self.arrivals.admit_columns(decoded.rows.batch):
                    return [decoded]
                decoded = decoded.items()
            return self.arrivals.admit(decoded) if gate else decoded
        except Exception as e:  # whatever one record causes, it costs only that record
            self.outputs.dead_letter(origin, "internal", f"{type(e).__name__}: {e}")
            return []

    def _decode(self, r: Record) -> list[Item] | AdmittedColumns:
        """The updates of a record (a columnar one's in a run); dead letters for what is
        not one."""
        try:
            items = decode_updates(r.value)
        except DecodeError as e:
            self.outputs.dead_letter(Origin(r), e.error, str(e))
            self.stats.events += 1
            return []
        if isinstance(items, DecodedColumns):
            for i, e in items.errors:
                self.outputs.dead_letter(Origin(r, i), e.error, str(e), payload=e.item,
                                         source_event_id=items.event_id)
            self.stats.events += len(items) + len(items.errors)
            return AdmittedColumns(items, r) if len(items) else []
        indexed = is_array(r.value)
        decoded = []
        for i, item in enumerate(items):
            origin = Origin(r, i if indexed else None)
            if isinstance(item, DecodeError):
                self.outputs.dead_letter(origin, item.error, str(item), payload=item.item)
            else:
                decoded.append((item, origin))
        self.stats.events += len(items)
        return decoded

    def _expire(self, update: Update, origin: Origin) -> None:
        named = referenced(update)
        vertex = next((v for v in named if not self.engine.contains(v)[0]), named[0])
        self.outputs.dead_letter(origin, "vertex_never_arrived",
                                 f"vertex {vertex} did not arrive within "
                                 f"{self.config.arrival_wait_s:g} s", update)

    # ---------------------------------------------------------------- replay
    def _replay_step(self) -> None:
        """The next journaled step, once the updates it names are decoded."""
        step = self.script[0]
        named = step_keys(step)
        missing = [k for k in named if k not in self.held]
        if missing:
            records = self.transport.poll(1000, 0.1)
            if not records:
                self._replay_stalls(missing)
                return
            needed = frozenset((p, o) for e in self.script for p, o, _ in step_keys(e))
            decoded = self._admit(records, gate=False, needed=needed)
            self.held.update((o.key, (u, o)) for u, o in decoded)
            return
        self._stalled_since = None
        self.script.popleft()
        items = [self.held.pop(k) for k in named]
        if "expired" in step:
            self.journal.expired(step)
            for update, origin in items:
                self._expire(update, origin)
        else:
            self._start(items, step["at"])
            self._finish()
        if not self.script:
            self._release_held()

    def _release_held(self) -> None:
        """The replay is over: what it held goes through the gate as new input would."""
        rest = sorted(self.held.values(), key=lambda item: item[1].key)
        self.held = {}
        self.pending.extend(self.arrivals.admit(rest))

    def _replay_stalls(self, missing: list[Key]) -> None:
        now = time.monotonic()
        if self._stalled_since is None:
            self._stalled_since = now
        elif now - self._stalled_since > 30:
            raise RuntimeError(f"cannot replay the journal: {len(missing)} updates it names "
                               f"(first: partition {missing[0][0]}, offset {missing[0][1]}) "
                               "are no longer on the topic; start with a fresh --state-dir")

    # ---------------------------------------------------------------- batches
    def _next_batch(self, size: int) -> None:
        """Cut the next batch from ``pending`` and start it (`_start`); then finish the one
        before, if it was still in flight (`_overlaps`), else it was finished first.
        Updates from records a process died on go one per batch; quarantined ones are
        dead-lettered instead."""
        if not self._overlaps():
            self._finish()  # before the queue is cut: its arrivals are those of a finished batch
        watched = self.suspects is not None and self.suspects.ranges
        if not watched:
            self._start(self._take(size))
            while len(self._flights) > 1:
                self._finish_oldest()
            return
        # while records are suspect, a batch is alone in flight: finished before any
        # other record is admitted, so a death names it alone
        items = self.pending.items()
        first = items[0][1]
        if self.suspects.suspect(first.record.partition, first.record.offset):
            [(update, origin)] = self._take(1)
            if n := self.suspects.quarantined(origin.key):
                self.outputs.dead_letter(origin, "quarantined", f"the service died {n} "
                                         "times while this update alone was being applied",
                                         update)
                return
            self._start([(update, origin)])
        else:
            cut = next((i for i, (_, o) in enumerate(items[:size])
                        if self.suspects.suspect(o.record.partition, o.record.offset)), size)
            self._start(self._take(cut))
        self._finish()

    def _take(self, n: int) -> list[Entry]:
        """The next ``n`` queued updates, off the queue (the arrivals gate forgets them)."""
        entries = self.pending.take(n)
        self.arrivals.taken(sum(map(size, entries)))
        return entries

    @property
    def _last_started(self) -> int:
        """The number of the last batch started (in flight, or finished)."""
        return self._flights[-1].seq if self._flights else self.batch_seq

    def _overlaps(self) -> bool:
        """Whether the next batch may start before the one in flight is finished: the
        engine takes another (MPI workers: `Engine.takes_another`), no record is suspect
        (a death must name one batch alone), no read or query request waits (`_asked`:
        they are answered between two batches), and no read view is kept (it publishes a
        batch against the graph as that batch left it)."""
        return (self.engine.takes_another and not (self.suspects and self.suspects.ranges)
                and (self.reads is None or self.reads.view is None) and not self._asked())

    def _asked(self) -> bool:
        """Whether reads or query requests wait to be answered (between two batches)."""
        return (self.reads is not None and self.reads.waiting) or self._queries_waiting()

    def _start(self, buffer: list[Entry], at: float | None = None) -> None:
        """Start ``buffer`` as the next batch (at most one other in flight), its outputs to
        carry event time ``at`` (default: the latest event time of its updates, or now).
        The engine changes its graph now, so the next updates are admitted against it;
        `_finish` publishes what changed, at once where the engine is done already (shards
        in this process on the CPU), else after the loop's next poll or the next batch's
        start."""
        t = time.perf_counter()
        cut = Cut.of(buffer, self.engine.num_features)
        seq = self._last_started + 1
        times = cut.times()
        if at is None:
            at = float(times.max()) if len(times) else time.time()
        if self.journal is not None:  # a replayed batch is journaled again, the same
            self.journal.batch(Journal.batch_entry(seq, cut.runs(), at))
        try:
            self.engine.submit(cut.updates, skip_invalid=True)
        except Exception as e:
            raise EngineFailure(f"batch {seq} ({len(cut.updates)} updates) failed in the "
                                f"engine: {type(e).__name__}: {e}") from e
        self.stats.started_early += bool(self._flights)
        self._flights.append(_Flight(seq, cut, times, at, time.perf_counter() - t))
        if not self.engine.computing:  # done already (shards in this process)
            self._finish()

    def _finish(self) -> None:
        """Finish every batch in flight, oldest first."""
        while self._flights:
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        """Finish the oldest batch in flight: take its result from the engine, dead-letter
        what it rejected and publish what changed (not waiting for the broker's
        acknowledgement: `Outputs.record_acks`); then `run`'s ``on_batch`` sees its report."""
        flight = self._flights.popleft()
        t = time.perf_counter()
        cut, seq = flight.cut, flight.seq
        batch = cut.updates
        try:
            result = self.engine.collect()
        except Exception as e:
            raise EngineFailure(f"batch {seq} ({len(batch)} updates) failed in the engine: "
                                f"{type(e).__name__}: {e}") from e
        if self.journal is not None:
            self.journal.done(seq)
        if not self.pending:
            self.arrivals.all_applied()
        for err in result.rejected:
            update, origin = cut.item(err.index)
            self.outputs.dead_letter(origin, err.kind, err.reason, update)
        self.batch_seq = seq
        if self.reads is not None and self.reads.view is not None:
            self.reads.view.publish(seq, result, self.engine)
        self.outputs.label_changes(result.changed_labels, cut.records(), flight.times,
                                   flight.at, self.epoch, seq)
        seconds = flight.seconds + time.perf_counter() - t
        s = self.stats
        s.batches += 1
        s.updates.update(cut.counts())
        s.updates.subtract(OP_NAMES[batch.op[err.index]] for err in result.rejected)
        s.label_changes += len(result.changed_labels)
        s.batch_time.record(seconds * 1000)
        s.busy_s += seconds
        self._last_batch_s = seconds
        if self._on_batch is not None:
            self._on_batch(BatchReport(seq, len(batch), result, seconds))

    def _reap_checkpoint(self) -> None:
        """Take note of a background checkpoint that has finished."""
        if self._writing is not None and self._writing.done() is not None:
            self._written()

    def _maybe_checkpoint(self) -> None:
        self._reap_checkpoint()
        seq, at = self._last_checkpoint
        if (self.batch_seq - seq >= self.config.checkpoint_batches
                or time.monotonic() - at >= self.config.checkpoint_s):
            self.checkpoint(wait=False)

def new_epoch() -> str:
    """A new state's epoch: the time it is bootstrapped, in milliseconds (hex). Label
    changes carry it in their event ids, so a state rebuilt in the same --state-dir (or a
    fresh one) never reuses an id of an earlier state with other content."""
    return f"{time.time_ns() // 1_000_000:x}"


def saved_model(saved: Saved) -> ModelFile:
    """The model a service checkpoint holds (loaded with at least its ``model`` file)."""
    return ModelFile(ModelSpec(**saved.meta["spec"]), {
        k: torch.from_numpy(a) for k, a in saved.files["model"].items()})


def _item_json(update: Update, origin: Origin, wait: tuple[int, float] | None = None
               ) -> dict:
    """An admitted update and its source as JSON (a whole-record update keeps the record's
    bytes: its dead letter would carry them)."""
    r = origin.record
    out = {"update": update.model_dump(mode="json"), "key": list(origin.key),
           "topic": r.topic}
    if origin.index is None:
        out["value"] = base64.b64encode(r.value or b"").decode()
    if wait is not None:
        out["wait"] = list(wait)
    return out


def _item(raw: dict) -> Item:
    p, o, i = raw["key"]
    value = base64.b64decode(raw["value"]) if "value" in raw else b""
    return (UPDATE_ADAPTER.validate_python(raw["update"]),
            Origin(Record(raw["topic"], p, o, value), None if i < 0 else i))


_READ_SLICE_S = 0.01
_ANSWER_POLL_S = 0.002  # the longest a poll blocks while queries or reads may be waiting
_QUERIES_AT_ONCE = 16  # query requests read and answered at a time


def run_recovering(open_service: Callable[[], Service], on_failure: Callable[[Exception],
                   None] = lambda e: None, **run: object) -> Service:
    """Open a service and `Service.run` it (``run``: its arguments); when the engine fails,
    close it and open it again (from its checkpoint and journal, which isolate the
    update responsible). Returns the service that finished."""
    while True:
        service = open_service()
        try:
            service.run(**run)
            return service
        except EngineFailure as e:
            if service.checkpoints is None:
                raise  # nothing to recover from
            on_failure(e)
            service.close()
