"""MPI workers: rank 0 runs the `Engine` (the coordinator: the vertex directory, the
vertex questions of a batch, placement and routing) with `MpiWorkers`; ranks 1..N each
run one `Shard` (`run_worker`). Every rank builds the same model itself (SPMD: from the
same model file), so nothing but arrays crosses the wire.

Rank 0 drives the workers with commands: a header scattered (the command and the size of
the worker's payload, two int64s), then each payload that is not empty sent to its worker,
and one reply per worker gathered, each a message of plain arrays
(`streamgnn.npz.to_bytes`: no pickles), but for a batch's reply: a row of int64s
(`_result_message`: its counts and label changes), so a worker the batch left idle replies
with a few numbers and rank 0 reads them without decoding a layout. A batch's payload for a
partition it does not touch is empty (`_routed_arrays`: its worker receives the header
alone), and the worker drives its shard through the supersteps on one `Routed` of nothing,
made once (it still takes part in every exchange: its peers' ghost rows may come). A
batch's replies are gathered when the engine collects it (`Engine.collect`), so rank 0
reads its next batch while the workers compute; it may even send that batch before it
gathers the replies to the one before (two batches outstanding at most), so the workers go
from one to the next without waiting for rank 0; the high in-degree set asked for after a
batch (``HIGH_IN_DEGREE``: the mean in-degree summed over the workers) goes behind it, its
answer gathered with that batch's replies. Commands therefore go out nonblocking
(``Iscatter``, ``Isend``: rank 0 does not wait for workers still busy with the command
before) and replies come back on a communicator of their own. The partitions of a bootstrap
or a load go one worker at a time instead (``Send``, array by array, each received into an
allocation of its own that the shard adopts), each built just before it is sent and dropped
after, so rank 0 never holds more than one (a products-like graph's four add up to several
GB). A bootstrap from partition files (``BOOTSTRAP_FILES``) sends the workers the
folder's name alone: each reads its own file there (`bootstrap_from_file`). Counts and
offsets are 64-bit, so mpi4py uses MPI-4's large-count calls where a transfer passes
2 GiB. During a batch the workers exchange ghost rows among themselves
(`alltoallv`: a nonblocking send per peer) of the same packed buffers `Shard.run` builds in
one process, and a worker takes each buffer it receives as it arrives (`Arrivals`). A
worker that fails aborts the whole job (``MPI_Abort``), so nothing hangs; `serve`
restarts it from its last checkpoint.

Checkpoints: each worker writes and reads its own shard file (``shard<p>.npz``) in its copy
of the generation folder rank 0 names (under its own state directory, `run_worker`'s
``copies``: another host's disk, or the same folder on one filesystem); rank 0 writes the
rest and the manifest. Rank 0's `Checkpoints` asks the workers (`MpiWorkers` is its
`Copies`) to check their files against the manifest's entries, and to move aside or drop
their copies of a generation; a worker reads the model's weights from rank 0 with its
shard, not from rank 0's files.

With `supervisor` (which launches and supervises the job), the only module that imports
mpi4py; must not import kafka.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from streamgnn import errors
from streamgnn.allocator import freed_memory_returned
from streamgnn.errors import InvalidUpdateError
from streamgnn.extras import needs
from streamgnn.models import decompose
from streamgnn.npz import from_bytes, plain, prefixed, read_arrays, to_bytes, under, write_arrays
from streamgnn.updates import UpdateBatch
from streamgnn.workers.batch import ApplyResult
from streamgnn.workers.bootstrap_files import bootstrap_from_file
from streamgnn.workers.labels import ChangedLabels
from streamgnn.workers.local import above_mean, owned_and_in_edges
from streamgnn.workers.placement import Routed
from streamgnn.workers.shard import Shard

with needs("MPI workers (serve --workers)"):
    from mpi4py import MPI

if TYPE_CHECKING:
    from streamgnn.router.checkpoint import Checkpoints

(LOAD, BOOTSTRAP, APPLY, ROWS, PARTIALS, ARRAYS, SUMMARIES, WRITE, READ, STOP, VERIFY,
 MOVE_ASIDE, DROP, CHECK, EDGES, NEIGHBORS, BOOTSTRAP_FILES, HIGH_IN_DEGREE) = range(18)
ONE_AT_A_TIME = (LOAD, BOOTSTRAP)  # commands whose payloads are sent to one worker at a time
NEW_SHARD = (LOAD, BOOTSTRAP, READ, BOOTSTRAP_FILES)  # commands that replace a worker's shard
T = TypeVar("T")
NOTHING = np.zeros(0, np.uint8)  # an empty message


def _json(value) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), np.uint8)


def _unjson(array: np.ndarray):
    return json.loads(array.tobytes())


class MpiWorkers:
    """Rank 0's handle on the worker ranks (`Workers`)."""

    max_in_flight = 2  # batches rank 0 may send before it gathers the first one's replies
    held = False  # `Workers.held`: rows and partials come over the wire

    def __init__(self, comm: MPI.Comm | None = None) -> None:
        self.comm = comm or MPI.COMM_WORLD
        if self.comm.Get_rank() != 0:
            raise RuntimeError("MpiWorkers runs on rank 0; the other ranks run run_worker")
        self.size = self.comm.Get_size() - 1
        if self.size < 1:
            raise RuntimeError("no worker ranks: start with mpiexec -n N+1 (N workers)")
        self.comm.Split(MPI.UNDEFINED, 0)  # the workers' own communicator (collective)
        self.replies = self.comm.Dup()  # replies, apart from the commands (collective)
        self.shards = None  # not in this process
        self._sending: list[tuple[MPI.Request, object]] = []  # requests, buffers kept alive
        self._outstanding = 0  # commands sent whose replies were not gathered yet
        self._asked = 0  # of which HIGH_IN_DEGREE, sent behind batches in flight

    def load(self, shard: Callable[[int], dict[str, np.ndarray]]) -> None:
        self._call(LOAD, (shard(p) for p in range(self.size)))

    def bootstrap(self, cut: Callable[[int], dict[str, np.ndarray]], recompute: bool
                  ) -> None:
        self._call(BOOTSTRAP, ({**cut(p), "recompute": np.array(recompute)}
                               for p in range(self.size)))

    def bootstrap_files(self, folder: Path, recompute: bool) -> None:
        at = {"folder": _json(str(Path(folder).absolute())), "recompute": np.array(recompute)}
        self._call(BOOTSTRAP_FILES, [at] * self.size)

    def submit(self, routed: list[Routed]) -> Callable[[], list[ApplyResult]]:
        self._send(APPLY, [_routed_arrays(r) for r in routed])
        return lambda: [_result(message) for message in self._replies()]

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        replies = self._call(EDGES, [{}] * self.size)
        return tuple(np.concatenate([r[k] for r in replies]) for k in ("src", "dst", "w"))

    def check(self, routed: list[Routed]) -> list[InvalidUpdateError | None]:
        replies = self._call(CHECK, [_routed_arrays(r) for r in routed])
        return [_error(_unjson(r["error"])) if r else None for r in replies]

    def neighbors(self, asked: list[np.ndarray], out: bool, edges: bool
                  ) -> list[dict[str, np.ndarray]]:
        return self._call(NEIGHBORS, [{"ids": ids, "flags": np.array([out, edges])}
                                      for ids in asked])

    def high_in_degree(self, factor: float) -> Callable[[], np.ndarray]:
        """Sent now, behind the batches in flight; its answer is the next reply after
        theirs."""
        self._send(HIGH_IN_DEGREE, [{"factor": np.array(factor)}] * self.size)
        self._asked += 1

        def answer() -> np.ndarray:
            replies = [from_bytes(message) for message in self._replies()]
            self._asked -= 1
            return np.concatenate([r["ids"] for r in replies])
        return answer

    def rows(self, owner: np.ndarray, ids: np.ndarray, layer: int) -> np.ndarray:
        replies = self._call(ROWS, [{"ids": ids[owner == p], "layer": np.array(layer)}
                                    for p in range(self.size)])
        first = replies[0]["rows"]
        out = np.empty((len(ids), first.shape[1]), first.dtype)
        for p, reply in enumerate(replies):
            out[owner == p] = reply["rows"]
        return out

    def partials(self, requests: list[dict | None]) -> list[np.ndarray | None]:
        replies = self._call(PARTIALS, [_partials_arrays(r) for r in requests])
        return [None if r is None else reply["state"]
                for r, reply in zip(requests, replies, strict=True)]

    def arrays(self, with_graph: bool) -> list[dict[str, np.ndarray]]:
        return self._call(ARRAYS, [{"with_graph": np.array(with_graph)}] * self.size)

    def summaries(self) -> list[dict]:
        return [_unjson(r["summary"]) for r in self._call(SUMMARIES, [{}] * self.size)]

    def write(self, folder: Path, with_graph: bool) -> list[dict]:
        at = {"folder": _json(str(folder)), "with_graph": np.array(with_graph)}
        return [_unjson(r["entry"]) for r in self._call(WRITE, [at] * self.size)]

    def read(self, folder: Path, weights: dict[str, np.ndarray]) -> None:
        at = {"folder": _json(str(folder)), **prefixed("weights/", weights)}
        self._call(READ, [at] * self.size)

    # ------------------------------------------ rank 0's `Checkpoints`' `Copies`
    def owns(self, name: str) -> bool:
        """Files ``shard<p>`` are the workers' (worker p's)."""
        return name.startswith("shard") and name.removeprefix("shard").isdigit()

    def verify(self, generation: int, entries: list[dict]) -> list[str]:
        """Each worker checks its own file's entry (a file of a partition no worker holds
        is left to the engine, which refuses a state of another partition count)."""
        replies = self._call(VERIFY, [
            {"generation": np.array(generation),
             "entries": _json([e for e in entries if e["name"] == f"shard{p}"])}
            for p in range(self.size)])
        return [f"rank {p + 1}: {reason}" for p, reply in enumerate(replies)
                for reason in _unjson(reply["reasons"])]

    def move_aside(self, generation: int) -> None:
        self._call(MOVE_ASIDE, [{"generation": np.array(generation)}] * self.size)

    def drop_before(self, generation: int, kept: list[int]) -> None:
        at = {"generation": np.array(generation), "kept": np.array(kept, np.int64)}
        self._call(DROP, [at] * self.size)

    def stop(self) -> None:
        self._let_go()
        self._send(STOP, [{}] * self.size)
        self._complete()

    def _call(self, command: int, payloads: Iterable[dict[str, np.ndarray]]
              ) -> list[dict[str, np.ndarray]]:
        self._send(command, payloads)
        return [from_bytes(message) for message in self._replies()]

    def _send(self, command: int, payloads: Iterable[dict[str, np.ndarray]]) -> None:
        """The command and each worker's payload: the workers start on it as soon as
        they are done with the one before, which may still await its `_replies`."""
        if command in NEW_SHARD or command == VERIFY:  # (a recovery starts with these)
            self._let_go()
        elif command != HIGH_IN_DEGREE and (  # that one goes behind whatever is in flight
                self._outstanding - self._asked >= self.max_in_flight if command == APPLY
                else self._outstanding > 0):
            raise RuntimeError(f"{self._outstanding} commands await their replies: "
                               "gather them first")
        if command in ONE_AT_A_TIME:  # the shards, one worker at a time, built as sent
            self._sending.append(self._command(command, [NOTHING] * self.size))
            self._complete()
            for rank, payload in enumerate(payloads, start=1):
                _send(self.comm, payload, rank)
        else:
            messages = [to_bytes(p) for p in payloads]
            self._sending += [self._command(command, messages),
                              *((self.comm.Isend([m, MPI.BYTE], dest=rank), m)
                                for rank, m in enumerate(messages, start=1) if len(m))]
        self._outstanding += 1

    def _command(self, command: int, messages: list[np.ndarray]
                 ) -> tuple[MPI.Request, object]:
        """Start scattering each worker its header: ``command`` and the bytes of its
        message in ``messages`` (sent apart, and only where not empty); the request, with
        the buffers it must keep alive until done."""
        header = np.array([[command, 0]] + [[command, len(m)] for m in messages], np.int64)
        mine = np.empty(2, np.int64)
        return self.comm.Iscatter(header, mine, root=0), (header, mine)

    def _replies(self) -> list[np.ndarray]:
        """Every worker's reply message to the oldest command outstanding, once they are
        all done with it; then the command after it, if sent, has reached them too."""
        replies = _gather(self.replies, NOTHING)[1:]
        self._outstanding -= 1
        self._complete()
        return replies

    def _complete(self) -> None:
        """Wait until the commands sent have reached every worker (their buffers may go)."""
        MPI.Request.Waitall([request for request, _ in self._sending])
        self._sending = []

    def _let_go(self) -> None:
        """Gather and drop the replies still outstanding (batches a failed engine left in
        flight), so the next command's replies are its own: before the shards are
        replaced (a recovery verifies and reads them from a checkpoint) or the workers
        stop."""
        while self._outstanding:
            self._replies()
        self._asked = 0


