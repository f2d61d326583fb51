"""`Journal`: what the service decided since its last checkpoint, so a restart repeats it.

Between two checkpoints the service appends, to the journal of the last checkpoint's
generation in its state directory:
- ``{"batch": N, "items": runs, "at": t}`` before batch N is applied (fsync'd: its
  outputs go out only after, with event time ``t``), naming every update in it by source
  (partition, offset, index in the record's array or -1), and ``{"done": N}`` once it is
  applied (steps kept at a checkpoint are written followed by ``{"ok": 1}`` instead): a
  restart replays batch N with exactly these updates, so its label changes are the same
  messages under the same event ids, and the engine ends bit for bit where it would have;
- ``{"expired": runs, "after": N}`` before updates that waited too long for their vertex
  are dead-lettered, N the last batch started: a replay dead-letters the same ones after
  it;
- ``{"admit": [[partition, first, last], ...]}`` before records are decoded and admitted,
  and ``{"ok": 1}`` once they are. While batch N is in flight (MPI workers apply it) the
  next records may be admitted, and batch N+1 started: their entries fall between N's
  entry and its "done";
- ``{"life": 1}`` where a process begins writing (a new journal, or one resumed).
What is still open at the end tells a restart where the previous process died (`Death`):
admitting those records, applying batch N, or both. `Suspects` counts such deaths per
record; the service then handles those records one at a time, and one batch at a time,
and a record that was alone in flight at two deaths is quarantined (dead-lettered
unread), never retried forever.

Each checkpoint starts a new journal file. Everything is small JSON; no pickles. Must not import
torch, kafka or mpi4py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

Key = tuple[int, int, int]  # (partition, offset, index in the record's array or -1)
"""Where an update came from."""


def runs(keys: Iterable[Key]) -> list[list[int]]:
    """``keys`` as [partition, offset, index, count] runs of consecutive items: the same
    record's array items one after another, or whole records at consecutive offsets."""
    out: list[list[int]] = []
    for p, o, i in keys:
        if out:
            rp, ro, ri, rn = last = out[-1]
            if rp == p and ((ri >= 0 and ro == o and i == ri + rn)
                            or (ri < 0 and i < 0 and o == ro + rn)):
                last[3] += 1
                continue
        out.append([p, o, i, 1])
    return out


def step_keys(step: dict) -> list[Key]:
    """The updates a journaled batch or expiry names."""
    return keys(step["items"] if "batch" in step else step["expired"])


def keys(runs_: list[list[int]]) -> list[Key]:
    """The inverse of `runs`."""
    return [(p, o, i + k) if i >= 0 else (p, o + k, -1)
            for p, o, i, n in runs_ for k in range(n)]


@dataclass(frozen=True)
class Death:
    """Where the previous process died: admitting ``records`` ([partition, first, last]
    ranges), or applying batches up to ``batch`` (whose updates came from ``records``), or
    both; ``alone`` is the one record or update in flight, if there was only one."""

    records: list[tuple[int, int, int]]
    batch: int | None = None
    alone: Key | None = None


