"""Fault injection on the service's state directory (issue 49): corrupt generations and
retention, an edited manifest, no generation that verifies, a state rebuilt from a
shorter stream, and the counters a restart must resume rather than reset. Real files,
the in-memory transport, a real uvicorn for /v1/status and /metrics."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import streamgnn as sg
from streamgnn.api.server import HttpServer
from streamgnn.errors import UserError
from streamgnn.npz import write_arrays
from streamgnn.router import Checkpoints, Service, ServiceConfig
from streamgnn.router.reads import Reads
from streamgnn.stream import LabelChanges, encode
from streamgnn.stream.memory import MemoryBroker, MemoryTransport
from tests.test_faults import (
    TOPICS,
    assert_repeats_identical,
    assert_whole,
    letters,
    opener,
    setup,
)

QUIET = ServiceConfig(batch_size=25, checkpoint_batches=10**6, checkpoint_s=1e6,
                      topics=TOPICS)
"""Checkpoints at start-up and shutdown only: generation 1, then 2."""


def streamed(updates) -> MemoryBroker:
    broker = MemoryBroker()
    for u in updates:
        broker.produce(TOPICS.updates, encode(u))
    return broker


def flip(file: Path) -> None:
    """One bit of ``file`` flipped."""
    raw = bytearray(file.read_bytes())
    raw[len(raw) // 2] ^= 1
    file.write_bytes(bytes(raw))


def label_changes(broker) -> dict[str, bytes]:
    """Every label-change message by event id (a repeat must be the same message)."""
    out: dict[str, bytes] = {}
    for r in broker.records(TOPICS.labels):
        out.setdefault(LabelChanges.model_validate_json(r.value).event_id, r.value)
    return out


def served_once(state):
    """The tiny stream served to its end once, checkpointed in ``state``: the data, the
    model, the snapshot it bootstrapped, the broker, the service's opener (to restart it)
    and the finished service."""
    data, model = setup()
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    broker = streamed(events)
    open_service = opener(broker, snapshot, model, QUIET, state)
    first = open_service()
    first.run(idle_exit_s=0.5)
    first.close()
    return data, model, snapshot, broker, open_service, first


def test_retention_keeps_the_last_verified_generation_and_moves_a_corrupt_one_aside(tmp_path):
    """Generations 1 and 2; 2 corrupted: the restart moves it aside, uses 1, and its
    checkpoint 3 must not delete 1 (the old retention kept the corrupt 2 instead). 3
    corrupted too: the next restart still resumes from 1, replays everything journaled
    since, and ends where an uninterrupted run did."""
    data, model, _, broker, open_service, first = served_once(tmp_path)
    store = Checkpoints(tmp_path)
    assert store.generations() == [1, 2]
    flip(store.folder(2) / "shard0.npz")
    with pytest.warns(UserWarning, match="gen-000002/shard0.npz.*does not match"):
        second = open_service()
    assert second.batch_seq == 0  # generation 1, the start-up checkpoint
    second.run(idle_exit_s=0.5)  # replays the journal, then checkpoints: generation 3
    second.close()
    assert store.generations() == [1, 3]
    assert store.corrupt() == [2] and (tmp_path / "corrupt-gen-000002" / "shard0.npz").exists()
    flip(store.folder(3) / "shard0.npz")
    with pytest.warns(UserWarning, match="gen-000003/shard0.npz.*does not match"):
        third = open_service()
    assert third.batch_seq == 0 and third.epoch == first.epoch
    third.run(idle_exit_s=0.5)
    assert third.batch_seq == first.batch_seq
    assert_whole(third.engine, data, model)
    assert_repeats_identical(broker)
    assert not letters(broker)


def test_an_edited_manifest_is_corrupt_like_a_flipped_byte(tmp_path):
    """The newest manifest's offsets edited back by 10 (still valid JSON): that generation
    does not verify, is moved aside, and the previous one is used; nothing is consumed
    twice (no duplicate dead-lettered), and the state ends exact."""
    data, model, _, broker, open_service, first = served_once(tmp_path)
    manifest = Checkpoints(tmp_path).folder(2) / "manifest.json"
    raw = json.loads(manifest.read_text())
    raw["state"]["positions"]["0"] -= 10
    manifest.write_text(json.dumps(raw))
    with pytest.warns(UserWarning, match="gen-000002/manifest.json does not match its own"):
        service = open_service()
    assert service.batch_seq == 0
    assert Checkpoints(tmp_path).corrupt() == [2]
    service.run(idle_exit_s=0.5)
    assert not letters(broker)  # the old code re-applied 10 updates: duplicates
    assert service.batch_seq == first.batch_seq
    assert_whole(service.engine, data, model)
    assert_repeats_identical(broker)


def test_with_no_generation_that_verifies_the_service_refuses_unless_asked_to_rebuild(
        tmp_path):
    """Both generations corrupted: opening refuses with one message naming the state
    directory and a hint naming --rebuild-state, and bootstraps nothing; asked to
    rebuild, it bootstraps a state of a new epoch."""
    _, model, snapshot, broker, open_service, first = served_once(tmp_path)
    for generation in (1, 2):
        flip(Checkpoints(tmp_path).folder(generation) / "shard0.npz")
    with (pytest.warns(UserWarning, match="does not match"),
          pytest.raises(UserError) as refused):
        open_service()
    assert str(tmp_path) in refused.value.message and "\n" not in refused.value.message
    assert "--rebuild-state" in refused.value.hint
    store = Checkpoints(tmp_path)
    assert (store.generations(), store.corrupt()) == ([], [1, 2])
    rebuilt = Service.open(lambda: model, lambda m: sg.Engine.from_pyg(m.model(), snapshot),
                           MemoryTransport(broker, TOPICS.updates), QUIET, store,
                           rebuild=True)
    assert rebuilt.epoch != first.epoch and store.generations() == [3]


def test_a_state_rebuilt_from_a_shorter_stream_never_reuses_an_earlier_states_ids(tmp_path):
    """The topic kept only the second half of the stream (retention) when the state was
    rebuilt: the new state's label changes differ, so none may carry an id the first
    state published (consumers drop repeats by id)."""
    data, model = setup()
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    whole, rest = streamed(events), streamed(events[len(events) // 2:])
    first = opener(whole, snapshot, model, QUIET, tmp_path / "a")()
    first.run(idle_exit_s=0.5)
    time.sleep(0.002)  # (a new state's epoch is its bootstrap's millisecond)
    again = opener(rest, snapshot, model, QUIET, tmp_path / "b")()
    again.run(idle_exit_s=0.5)
    before, after = label_changes(whole), label_changes(rest)
    assert before and after
    reused = {i for i in before.keys() & after.keys() if before[i] != after[i]}
    assert not reused, sorted(reused)[:5]


def _metrics(text: str) -> dict[str, float | dict[str, float]]:
    """The ``streamgnn_state_*`` counters of an exposition (by label where labelled)."""
    out: dict = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("streamgnn_state_") and s.name.endswith("_total"):
                name = s.name.removeprefix("streamgnn_state_").removesuffix("_total")
                if s.labels:
                    out.setdefault(name, {})[next(iter(s.labels.values()))] = s.value
                else:
                    out[name] = s.value
    return out


def test_counters_kept_in_the_checkpoint_equal_an_uninterrupted_runs_after_a_restart(
        tmp_path):
    """A stream with bad records served once without a break, and once dying at batch 60
    (after background checkpoints) and restarted: the restarted service's counters since
    the state began (/v1/status ``state``, /metrics ``streamgnn_state_*``) equal the
    uninterrupted run's, replayed batches counted once; its per-process counters start
    from the restart."""
    data, model = setup()
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    stream = [encode(u) for u in events]
    stream[::97] = [b"{not json"] * len(stream[::97])

    def broker() -> MemoryBroker:
        b = MemoryBroker()
        for raw in stream:
            b.produce(TOPICS.updates, raw)
        return b

    config = ServiceConfig(batch_size=20, checkpoint_batches=25, topics=TOPICS)
    whole = opener(broker(), snapshot, model, config)()
    whole.run(idle_exit_s=0.5)
    s = whole.stats
    expected = {"events_consumed": len(stream), "batches": s.batches,
                "updates_applied": {op: n for op, n in s.updates.items() if n},
                "label_changes": s.label_changes,
                "dead_letters": dict(s.dead_letters)}
    assert s.dead_letters["malformed_json"] == len(stream[::97])

    class Crash(BaseException):
        pass

    def dying(report) -> None:
        if report.seq == 60:
            raise Crash

    restarted = broker()
    dead = opener(restarted, snapshot, model, config, tmp_path)()
    with pytest.raises(Crash):
        dead.run(idle_exit_s=0.5, on_batch=dying)
    dead.close()  # (its checkpoint's writer finishes: a dead process's would be killed)
    reads = Reads()
    service = Service.open(lambda: model, lambda m: sg.Engine.from_pyg(m.model(), snapshot),
                           MemoryTransport(restarted, TOPICS.updates), config,
                           Checkpoints(tmp_path), reads=reads)
    assert 0 < service.batch_seq < 60  # a checkpoint before the death, then a replay
    server = HttpServer(reads, "127.0.0.1", 0).start()
    stop = threading.Event()
    loop = threading.Thread(target=service.run, kwargs={"stop": stop.is_set})
    loop.start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            deadline = time.monotonic() + 60
            while True:
                status = http.get("/v1/status")
                body = status.json() if status.status_code == 200 else {}
                if body and body["lag"] == 0 and body["state"]["batches"] >= s.batches and (
                        body["state"]["dead_letters"] == expected["dead_letters"]):
                    break  # (updates whose vertex never arrives expire after their wait)
                assert time.monotonic() < deadline, body
                time.sleep(0.2)
            time.sleep(1.0)  # nothing after it
            body = http.get("/v1/status").json()
            exposed = _metrics(http.get("/metrics").text)
    finally:
        stop.set()
        loop.join()
        server.stop()
    state = body["state"]
    assert {"events_consumed": state["events"], "batches": state["batches"],
            "updates_applied": state["applied"], "label_changes": state["label_changes"],
            "dead_letters": state["dead_letters"]} == expected
    assert exposed == expected
    assert body["events"] < state["events"]  # this process's own: since the restart
    assert body["batch"] == s.batches and body["epoch"] == service.epoch


class DirectoryCopies:
    """`Copies` another process keeps in its own state directory ``store`` (as MPI workers
    on other hosts do), answered here."""

    def __init__(self, store: Checkpoints) -> None:
        self.store = store

    def owns(self, name: str) -> bool:
        return name.startswith("shard")

    def verify(self, generation: int, entries: list[dict]) -> list[str]:
        return self.store.check(generation, entries)

    def move_aside(self, generation: int) -> None:
        self.store.move_aside(generation)

    def drop_before(self, generation: int, kept: list[int]) -> None:
        self.store.drop_before(generation, kept)


def test_files_another_process_keeps_are_checked_moved_aside_and_dropped_where_they_are(
        tmp_path):
    """Generations whose ``shard0`` lies in another state directory: retention drops them
    there too; a load reads only its own files and has the other side check its own; a
    byte flipped there moves the generation aside on both sides, and the previous one is
    used; that side, with no manifest of its own, peeks at nothing; a background write
    is written in place (the copies are told over MPI: not from a forked child)."""
    theirs = Checkpoints(tmp_path / "B")
    store = Checkpoints(tmp_path / "A", copies=DirectoryCopies(theirs))
    for n in range(1, 5):
        generation = store.begin()
        theirs.folder(generation).mkdir(parents=True)
        store.commit(generation, {"n": n}, [
            write_arrays(store.folder(generation), "engine", {"x": np.full(10, n)}),
            write_arrays(theirs.folder(generation), "shard0", {"x": np.full(10, -n)})])
    assert store.generations() == theirs.generations() == [3, 4]
    saved = store.load()
    assert saved.meta == {"n": 4} and list(saved.files) == ["engine"]
    flip(theirs.folder(4) / "shard0.npz")
    with pytest.warns(UserWarning, match="B/gen-000004/shard0.npz is missing or does not "
                                         "match.*moved aside to corrupt-gen-000004"):
        assert store.load().meta == {"n": 3}
    assert store.corrupt() == theirs.corrupt() == [4]
    assert theirs.peek("shard0") is None and store.peek("engine").meta == {"n": 3}
    writing = store.write(store.begin(), lambda folder: [], {"n": 5}, background=True)
    assert writing._pid is None and store.generations() == [3, 5]
    assert theirs.generations() == [3]