ABORT_GRACE_S = 1.0  # seconds a failing rank waits before aborting the job


def run_worker(model: torch.nn.Module, comm: MPI.Comm | None = None,
               device: str = "cpu", copies: Checkpoints | None = None) -> None:
    """A worker rank's loop: hold one shard and do what rank 0 asks until it says stop.
    ``copies``: this rank's state directory, where it keeps its copy of each checkpoint
    generation (None: it writes and reads the folders rank 0 names, as named, and keeps
    no copies of its own). Any failure aborts the job (every rank stops at once) after
    printing its traceback."""
    comm = comm or MPI.COMM_WORLD
    try:
        _serve(model, comm, device, copies)
    except Exception:
        sys.stderr.write(f"streamgnn worker rank {comm.Get_rank()} failed:\n"
                         f"{traceback.format_exc()}")
        sys.stderr.flush()
        # mpiexec forwards a rank's output asynchronously and Abort kills its forwarders:
        # under load the traceback was lost (1 run in ~10); give them a moment first
        time.sleep(ABORT_GRACE_S)
        comm.Abort(1)


def spmd(model: torch.nn.Module, main: Callable[[MpiWorkers], T],
         comm: MPI.Comm | None = None) -> T | None:
    """Run ``main`` on rank 0 with the other ranks as its workers (stopped after it);
    returns what ``main`` returns on rank 0, None on the workers."""
    comm = comm or MPI.COMM_WORLD
    if comm.Get_rank() != 0:
        run_worker(model, comm)
        return None
    workers = MpiWorkers(comm)
    try:
        return main(workers)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)
        raise
    finally:
        workers.stop()