class Journal:
    """``journal-<generation>.jsonl`` files: each checkpoint generation starts one, and a
    restart from generation g replays the files from g on (a newer generation that did
    not complete left its file after g's)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._file = None

    def exists(self) -> bool:
        """Whether a journal is here: a checkpoint was taken, batches may have followed."""
        return bool(self._files())

    def _files(self) -> list[tuple[int, Path]]:
        return sorted((int(p.stem[8:]), p) for p in self.directory.glob("journal-*.jsonl")
                      if p.stem[8:].isdigit())

    def entries(self, since: int) -> list[dict]:
        """What the journals of generation ``since`` on hold, in order (a torn last line,
        from a kill mid-write, is dropped)."""
        out = []
        for generation, path in self._files():
            if generation < since:
                continue
            for line in path.read_bytes().splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    break
        return out

    def resume(self, generation: int) -> None:
        """Append to the newest journal from ``generation`` on (after a restart from it)."""
        newest = max((g for g, _ in self._files() if g >= generation), default=generation)
        self._open(newest)
        self._append(_LIFE)  # what the dead process left open is not this one's

    def restart(self, generation: int, keep: list[dict], prune_below: int) -> None:
        """Checkpoint ``generation`` is taken (complete, or still being written): begin its
        journal holding only ``keep`` (steps still to be replayed as they were, each
        batch with the "ok" that marks it finished); drop journals older than
        ``prune_below`` (the oldest generation a restart may still start from)."""
        if self._file is not None:
            self._file.close()
        path = self._path(generation)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:  # a kept batch is a finished one: its "ok" goes with it
            f.write(json.dumps(_LIFE).encode() + b"\n")
            f.writelines(json.dumps(e).encode() + (b'\n{"ok": 1}\n' if "batch" in e else b"\n")
                         for e in keep)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        for g, old in self._files():
            if g < prune_below:
                old.unlink()
        self._open(generation)

    def _path(self, generation: int) -> Path:
        return self.directory / f"journal-{generation:06d}.jsonl"

    def _open(self, generation: int) -> None:
        self._file = open(self._path(generation), "ab")  # noqa: SIM115 (held open)

    @staticmethod
    def death(entries: list[dict]) -> Death | None:
        """Where the process that wrote the last of ``entries`` died, if it died
        mid-step: the admit step and the batches it left open (an "ok" closes the open
        admit step, else the batch just journaled; "done" closes the batch it names)."""
        batches: dict[int, dict] = {}  # open, by number
        admit = last = None
        for e in entries:
            if "life" in e:  # a process began here, with nothing open
                batches, admit = {}, None
            elif "batch" in e:
                batches[last := e["batch"]] = e
            elif "admit" in e:
                admit = e
            elif "done" in e:
                batches.pop(e["done"], None)
            elif "ok" in e:
                if admit is not None:
                    admit = None
                else:
                    batches.pop(last, None)
        if not batches and admit is None:
            return None
        records = [tuple(r) for r in admit["admit"]] if admit is not None else []
        named = [k for batch in batches.values() for k in keys(batch["items"])]
        alone = None
        if admit is None and len(named) == 1:
            alone = named[0]
        elif not batches and len(records) == 1 and records[0][1] == records[0][2]:
            alone = (records[0][0], records[0][1], -1)
        records += spans((p, o) for p, o, _ in named)
        return Death(records, max(batches, default=None), alone)

    @staticmethod
    def steps(entries: list[dict], after: int) -> list[dict]:
        """The steps to replay after batch ``after``, in order: every batch that finished
        (its entry followed by ``ok``, or a ``done`` naming it before the next entry of
        that number; a replay journals a batch again, and the last copy counts) and the
        expiries, each after the batch it names. An update expires once, so a copy of an
        expiry is a replay's and the first counts; one journaled while its batch was in
        flight, a batch that never finished, goes before the batch cut under that number
        next (it is given the last batch before it that finished)."""
        finished: set[int] = set()  # positions of the batch entries that finished
        latest: dict[int, int] = {}  # batch number -> position of its latest entry
        for i, e in enumerate(entries):
            if "batch" in e:
                latest[e["batch"]] = i
                if i + 1 < len(entries) and "ok" in entries[i + 1]:
                    finished.add(i)
            elif "done" in e and e["done"] in latest:
                finished.add(latest[e["done"]])
        steps: dict[tuple[int, int], dict] = {}  # (batch, 0), or (batch before, position)
        expired: set[tuple[tuple[int, ...], ...]] = set()
        latest = {}
        for i, e in enumerate(entries):
            if "batch" in e:
                latest[e["batch"]] = i
                if i in finished:
                    steps[e["batch"], 0] = e
            elif "expired" in e:
                named = tuple(map(tuple, e["expired"]))
                if named in expired:
                    continue
                expired.add(named)
                n = e["after"]
                while n in latest and latest[n] not in finished:
                    n -= 1
                if n != e["after"]:  # replayed, and kept, as such
                    e = {**e, "after": n}
                steps[n, i + 1] = e
        return [steps[k] for k in sorted(steps) if k[0] > after or (k[0] == after and k[1])]

    def batch(self, entry: dict) -> None:
        self._append(entry, sync=True)

    @staticmethod
    def batch_entry(seq: int, items: list[list[int]], at: float) -> dict:
        """Batch ``seq``: its updates (as `runs`), and ``at``, the event time its outputs
        carry."""
        return {"batch": seq, "items": items, "at": at}

    @staticmethod
    def expired_entry(after: int, items: Iterable[Key]) -> dict:
        return {"expired": runs(items), "after": after}

    def expired(self, entry: dict) -> None:
        self._append(entry, sync=True)

    def admitting(self, records: list[tuple[int, int, int]]) -> None:
        self._append({"admit": records})

    def ok(self) -> None:
        self._append({"ok": 1})

    def done(self, seq: int) -> None:
        self._append({"done": seq})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def _append(self, entry: dict, sync: bool = False) -> None:
        self._file.write(json.dumps(entry, separators=(",", ":")).encode() + b"\n")
        self._file.flush()  # survives the process being killed
        if sync:
            os.fsync(self._file.fileno())  # and the machine going down


_LIFE = {"life": 1}
"""The entry a process begins its journal with (a new one, or one it resumes)."""


def spans(points: Iterable[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """[partition, first offset, last offset] of (partition, offset) points."""
    by: dict[int, list[int]] = {}
    for p, o in points:
        by.setdefault(p, []).append(o)
    return [(p, min(o), max(o)) for p, o in sorted(by.items())]


class Suspects:
    """Deaths per input record and update (``suspects.json``): records in flight when a
    process died are handled one update at a time afterwards; a record (key index -1) or
    update alone in flight at ``limit`` deaths is quarantined."""

    def __init__(self, directory: str | Path, limit: int = 2) -> None:
        self.path = Path(directory) / "suspects.json"
        self.limit = limit
        raw = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.ranges: list[tuple[int, int, int]] = [tuple(r) for r in raw.get("ranges", [])]
        self.deaths: dict[Key, int] = {(p, o, i): n for p, o, i, n in raw.get("deaths", [])}

    def died(self, death: Death) -> None:
        """Count a death: its records become suspect, and a lone one's count goes up."""
        if death.alone is not None:
            self.deaths[death.alone] = self.deaths.get(death.alone, 0) + 1
        self.ranges = sorted(set(self.ranges) | set(death.records))
        self._save()

    def suspect(self, partition: int, offset: int) -> bool:
        return any(p == partition and a <= offset <= b for p, a, b in self.ranges)

    def quarantined(self, key: Key) -> int:
        """How many times the process died with this record (index -1) or update alone in
        flight, if that reached the limit; else 0."""
        n = self.deaths.get(key, 0)
        return n if n >= self.limit else 0

    def forget_before(self, positions: dict[int, int]) -> None:
        """Records before ``positions`` (checkpointed past) need no watching."""
        self.ranges = [r for r in self.ranges if r[2] >= positions.get(r[0], 0)]
        self.deaths = {k: n for k, n in self.deaths.items() if k[1] >= positions.get(k[0], 0)}
        self._save()

    def clear(self) -> None:
        self.ranges, self.deaths = [], {}
        self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"ranges": self.ranges, "deaths": [
            [*k, n] for k, n in self.deaths.items()]}))
        os.replace(tmp, self.path)
