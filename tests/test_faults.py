"""Fault injection: a catalogue of bad input sent between good updates through the
in-memory transport. Each case must come out as a dead letter with its kind and a reason,
the service must keep running, and every good update around it must be applied (the final
embeddings equal PyG's forward pass on the final graph). Then the failures no decoder can
catch: an update that drives embeddings to inf, and a record the process dies on, both
isolated and quarantined after restarts instead of retried forever."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

import streamgnn as sg
from streamgnn.models.zoo import ModelFile, ModelSpec
from streamgnn.router import Checkpoints, Service, ServiceConfig, run_recovering
from streamgnn.router import service as service_module
from streamgnn.stream import DeadLetter, LabelChanges, QueryResult, Topics, encode
from streamgnn.stream.memory import MemoryBroker, MemoryTransport
from streamgnn.stream.schemas import encode_columns
from streamgnn.updates import UpdateBatch
from streamgnn.workers import Engine
from streamgnn.workers.local import LocalWorkers
from tests.conftest import pyg_layers
from tests.test_partitions import growing_stream

TOPICS = Topics()


def setup(name: str = "sage-mean"):
    data = sg.datasets.synthetic("tiny", 0)
    spec = ModelSpec(name, data.num_features, data.num_classes, 16, 2)
    torch.manual_seed(0)
    return data, ModelFile(spec, spec.build().state_dict())


def opener(broker, data, model, config, state=None, partitions=1):
    def open_service() -> Service:
        return Service.open(lambda: model, lambda m: sg.Engine.from_pyg(
                                m.model(), data, partitions=partitions),
                            MemoryTransport(broker, config.topics.updates), config,
                            Checkpoints(state) if state else None)
    return open_service


def outputs(broker) -> tuple[list[dict], list[str]]:
    """The label-change messages (but their event times: the production times, and the
    state's epoch in their event ids: each service's own) and the dead letters' event ids
    the service published, in order."""
    return ([_without_epoch(LabelChanges.model_validate_json(r.value).model_dump(
                exclude={"event_time"})) for r in broker.records(TOPICS.labels)],
            [DeadLetter.model_validate_json(r.value).event_id
             for r in broker.records(TOPICS.dead_letters)])


def _without_epoch(message: dict) -> dict:
    """``lc-{epoch}-{batch}-{part}`` as ``lc-{batch}-{part}``."""
    kind, _, rest = message["event_id"].split("-", 2)
    return {**message, "event_id": f"{kind}-{rest}"}


def letters(broker) -> list[DeadLetter]:
    return [DeadLetter.model_validate_json(r.value)
            for r in broker.records(TOPICS.dead_letters)]


def assert_exact(engine, model):
    """Every layer equals PyG's forward pass on the final graph: within 1e-4, or float32's
    relative precision (1e-6) where embeddings run into the thousands."""
    current = engine.to_data()
    for layer, ref in enumerate(pyg_layers(model.model(), current)):
        tolerance = max(1e-4, 1e-6 * float(ref.abs().max()))
        assert np.abs(engine.lookup(current.ids, layer) - ref.numpy()).max() < tolerance


def assert_whole(engine, data, model):
    """The engine holds every vertex and edge of ``data``, and is exact."""
    current = engine.to_data()
    assert set(current.ids) == set(data.ids) and current.num_edges == data.num_edges
    assert_exact(engine, model)


def assert_repeats_identical(broker):
    """A label-change message published again (a replay) is the same message."""
    seen: dict[str, bytes] = {}
    for r in broker.records(TOPICS.labels):
        event_id = LabelChanges.model_validate_json(r.value).event_id
        assert seen.setdefault(event_id, r.value) == r.value, event_id


def catalogue(data) -> list[tuple[bytes | None, str]]:
    """(raw message, the dead letter kind it must produce)."""
    v, w = (int(i) for i in data.ids[:2])
    d = data.num_features
    x = json.dumps([0.5] * d)
    columns = json.loads(encode_columns(UpdateBatch.from_updates(
        [sg.UpdateEdge(src=v, dst=w, weight=0.5), sg.UpdateFeatures(id=v, x=[0.5] * d)], d)))

    def bad_columns(**change) -> bytes:
        return json.dumps(columns | change).encode()

    return [
        (bad_columns(x="%%%"), "invalid_fields"),                          # not base64
        (bad_columns(x=columns["x"][:-8]), "invalid_fields"),               # x too short
        (bad_columns(width=d + 1), "invalid_fields"),                       # rows x width
        (bad_columns(w=[0.5]), "invalid_fields"),                           # lengths differ
        (bad_columns(a=[v, 2**64]), "invalid_fields"),                      # beyond int64
        (bad_columns(ops=[], a=[], b=[], w=[], x=""), "empty"),
        (encode_columns(UpdateBatch.from_updates(                          # features too wide
            [sg.UpdateFeatures(id=v, x=[0.5] * (d + 1))], d + 1)), "wrong_dimension"),
        (None, "tombstone"),
        (b"", "malformed_json"),
        (b"{not json", "malformed_json"),
        (b"\x00\xff\xfe binary junk \x81", "malformed_json"),
        (b"[" * 3000 + b"]" * 3000, "malformed_json"),     # nesting past any parser's stack
        (b"[]", "empty"),
        (b"42", "invalid_fields"),
        (b'"add_edge"', "invalid_fields"),
        (b'{"op": "teleport", "id": 3}', "unknown_op"),
        (b'{"src": 1, "dst": 2}', "unknown_op"),
        (b'{"op": "add_edge", "src": 1}', "invalid_fields"),                 # missing field
        (b'{"op": "delete_vertex", "id": 1, "colour": "red"}', "invalid_fields"),  # extra
        (b'{"op": "add_edge", "src": "51000000", "dst": 2}', "invalid_fields"),  # no coercion
        (b'{"op": "add_edge", "src": 1234.0, "dst": 2}', "invalid_fields"),
        (b'{"op": "add_edge", "src": 1, "dst": 2, "weight": true}', "invalid_fields"),
        (b'{"op": "add_edge", "src": %d, "dst": %d}' % (v, 2**63), "invalid_fields"),
        (b'{"op": "add_edge", "src": %d, "dst": %d}' % (v, 10**30), "invalid_fields"),
        (b'{"op": "add_vertex", "id": %d, "x": %s}' % (2**64 + 3, x.encode()),
         "invalid_fields"),
        (b'{"op": "add_edge", "src": %d, "dst": %d, "weight": NaN}' % (v, w), "non_finite"),
        (b'{"op": "update_features", "id": %d, "x": [Infinity]}' % v, "non_finite"),
        (encode(sg.UpdateFeatures(id=v, x=[1e30] * d)), "out_of_range"),
        (encode(sg.UpdateFeatures(id=v, x=[3e38] * d)), "out_of_range"),
        (encode(sg.UpdateEdge(src=v, dst=w, weight=1e9)), "out_of_range"),
        (encode(sg.UpdateFeatures(id=v, x=[0.5] * (d + 1))), "wrong_dimension"),
        (encode(sg.AddVertex(id=v, x=[0.0] * d)), "duplicate_vertex"),
        (encode(sg.AddEdge(src=v, dst=v)), "self_loop"),
        (encode(sg.DeleteEdge(src=v, dst=-v - 1)), "vertex_never_arrived"),
        (encode(sg.DeleteVertex(id=-5)), "vertex_never_arrived"),           # negative id
        (b'{"op": "add_edge", "src": 1, "dst": 2, "bad": "\x01\x1b[31m"}', "malformed_json"),
        (b'{"op": "add_vertex", "id": 7, "x": [' + b"1.0," * 300_000 + b'1.0]}',
         "wrong_dimension"),                                                # 1.2 MB message
    ]


@pytest.mark.parametrize("partitions", [1, 3])
def test_every_bad_message_is_dead_lettered_and_the_good_ones_around_it_applied(partitions):
    data, model = setup()
    broker = MemoryBroker()
    rng = np.random.default_rng(0)
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    cases = catalogue(snapshot)
    good = iter(events)
    expected = []
    for raw, kind in cases:  # each bad message between good updates, alone
        for u in [next(good) for _ in range(int(rng.integers(1, 4)))]:
            broker.produce(TOPICS.updates, encode(u))
        broker.produce(TOPICS.updates, raw)
        expected.append(kind)
    bom = b"\xef\xbb\xbf" + encode(next(good))  # a byte-order mark: accepted
    broker.produce(TOPICS.updates, bom)
    items = [next(good) for _ in range(5)]  # bad items inside arrays, each named by index
    array = [encode(items[0]), b'{"op": "add_edge", "src": 1, "dst": 2.5}', encode(items[1]),
             encode(sg.UpdateFeatures(id=int(snapshot.ids[0]), x=[1e300] * snapshot.num_features)),
             encode(items[2]), b"7", encode(items[3]), b'[[[["deep"]]]]', encode(items[4])]
    broker.produce(TOPICS.updates, b"[" + b",".join(array) + b"]")
    expected += ["invalid_fields", "out_of_range", "invalid_fields", "invalid_fields"]
    # bad rows inside a columns message, each named by index; the good ones around applied
    v, w, d = int(snapshot.ids[0]), int(snapshot.ids[1]), snapshot.num_features
    rows = [next(good), sg.UpdateFeatures(id=v, x=[0.5] * d), next(good), next(good),
            sg.UpdateEdge(src=v, dst=w, weight=1.0), sg.DeleteVertex(id=v), next(good)]
    batch = UpdateBatch.from_updates(rows, d)
    batch.x[batch.xrow[1]] = np.nan
    columns = json.loads(encode_columns(batch))
    columns["w"][4] = float("inf")  # json writes Infinity, as pydantic reads it
    columns["ops"][5] = 17
    columns["event_id"] = "cols-1"
    broker.produce(TOPICS.updates, json.dumps(columns).encode())
    expected += ["non_finite", "non_finite", "unknown_op"]
    for u in good:
        broker.produce(TOPICS.updates, encode(u))

    config = ServiceConfig(batch_size=50, arrival_wait_s=0.3, topics=TOPICS)
    service = opener(broker, snapshot, model, config, partitions=partitions)()
    service.run(idle_exit_s=0.5)

    got = letters(broker)
    assert sorted(d.error for d in got) == sorted(expected)
    for d in got:
        assert d.reason and all(ord(c) >= 32 for c in d.reason)  # control chars escaped
        assert len(d.payload.encode()) <= config.payload_bytes
        assert d.truncated == (d.payload_bytes > config.payload_bytes)
    huge = next(d for d in got if d.payload_bytes > 1_000_000)
    raw = next(r.value for r in broker.records(TOPICS.updates) if r.offset == huge.offset)
    assert huge.truncated and huge.payload_sha256 == hashlib.sha256(raw).hexdigest()
    in_array = sorted(d.index for d in got if d.index is not None)
    assert in_array == [0, 1, 1, 3, 4, 5, 5, 7] and len({d.event_id for d in got}) == len(got)
    assert sorted(d.index for d in got if d.source_event_id == "cols-1") == [1, 4, 5]
    assert service.stats.applied == len(events) + 0  # every good update, nothing else
    assert_whole(service.engine, data, model)


@pytest.fixture(params=[False, True], ids=["finished-at-once", "kept-in-flight"])
def in_flight(request, monkeypatch) -> None:
    """The service as with shards in this process (a batch finished as it starts), or
    keeping each batch in flight over its next poll, and starting the next before it is
    finished, as with MPI workers (the shards here take two batches in flight:
    `Workers.max_in_flight`, and `Engine.computing` is true until a batch is collected)."""
    if request.param:
        monkeypatch.setattr(LocalWorkers, "max_in_flight", 2)


@pytest.mark.parametrize("partitions", [1, 2])
def test_batches_started_before_the_one_before_finished_publish_the_same(partitions,
                                                                          monkeypatch):
    """With MPI workers the next full batch starts before the one in flight is finished.
    Kept so here (`Workers.max_in_flight` raised), batches start early (`Stats.started_early`),
    and the label changes (each message, event ids included; event times are the production
    times) and dead letters are those of the same stream applied one batch at a time;
    the state is exact."""
    data, model = setup()
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)

    def served(overlapping: bool) -> tuple[list[dict], list[str], int]:
        """Label changes, dead letters, batches started early."""
        broker = MemoryBroker()
        for i, u in enumerate(events):
            broker.produce(TOPICS.updates, encode(u))
            if i % 37 == 0:
                broker.produce(TOPICS.updates, encode(sg.AddEdge(src=-1 - i, dst=0)))
        with monkeypatch.context() as patch:
            if overlapping:
                patch.setattr(LocalWorkers, "max_in_flight", 2)
            config = ServiceConfig(batch_size=25, arrival_wait_s=0.2, topics=TOPICS)
            service = opener(broker, snapshot, model, config, partitions=partitions)()
            service.run(idle_exit_s=0.5)
        assert_whole(service.engine, data, model)
        return (*outputs(broker), service.stats.started_early)

    labels, letters_, early = served(overlapping=False)
    assert early == 0 and len(letters_) == len(range(0, len(events), 37))
    labels_early, letters_early, early = served(overlapping=True)
    assert early > 0 and (labels_early, letters_early) == (labels, letters_)


def test_a_query_arriving_while_batches_overlap_is_answered_at_the_next_batch(monkeypatch):
    """Batches kept two in flight as with MPI workers never leave the state between two
    batches on their own; a query request that arrives under a backlog makes the loop
    finish what is in flight and answer it before the next batch starts, and the batches
    overlap again after."""
    data, model = setup()
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    broker = MemoryBroker()
    for u in events:
        broker.produce(TOPICS.updates, encode(u))
    monkeypatch.setattr(LocalWorkers, "max_in_flight", 2)
    depths: list[int] = []
    submit = Engine.submit

    def counted(engine, *args, **kwargs):
        submit(engine, *args, **kwargs)
        depths.append(len(engine._in_flight))

    monkeypatch.setattr(Engine, "submit", counted)
    config = ServiceConfig(batch_size=10, topics=TOPICS)
    service = Service.open(lambda: model, lambda m: sg.Engine.from_pyg(m.model(), snapshot),
                           MemoryTransport(broker, TOPICS.updates), config,
                           queries=MemoryTransport(broker, TOPICS.queries))
    request = sg.QueryRequest(vertices=[sg.QueryVertex(id=-1, x=[0.5] * data.num_features)],
                              edges=[sg.QueryEdge(src=-1, dst=int(snapshot.ids[0]))])

    def on_batch(report) -> None:
        if report.seq == 10:
            broker.produce(TOPICS.queries, encode(request))

    service.run(idle_exit_s=0.3, on_batch=on_batch)
    (result,) = [QueryResult.model_validate_json(r.value)
                 for r in broker.records(TOPICS.results)]
    assert result.error is None and 10 <= result.batch <= 12
    assert 2 in depths[:10] and 2 in depths[13:]


def test_an_update_that_drives_embeddings_to_inf_is_isolated_and_quarantined(tmp_path,
                                                                             in_flight):
    """Limits raised to what float32 holds: features of 3e38 overflow the first layer.
    The engine refuses the batch, the service reopens from its checkpoint, replays, takes
    the suspect record's updates one at a time, and quarantines the one that fails twice;
    the good updates of the same batch are applied and the state is exact."""
    data, model = setup()
    model.state_dict = {k: v * 100 for k, v in model.state_dict.items()}  # sure to overflow
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    broker = MemoryBroker()
    victim = int(snapshot.ids[3])
    poison = sg.UpdateFeatures(id=victim, x=[3e38] * data.num_features)
    for u in events[:40]:
        broker.produce(TOPICS.updates, encode(u))
    batch = [*events[40:45], poison, *events[45:50]]
    broker.produce(TOPICS.updates, b"[" + b",".join(encode(u) for u in batch) + b"]")
    for u in events[50:]:
        broker.produce(TOPICS.updates, encode(u))
    config = ServiceConfig(batch_size=20, topics=TOPICS, max_abs_feature=1e39,
                           checkpoint_batches=1000, checkpoint_s=1000)
    failures = []
    service = run_recovering(opener(broker, snapshot, model, config, tmp_path),
                             failures.append, idle_exit_s=0.5)
    assert len(failures) == 3  # the batch, then the update alone twice
    assert "NaN or inf" in str(failures[0])
    (letter,) = letters(broker)
    assert letter.error == "quarantined" and letter.index == 5
    assert json.loads(letter.payload)["id"] == victim
    assert_whole(service.engine, data, model)


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_record_the_process_dies_on_is_quarantined_after_two_deaths(tmp_path, monkeypatch,
                                                                      partitions, in_flight):
    """A record whose decoding kills the process (a BaseException stands in for a crash in
    C code: nothing in the loop catches it). Each restart finds the step the journal left
    open (with a batch kept in flight, that batch too); the second death with the record
    alone in flight quarantines it."""
    data, model = setup()
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    broker = MemoryBroker()
    deadly = b'{"op": "delete_vertex", "id": 1, "event_id": "deadly"}'
    for u in events[:30]:
        broker.produce(TOPICS.updates, encode(u))
    at = broker.produce(TOPICS.updates, deadly)
    for u in events[30:]:
        broker.produce(TOPICS.updates, encode(u))
    decode = service_module.decode_updates

    class Crash(BaseException):
        pass

    def crashing(raw):
        if raw == deadly:
            raise Crash
        return decode(raw)

    monkeypatch.setattr(service_module, "decode_updates", crashing)
    config = ServiceConfig(batch_size=7, topics=TOPICS)
    open_service = opener(broker, snapshot, model, config, tmp_path, partitions)
    for _ in range(3):  # dies in a multi-record step, then twice with the record alone
        with pytest.raises(Crash):
            open_service().run(idle_exit_s=0.5)
    service = open_service()
    service.run(idle_exit_s=0.5)
    (letter,) = letters(broker)
    assert (letter.error, letter.offset) == ("quarantined", at)
    assert letter.payload.encode() == deadly
    assert service.stats.applied + 0 <= len(events)
    assert_whole(service.engine, data, model)
    changes = [LabelChanges.model_validate_json(r.value) for r in broker.records(TOPICS.labels)]
    first: dict[str, LabelChanges] = {}
    for m in changes:  # replays after each death republish the same messages
        assert first.setdefault(m.event_id, m) == m


def test_journal_replays_finished_batches_and_expiries_in_order_last_copy_counting():
    """A first life journals batches 3 and 4 with an expiry between them and dies in
    batch 5; a replay journals 3, the expiry and 4 again, then dies in batch 5 again.
    Replaying after checkpoint 2 gives 3, the expiry, 4 (once each); batch 5 never
    finished, so it is not replayed."""
    from streamgnn.router.journal import Journal
    b = lambda n: Journal.batch_entry(n, [[0, n, -1, 1]], float(n))  # noqa: E731
    x = Journal.expired_entry(3, [(0, 9, -1)])
    ok = {"ok": 1}
    life = [b(2), ok, b(3), ok, x, b(4), ok, b(5)]
    entries = life + life[2:]
    assert Journal.steps(entries, after=2) == [b(3), x, b(4)]
    assert Journal.steps(entries, after=3) == [x, b(4)]
    assert Journal.steps(entries, after=4) == []
    assert Journal.death(entries).batch == 5


def test_journal_names_what_was_in_flight_when_a_batch_overlapped_the_next_admit():
    """With MPI workers batch N is in flight while the next records are admitted: a
    death then leaves both open, and both become suspect (none alone: either may have
    killed the job); an admit that finished leaves batch N alone; a batch whose "done"
    came after such admits is finished, and replayed; what a dead process left open is
    not blamed on the one after it."""
    from streamgnn.router.journal import Journal
    b = lambda n: Journal.batch_entry(n, [[0, n, -1, 1]], float(n))  # noqa: E731
    life, ok, admit = {"life": 1}, {"ok": 1}, {"admit": [[0, 20, 24]]}
    both = Journal.death([life, b(4), {"done": 4}, b(5), admit])
    assert (both.batch, both.alone) == (5, None)
    assert sorted(both.records) == [(0, 5, 5), (0, 20, 24)]
    alone = Journal.death([life, b(5), admit, ok])
    assert (alone.batch, alone.alone, alone.records) == (5, (0, 5, -1), [(0, 5, 5)])
    entries = [life, b(3), admit, ok, {"done": 3}, b(4), admit]
    assert Journal.steps(entries, after=2) == [b(3)]
    assert Journal.death([life, b(5), admit, life, b(6), {"done": 6}]) is None


def test_journal_names_both_batches_when_the_next_started_before_one_was_done():
    """With MPI workers batch N+1 may start before N is done: a death with both open
    names both (none alone); N's "done" leaves N+1 open alone; neither open batch is
    replayed, both done ones are; an expiry journaled while both were in flight replays
    after the last batch that finished, once."""
    from streamgnn.router.journal import Journal
    b = lambda n: Journal.batch_entry(n, [[0, n, -1, 1]], float(n))  # noqa: E731
    life, ok, admit = {"life": 1}, {"ok": 1}, {"admit": [[0, 20, 24]]}
    both = Journal.death([life, b(4), admit, ok, b(5)])
    assert (both.batch, both.alone, both.records) == (5, None, [(0, 4, 5)])
    assert Journal.steps([life, b(3), {"done": 3}, b(4), b(5)], after=2) == [b(3)]
    later = Journal.death([life, b(4), admit, ok, b(5), {"done": 4}])
    assert (later.batch, later.alone, later.records) == (5, (0, 5, -1), [(0, 5, 5)])
    done = [life, b(4), b(5), {"done": 4}, admit, ok, {"done": 5}]
    assert Journal.death(done) is None
    assert Journal.steps(done, after=3) == [b(4), b(5)]
    # an expiry journaled while both were in flight goes after the last batch finished
    expiry = Journal.expired_entry(5, [(0, 90, -1)])
    first = [life, b(3), {"done": 3}, b(4), b(5), expiry]
    assert Journal.steps(first, after=2) == [b(3), {**expiry, "after": 3}]
    again = [life, {**expiry, "after": 3}, b(4), {"done": 4}]  # the next process
    assert Journal.steps(first + again, after=2) == [b(3), {**expiry, "after": 3}, b(4)]


def test_an_expiry_journaled_while_a_batch_was_in_flight_replays_once():
    """An expiry journaled while batch 4 was in flight names batch 4; the process dies
    before 4 is done. The next replays the expiry before its own batch 4 (journaling it
    again, as after batch 3) and cuts another batch 4; its own expiry after that 4 must
    not take the first one's place, and the copy must not make it replay twice (its
    updates would be missing the second time)."""
    from streamgnn.router.journal import Journal
    b = lambda n, o: Journal.batch_entry(n, [[0, o, -1, 1]], float(n))  # noqa: E731
    e, f = (Journal.expired_entry(4, [(0, o, -1)]) for o in (90, 91))
    life, ok, admit, done = {"life": 1}, {"ok": 1}, {"admit": [[0, 20, 24]]}, {"done": 4}
    first = [life, b(4, 4), admit, ok, e]
    before_4 = {**e, "after": 3}  # batch 4 of the first process never finished
    assert Journal.steps([*first, life, before_4, b(4, 5)], after=3) == [before_4]
    second = [life, before_4, b(4, 5), admit, ok, f, done, b(5, 6)]
    assert Journal.steps(first + second, after=3) == [before_4, b(4, 5), f]


def test_a_journal_begun_with_steps_still_to_replay_keeps_them_finished(tmp_path):
    """A checkpoint taken while a replay still has steps left (a stop mid-replay) begins
    the new journal with them: read back, they are still finished steps to replay, and
    nobody died."""
    from streamgnn.router.journal import Journal
    b = lambda n: Journal.batch_entry(n, [[0, n, -1, 1]], float(n))  # noqa: E731
    x = Journal.expired_entry(3, [(0, 9, -1)])
    journal = Journal(tmp_path)
    journal.restart(7, [b(3), x, b(4)], prune_below=7)
    journal.close()
    entries = Journal(tmp_path).entries(7)
    assert Journal.steps(entries, after=2) == [b(3), x, b(4)]
    assert Journal.death(entries) is None


def test_a_death_between_checkpoint_and_journal_restart_resumes_without_stalling(
        tmp_path, monkeypatch):
    """Killed after checkpoint N is complete but before its journal begins: the expiry
    journaled before N (its update predates N's offsets) must not be replayed from N, and
    everything else goes on exactly."""
    from streamgnn.router.journal import Journal
    data, model = setup()
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    broker = MemoryBroker()
    orphan = sg.AddEdge(src=int(data.ids[0]), dst=10**12, event_id="orphan")
    for u in [*events, orphan]:  # the orphan expires after the last batch
        broker.produce(TOPICS.updates, encode(u))

    class Crash(BaseException):
        pass

    restart = Journal.restart

    def dying(self, *args, **kwargs):  # the first checkpoint after the expiry: the last one
        if any("expired" in e for e in self.entries(0)):
            raise Crash
        return restart(self, *args, **kwargs)

    monkeypatch.setattr(Journal, "restart", dying)
    config = ServiceConfig(batch_size=10, arrival_wait_s=0.0, checkpoint_batches=1,
                           topics=TOPICS)
    open_service = opener(broker, snapshot, model, config, tmp_path)
    with pytest.raises(Crash):
        open_service().run(idle_exit_s=0.5)
    monkeypatch.setattr(Journal, "restart", restart)
    service = open_service()
    service.run(idle_exit_s=0.5)
    assert {(d.error, d.source_event_id) for d in letters(broker)} == {
        ("vertex_never_arrived", "orphan")}
    assert_whole(service.engine, data, model)


def test_a_corrupt_shard_file_falls_back_to_the_previous_checkpoint(tmp_path):
    """Two partitions, each writing its own shard file: one bit flipped in the newest
    generation's shard1.npz. Reopening warns, starts from the previous generation, replays
    its journal and the rest of the topic: the same final state, every repeated label
    change the same message."""
    data, model = setup()
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    broker = MemoryBroker()
    for u in events:
        broker.produce(TOPICS.updates, encode(u))
    config = ServiceConfig(batch_size=25, checkpoint_batches=20, topics=TOPICS)
    open_service = opener(broker, snapshot, model, config, tmp_path, partitions=2)
    first = open_service()
    first.run(idle_exit_s=0.5)
    first.close()
    store = Checkpoints(tmp_path)
    newest = store.folder(store.generations()[-1])
    shard = newest / "shard1.npz"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 1
    shard.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="shard1.npz.*does not match"):
        service = open_service()
    assert service.batch_seq < first.batch_seq  # the previous generation
    service.run(idle_exit_s=0.5)
    assert service.batch_seq == first.batch_seq
    assert_whole(service.engine, data, model)
    assert_repeats_identical(broker)


def _state(engine) -> dict[str, np.ndarray]:
    """Every array a checkpoint of ``engine`` holds, copied."""
    shards = {f"shard{p}": s.arrays(with_graph=engine.directory is not None)
              for p, s in enumerate(engine.shards)}
    files = {"engine": engine._head(), **shards}
    return {f"{f}/{k}": np.array(v) for f, arrays in files.items() for k, v in arrays.items()}


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_checkpoint_written_in_the_background_holds_the_state_of_its_batch(
        tmp_path, partitions):
    """A checkpoint taken after batch 5 is written by a forked child while the loop applies
    the rest: its files hold the state after batch 5 exactly, not a later one, and
    reopening from it replays the rest to the same final state."""
    data, model = setup()
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    broker = MemoryBroker()
    for u in events:
        broker.produce(TOPICS.updates, encode(u))
    config = ServiceConfig(batch_size=10, checkpoint_batches=10**6, checkpoint_s=1e6,
                           topics=TOPICS)
    open_service = opener(broker, snapshot, model, config, tmp_path, partitions)
    service = open_service()
    taken: dict = {}

    def on_batch(report) -> None:
        if report.seq == 5:
            service.checkpoint(wait=False)
            taken.update(generation=service._writing.generation, forked=service._writing._pid,
                         state=_state(service.engine))

    service.run(idle_exit_s=0.5, on_batch=on_batch)
    service.close()
    assert taken["forked"] is not None and service.stats.checkpoints_failed == 0
    saved = Checkpoints(tmp_path)._load(taken["generation"])
    assert saved.meta["batch_seq"] == 5
    written = {f"{f}/{k}": v for f, arrays in saved.files.items() if f != "model"
               for k, v in arrays.items()}
    assert written.keys() == taken["state"].keys()
    for key, rows in taken["state"].items():
        np.testing.assert_array_equal(written[key], rows, err_msg=key)
    later = _state(service.engine)
    assert any(not np.array_equal(later[k], v) for k, v in taken["state"].items()
               if k in later and later[k].shape == v.shape)  # the loop went on meanwhile
    store = Checkpoints(tmp_path)
    for newer in store.generations():
        if newer > taken["generation"]:
            (store.folder(newer) / "manifest.json").unlink()
    with pytest.warns(UserWarning, match="incomplete"):
        again = open_service()
    assert again.batch_seq == 5
    again.run(idle_exit_s=0.5)
    assert again.batch_seq == service.batch_seq
    assert_exact(again.engine, model)


def test_a_failed_background_checkpoint_is_counted_and_a_restart_replays_past_it(
        tmp_path, monkeypatch):
    """Every checkpoint a forked child writes fails, then the process dies: each failure is
    counted, and a restart from the start-up checkpoint replays the journals of the
    failed generations too: the same final state, every repeated label change the same
    message."""
    import os

    data, model = setup()
    snapshot, events = sg.datasets.split_stream(data, 0.2, 0)
    broker = MemoryBroker()
    for u in events:
        broker.produce(TOPICS.updates, encode(u))
    parent = os.getpid()
    write = service_module.write_arrays

    def failing_in_the_child(folder, name, arrays):
        if os.getpid() != parent:
            raise OSError("disk full")
        return write(folder, name, arrays)

    class Crash(BaseException):
        pass

    monkeypatch.setattr(service_module, "write_arrays", failing_in_the_child)
    config = ServiceConfig(batch_size=10, checkpoint_batches=10**6, checkpoint_s=1e6,
                           topics=TOPICS)
    open_service = opener(broker, snapshot, model, config, tmp_path)
    first = open_service()

    def dying(report) -> None:
        if report.seq in (3, 6, 9):  # skipped where the one before is still being written
            first.checkpoint(wait=False)
        if report.seq == 12:
            raise Crash

    with pytest.raises(Crash):
        first.run(idle_exit_s=0.5, on_batch=dying)
    first.close()
    store = Checkpoints(tmp_path)
    complete = [g for g in store.generations() if (store.folder(g) / "manifest.json").exists()]
    assert complete == [1]  # the start-up checkpoint, written in place
    assert first.stats.checkpoints_failed == len(store.generations()) - 1 >= 1
    monkeypatch.setattr(service_module, "write_arrays", write)
    with pytest.warns(UserWarning, match="incomplete"):
        service = open_service()
    assert service.batch_seq == 0
    service.run(idle_exit_s=0.5)
    assert_whole(service.engine, data, model)
    assert_repeats_identical(broker)


def test_a_replay_from_a_checkpoint_between_refreshes_places_every_vertex_alike(
        tmp_path, monkeypatch):
    """The high in-degree set refreshed every 40 updates (RIPPLE++ places a new vertex with
    the owner of the high in-degree vertex its first edge goes into): killed 20 batches
    after a checkpoint taken while a set asked for was not yet in place, the service
    replays those batches one at a time and gives every vertex the owner it had with two
    batches in flight."""
    from streamgnn.graph import directory as directory_module

    monkeypatch.setattr(directory_module, "HIGH_EVERY", 40)
    data, model = setup()
    broker = MemoryBroker()
    for batch in growing_stream(0, data, 30):  # new vertices into a rising high set
        for u in batch:
            broker.produce(TOPICS.updates, encode(u))
    config = ServiceConfig(batch_size=10, checkpoint_batches=10**6, checkpoint_s=1e6,
                           topics=TOPICS)
    open_service = opener(broker, data, model, config, tmp_path, partitions=2)

    class Crash(BaseException):
        pass

    taken: dict = {}

    def owners(service: Service) -> dict[int, int]:
        ids = service.engine.vertex_ids()
        return dict(zip(ids.tolist(), service.engine.partition_of(ids).tolist()))

    def dying(report) -> None:
        directory = first.engine.directory
        if not taken and directory._asked is not None:
            first.checkpoint()  # between the set's asking and its use (the batch in
            taken.update(seq=first.batch_seq, high=directory.ext[directory.high])  # flight
        elif taken and report.seq == taken["seq"] + 20:  # done too)
            taken.update(owners=owners(first), high_then=directory.ext[directory.high])
            raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(LocalWorkers, "max_in_flight", 2)
        first = open_service()
        with pytest.raises(Crash):
            first.run(idle_exit_s=0.5, on_batch=dying)
        first.close()
    assert not np.array_equal(taken["high"], taken["high_then"])  # refreshed meanwhile
    service = open_service()
    assert service.batch_seq == taken["seq"] and service.engine.directory._asked is not None

    def replayed(report) -> None:
        if report.seq == taken["seq"] + 20:  # (the first run had the next batch in flight)
            got = owners(service)
            assert len(got) > len(data.ids) + 50
            assert got == {v: taken["owners"][v] for v in got}
            raise Crash

    with pytest.raises(Crash):
        service.run(idle_exit_s=0.5, on_batch=replayed)