def worker_device(device: str, workers: MPI.Comm) -> str:
    """The device a worker computes on. ``cuda`` without an index, on a host with several
    GPUs, is ``cuda:k`` for the worker's place k among the ``workers`` on its host (modulo
    the GPUs it sees), so P workers on a host with P GPUs use one each; where a launcher
    gives each rank a GPU of its own (``CUDA_VISIBLE_DEVICES``), the one it sees. Collective
    over ``workers``."""
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    local = workers.Split_type(MPI.COMM_TYPE_SHARED)
    place = local.Get_rank()
    local.Free()
    return f"cuda:{place % gpus}" if gpus > 1 else device


@torch.inference_mode()
def _serve(model: torch.nn.Module, comm: MPI.Comm, device: str,
           copies: Checkpoints | None) -> None:
    peers = comm.Split(1, comm.Get_rank())
    device = worker_device(device, peers)
    model = model.to(device)
    layers = decompose(model)
    dtype = next(model.parameters()).dtype
    replies = comm.Dup()
    shard: Shard | None = None
    header = np.zeros(2, np.int64)
    while True:
        comm.Iscatter(None, header, root=0).Wait()  # (`MpiWorkers._command`)
        command, size = header.tolist()
        if command not in NEW_SHARD:
            message = _message(comm, size)
            if command == STOP:
                return
            reply = _execute(command, message, shard, peers, copies)
        else:
            shard = None  # replaced: never hold the old and the new one at once
            with freed_memory_returned():  # a partition's message and copies: GBs
                payload = (_receive(comm) if command in ONE_AT_A_TIME
                           else from_bytes(_message(comm, size)))
                if command == READ:  # the state's model (this rank's model file may differ)
                    model.load_state_dict({k: torch.from_numpy(a) for k, a in
                                           under(payload, "weights/").items()})
                    layers = decompose(model)
                shard = _new_shard(command, payload, layers, device, dtype, peers, copies)
                payload = None
            reply = NOTHING
        _gather(replies, reply)
        reply = message = None  # not held while the next command is awaited (ARRAYS: GBs)


def _new_shard(command: int, payload: dict[str, np.ndarray], layers: list, device: str,
               dtype: torch.dtype, peers: MPI.Comm, copies: Checkpoints | None) -> Shard:
    """The shard a LOAD, BOOTSTRAP, BOOTSTRAP_FILES (from this rank's partition file in
    the folder named, as named) or READ command makes."""
    me, partitions = peers.Get_rank(), peers.Get_size()
    if command == LOAD:
        return Shard.from_arrays(layers, payload, torch.device(device), dtype)
    if command == BOOTSTRAP:
        recompute = bool(payload.pop("recompute"))
        return _drive(Shard.bootstrap(layers, payload, torch.device(device), dtype,
                                      recompute, me, partitions), peers)
    if command == BOOTSTRAP_FILES:
        return _drive(bootstrap_from_file(layers, Path(_unjson(payload["folder"])),
                                          torch.device(device), dtype,
                                          bool(payload["recompute"]), me, partitions), peers)
    arrays = read_arrays(_folder(payload, copies) / f"shard{me}.npz")
    return Shard.from_arrays(layers, arrays, torch.device(device), dtype)


def _folder(payload: dict[str, np.ndarray], copies: Checkpoints | None) -> Path:
    """This rank's copy of the checkpoint folder a WRITE or READ names: the folder of that
    name in its own state directory, or where it keeps none, the folder as named."""
    folder = Path(_unjson(payload["folder"]))
    return folder if copies is None else copies.directory / folder.name


def _execute(command: int, message: np.ndarray, shard: Shard, peers: MPI.Comm,
             copies: Checkpoints | None) -> np.ndarray:
    """The reply message to a command on the worker's shard (or its copies of the
    checkpoints), ``message`` its payload."""
    if command == APPLY:
        program = shard.run_routed(_routed(message), peers.Get_rank(), peers.Get_size())
        return _result_message(_drive(program, peers))
    if command == CHECK:
        error = shard.graph.check(_routed(message).batch, ghosts=True)
        return to_bytes({} if error is None else {"error": _json(_error_item(error))})
    return to_bytes(_answer(command, from_bytes(message), shard, peers, copies))


def _answer(command: int, payload: dict[str, np.ndarray], shard: Shard, peers: MPI.Comm,
            copies: Checkpoints | None) -> dict[str, np.ndarray]:
    """What a command other than a batch replies, as arrays."""
    me = peers.Get_rank()
    if command == EDGES:
        src, dst, w = shard.graph.edges()
        return {"src": src, "dst": dst, "w": w}
    if command == NEIGHBORS:
        out, edges = payload["flags"].tolist()
        return shard.neighbors(payload["ids"], out, edges)
    if command == HIGH_IN_DEGREE:  # the mean over every worker's partition
        totals = peers.allreduce(owned_and_in_edges(shard))
        return {"ids": above_mean(shard, float(payload["factor"]), totals)}
    if command == ROWS:
        ids, layer = payload["ids"], int(payload["layer"])
        return {"rows": shard.rows(shard.graph.slots(ids), layer)}
    if command == PARTIALS:
        return {} if not payload else {"state": shard.partials(**_partials(payload))}
    if command == ARRAYS:
        return shard.arrays(bool(payload["with_graph"]))
    if command == SUMMARIES:
        return {"summary": _json(shard.summary())}
    if command == WRITE:
        folder = _folder(payload, copies)
        folder.mkdir(parents=True, exist_ok=True)  # (rank 0 made its own copy)
        entry = write_arrays(folder, f"shard{me}", shard.arrays(bool(payload["with_graph"])))
        return {"entry": _json(entry)}
    if command in (VERIFY, MOVE_ASIDE, DROP):
        if copies is None:
            raise ValueError("rank 0 asked about this worker's checkpoint copies: it keeps "
                             "none (run_worker without copies)")
        generation = int(payload["generation"])
        if command == VERIFY:
            return {"reasons": _json(copies.check(generation, _unjson(payload["entries"])))}
        if command == MOVE_ASIDE:
            copies.move_aside(generation)
        else:
            copies.drop_before(generation, payload["kept"].tolist())
        return {}
    raise ValueError(f"unknown command {command}")


def _drive(program, peers: MPI.Comm):
    """Run one shard's BSP program, exchanging with the other workers at each barrier;
    what it returns. Every buffer of an exchange is in and every send done before the
    next exchange begins."""
    try:
        outgoing = next(program)
        while True:
            with alltoallv(peers, outgoing) as incoming:
                del outgoing  # (held by the sends until they are done)
                outgoing = program.send(incoming)
    except StopIteration as done:
        return done.value


class Arrivals(Sequence[np.ndarray]):
    """The buffers `alltoallv` receives, handed over as they arrive (`exchange.Arriving`):
    item q waits for rank q's buffer; `as_they_arrive` yields each as its receive completes
    (``Waitany``), so a program takes one while the others travel. Holds the buffers it
    sends until those sends are done. As a context, it waits on leaving for every buffer
    and send still in flight."""

    def __init__(self, buffers: list[np.ndarray], requests: list[MPI.Request],
                 positions: list[int], sent: list[np.ndarray]) -> None:
        self._buffers = buffers
        self._requests = requests  # receives and sends in flight
        self._positions = positions  # the rank each request receives from (-1: a send)
        self._sent = sent
        self.waited = 0.0  # seconds spent waiting (`_complete_one`, `finish`)
        self._arrived = [True] * len(buffers)
        for q in positions:
            if q >= 0:
                self._arrived[q] = False

    def __len__(self) -> int:
        return len(self._buffers)

    def __getitem__(self, q: int) -> np.ndarray:
        while not self._arrived[q]:
            self._complete_one()
        return self._buffers[q]

    def sizes(self) -> list[int]:
        return [len(buffer) for buffer in self._buffers]

    def as_they_arrive(self) -> Iterator[tuple[int, np.ndarray]]:
        yielded = [False] * len(self._buffers)
        while not all(yielded):
            for q, arrived in enumerate(self._arrived):
                if arrived and not yielded[q]:
                    yielded[q] = True
                    yield q, self._buffers[q]
            if not all(yielded):
                self._complete_one()
        self.finish()

    def finish(self) -> None:
        """Wait for every receive and send still in flight; let the sent buffers go."""
        start = time.perf_counter()
        MPI.Request.Waitall(self._requests)
        self.waited += time.perf_counter() - start
        self._arrived = [True] * len(self._buffers)
        self._requests, self._positions, self._sent = [], [], []

    def _complete_one(self) -> None:
        """Wait until one more receive or send completes."""
        start = time.perf_counter()
        i = MPI.Request.Waitany(self._requests)
        self.waited += time.perf_counter() - start
        q = self._positions[i]
        del self._requests[i], self._positions[i]
        if q >= 0:
            self._arrived[q] = True
        if not self._requests:
            self._sent = []

    def __enter__(self) -> Arrivals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


def alltoallv(comm: MPI.Comm, outgoing: list[np.ndarray]) -> Arrivals:
    """Send ``outgoing[q]`` to rank q of ``comm``; what every rank sent this one, as it
    arrives (`Arrivals`). Each buffer goes to its rank as it lies, point to point: no send
    buffer joins them (a bootstrap's first ghost rows are ~0.5 GB a worker on
    products-like, and joined they were each worker's peak). The buffers received share one
    allocation, each starting at a multiple of 64 bytes in it (kernels read their ids and
    rows as they lie); where none is sent either way, they are empty arrays."""
    me = comm.Get_rank()
    send_counts = np.array([len(b) for b in outgoing], np.int64)
    recv_counts = np.empty(len(outgoing), np.int64)
    comm.Alltoall(send_counts, recv_counts)
    if not (recv_counts.any() or send_counts.any()):
        return Arrivals([NOTHING] * len(outgoing), [], [], [])
    padded = recv_counts + -recv_counts % 64
    recv = np.empty(int(padded.sum()), np.uint8)
    starts = (np.cumsum(padded) - padded).tolist()
    incoming = [recv[start:start + count] for start, count in zip(starts, recv_counts.tolist(),
                                                                    strict=True)]
    incoming[me][:] = outgoing[me]
    senders = [q for q in range(len(outgoing)) if q != me and recv_counts[q]]
    sent = [np.ascontiguousarray(outgoing[q]) if q != me and send_counts[q] else NOTHING
            for q in range(len(outgoing))]
    requests = [comm.Irecv([incoming[q], MPI.BYTE], source=q) for q in senders]
    requests += [comm.Isend([sent[q], MPI.BYTE], dest=q)
                 for q in range(len(outgoing)) if len(sent[q])]
    return Arrivals(incoming, requests, senders + [-1] * (len(requests) - len(senders)), sent)


def _send(comm: MPI.Comm, arrays: dict[str, np.ndarray], rank: int) -> None:
    """Rank 0 sends ``arrays`` to ``rank`` alone (`_receive` there): their layout, then
    each array as it lies in memory (no message packed, nothing copied)."""
    arrays = {name: np.asarray(a, order="C") for name, a in arrays.items()}
    for name, a in arrays.items():
        plain(a.dtype, name)
    layout = _json([[name, a.dtype.str, a.shape] for name, a in arrays.items()])
    comm.Send(np.array([len(layout)], np.int64), dest=rank)
    comm.Send([layout, MPI.BYTE], dest=rank)
    for a in arrays.values():
        comm.Send([a.reshape(-1).view(np.uint8), MPI.BYTE], dest=rank)


def _receive(comm: MPI.Comm) -> dict[str, np.ndarray]:
    """The arrays rank 0 `_send` this rank, each received into an allocation of its own:
    a shard adopts them, and one small array kept must not keep a GB message alive."""
    count = np.zeros(1, np.int64)
    comm.Recv(count, source=0)
    layout = np.empty(int(count[0]), np.uint8)
    comm.Recv([layout, MPI.BYTE], source=0)
    out = {}
    for name, dtype, shape in _unjson(layout):
        plain(np.dtype(dtype), name)
        out[name] = np.empty(shape, dtype)
        comm.Recv([out[name].reshape(-1).view(np.uint8), MPI.BYTE], source=0)
    return out


def _message(comm: MPI.Comm, size: int) -> np.ndarray:
    """The ``size`` bytes of the message rank 0 sent this rank with a command's header
    (none sent for an empty one)."""
    if not size:
        return NOTHING
    out = np.empty(size, np.uint8)
    comm.Recv([out, MPI.BYTE], source=0)
    return out


def _gather(comm: MPI.Comm, mine: np.ndarray) -> list[np.ndarray]:
    """Every rank sends ``mine`` to rank 0, which gets them all (others get [])."""
    counts = np.zeros(comm.Get_size(), np.int64) if comm.Get_rank() == 0 else None
    comm.Gather(np.array([len(mine)], np.int64), counts, root=0)
    if comm.Get_rank() != 0:
        comm.Gatherv(mine, None, root=0)
        return []
    out = np.empty(int(counts.sum()), np.uint8)
    comm.Gatherv(mine, [out, (counts, _displacements(counts)), MPI.BYTE], root=0)
    return np.split(out, np.cumsum(counts)[:-1])


def _displacements(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


# ---------------------------------------------------------------- payloads as arrays
_ROUTED_IDS = [f.name for f in dataclasses.fields(Routed)[1:]]  # Routed's arrays of ids


def _routed_arrays(r: Routed) -> dict[str, np.ndarray]:
    """A partition's part of a batch as arrays: none where the batch does not touch it."""
    if not (len(r.batch) or any(len(getattr(r, name)) for name in _ROUTED_IDS)):
        return {}
    b = r.batch
    return {"op": b.op, "src": b.src, "dst": b.dst, "w": b.w, "xrow": b.xrow, "x": b.x,
            **{name: getattr(r, name) for name in _ROUTED_IDS}}


def _untouched() -> Routed:
    """A partition's part of a batch that does not touch it: arrays of nothing."""
    none = np.zeros(0, np.int64)
    return Routed(UpdateBatch.unchecked(none.astype(np.int8), none, none,
                                        np.zeros(0, np.float32), none,
                                        np.zeros((0, 0), np.float32)),
                  *[none] * len(_ROUTED_IDS))


UNTOUCHED = _untouched()  # one for every batch (empty arrays: nothing in them to change)


def _routed(message: np.ndarray) -> Routed:
    """`_routed_arrays` undone, from its message: the coordinator's split, taken as it was
    sent (its graph checked the batch; the columns keep their dtypes on the wire)."""
    if not len(message):
        return UNTOUCHED
    a = from_bytes(message)
    return Routed(UpdateBatch.unchecked(a["op"], a["src"], a["dst"], a["w"], a["xrow"], a["x"]),
                  *(a[name] for name in _ROUTED_IDS))


def _partials_arrays(r: dict | None) -> dict[str, np.ndarray]:
    if r is None:
        return {}
    return {k: np.asarray(v) for k, v in r.items() if v is not None}


def _partials(a: dict[str, np.ndarray]) -> dict:
    return {"hop": int(a["hop"]), "src": a["src"], "dst": a["dst"], "w": a["w"],
            "num": int(a["num"]), "dst_part": a.get("dst_part")}


_COUNTS = ("recomputed", "pulled", "pulled_columns", "remote_reads", "combined_messages")
_NO_IDS = np.zeros(0, np.int64)
_NO_BYTES = np.zeros(0, np.uint8)


def _error_item(error: InvalidUpdateError) -> list:
    """A partition's rejection as JSON: its kind, reason and position in the share."""
    return [type(error).__name__, error.reason, error.index]


def _error(item: list) -> InvalidUpdateError:
    """`_error_item` undone."""
    kind, reason, index = item
    return getattr(errors, kind)(reason, index=index)


def _result_message(r: ApplyResult) -> np.ndarray:
    """A shard's `ApplyResult` as its reply: int64s, namely the L layers counted, the
    first layer driven to NaN or inf (0: none), the n label changes, the m ghosts let go
    of, the edges added (net), the bytes b of the rejections, the `_COUNTS` (L each), then
    the changes' ids, old and new labels (n each), the ghosts' ids and owners (m each) and
    the rejections as JSON (b bytes, padded to whole int64s): an idle shard's reply is
    6 + 5 L numbers."""
    changes = r.changed_labels
    released = r.released if r.released is not None else (_NO_IDS, _NO_IDS)
    rejected = _json([_error_item(e) for e in r.rejected]) if r.rejected else _NO_BYTES
    head = [len(r.recomputed), r.non_finite, len(changes.ids), len(released[0]),
            r.edges_added, len(rejected)]
    head += [count for name in _COUNTS for count in getattr(r, name)]
    if not (len(changes.ids) or len(released[0]) or len(rejected)):  # (an idle shard's)
        return np.array(head, np.int64).view(np.uint8)
    padded = np.zeros(-(-len(rejected) // 8) * 8, np.uint8)
    padded[:len(rejected)] = rejected
    return np.concatenate([np.array(head, np.int64), changes.ids, changes.old,
                           changes.new, *released, padded.view(np.int64)]).view(np.uint8)


def _result(message: np.ndarray) -> ApplyResult:
    """`_result_message` undone (the label changes view the message)."""
    row = message.view(np.int64)
    layers, non_finite, n, m, edges_added, b = row[:6].tolist()
    end = 6 + len(_COUNTS) * layers
    counts = row[6:end].reshape(len(_COUNTS), layers).tolist()
    ids, old, new = row[end:end + 3 * n].reshape(3, n)
    end += 3 * n
    released = row[end:end + 2 * m].reshape(2, m)
    rejected = [_error(item) for item in
                (_unjson(row[end + 2 * m:].view(np.uint8)[:b]) if b else [])]
    return ApplyResult(ChangedLabels(ids, old, new), rejected, non_finite=non_finite,
                       released=(released[0], released[1]), edges_added=edges_added,
                       **dict(zip(_COUNTS, counts, strict=True)))

