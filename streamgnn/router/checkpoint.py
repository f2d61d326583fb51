"""`Checkpoints`: the service's state on disk as data, never pickles: numbered generations
``gen-000012/``, each a set of ``.npz`` array files (loaded with ``allow_pickle=False``) and
a ``manifest.json`` written last, naming every file with its size and SHA-256 beside the
small JSON state. A generation without its manifest, or whose files do not match it (a
process killed mid-write, a torn or altered file), is not complete: loading skips it and
takes the newest complete one. Every file is written to a temporary name, fsync'd and
renamed; the last ``keep`` complete generations are kept.

Files of one generation may come from different processes (`write_arrays`, one shard per
rank; `streamgnn.npz`); `commit` makes the set complete. `write` writes a generation here
or, in the background, from a forked child: the child's memory is a copy-on-write snapshot
of this process at the fork, so the caller's state may change at once while the child
writes it as it was (the way Redis' BGSAVE does). Must not import torch, kafka or mpi4py.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamgnn.npz import read_arrays, sha256

FORMAT = "streamgnn-state/6"  # /6: mean layers keep z alone too; /5: sum layers did
MANIFEST = "manifest.json"


@dataclass
class Saved:
    """A complete generation: its number, folder, JSON state and the array files loaded
    (by name; every file of the generation was checked against the manifest)."""

    generation: int
    folder: Path
    meta: dict
    files: dict[str, dict[str, np.ndarray]]


class CorruptCheckpointError(ValueError):
    """A generation's file does not match its manifest."""


class Writing:
    """A generation `Checkpoints.write` is writing: ``done`` says whether it finished
    (None: still writing), ``wait`` waits for it; both are True once the generation is
    complete, False if the writer failed (it said why on stderr; the generation stays
    incomplete, so loading skips it) or ran past its ``deadline_s`` (then it is killed)."""

    def __init__(self, generation: int, folder: Path, pid: int | None = None,
                 deadline_s: float = 0.0) -> None:
        self.generation = generation
        self._manifest = folder / MANIFEST
        self._pid = pid  # the writing child, until it has been reaped
        self._deadline = time.monotonic() + deadline_s
        self._ok = True

    def done(self) -> bool | None:
        if self._pid is not None and time.monotonic() > self._deadline:
            print(f"checkpoint writer {self._pid} ran past its deadline: killed",
                  file=sys.stderr)
            os.kill(self._pid, signal.SIGKILL)
            self._reap(0)  # killed: not a complete generation unless it had committed
        return self._reap(os.WNOHANG)

    def wait(self) -> bool:
        while (ok := self.done()) is None:
            time.sleep(0.01)
        return ok

    def _reap(self, flags: int) -> bool | None:
        if self._pid is not None:
            try:
                pid, status = os.waitpid(self._pid, flags)
            except ChildProcessError:  # reaped by someone else: the manifest tells
                self._pid, self._ok = None, self._manifest.exists()
                return self._ok
            if pid == 0:
                return None
            self._pid, self._ok = None, os.waitstatus_to_exitcode(status) == 0
        return self._ok


class Checkpoints:
    def __init__(self, directory: str | Path, keep: int = 2) -> None:
        self.directory = Path(directory)
        self.keep = keep
        for stale in self.directory.glob("gen-*/*.tmp*"):  # from a process killed mid-write
            stale.unlink(missing_ok=True)  # (or a live writer just renamed it)

    def generations(self) -> list[int]:
        """Generation numbers present (complete or not), ascending."""
        return sorted(int(p.name[4:]) for p in self.directory.glob("gen-*")
                      if p.name[4:].isdigit())

    def folder(self, generation: int) -> Path:
        return self.directory / f"gen-{generation:06d}"

    def next_generation(self) -> int:
        return max(self.generations(), default=0) + 1

    def begin(self) -> int:
        """A new generation's number, its folder made: write its files there
        (`write_arrays`, from any process), then `commit`."""
        generation = self.next_generation()
        self.folder(generation).mkdir(parents=True, exist_ok=True)
        return generation

    def write(self, generation: int, files: Callable[[Path], list[dict]], meta: dict,
              background: bool = False, deadline_s: float = 600.0) -> Writing:
        """Write generation ``generation`` (from `begin`): ``files(folder)`` writes its
        array files and returns their entries, then `commit`. With ``background`` (where
        the platform can fork) a forked child does both and this returns at once: the
        child writes the state as it was at the call, whatever this process changes
        meanwhile; ``files`` must then only read memory (no threads, locks or devices: only
        the calling thread lives on in the child). The child ignores SIGINT and SIGTERM,
        dies with this process (Linux), and is killed past ``deadline_s``. Where no child
        can be made (no memory or processes left), it writes in place."""
        folder = self.folder(generation)
        if not (background and hasattr(os, "fork")):
            self.commit(generation, meta, files(folder))
            return Writing(generation, folder)
        parent = os.getpid()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            with warnings.catch_warnings():  # 3.12+ warns of threads: the child uses none
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            pid = None
        if pid != 0:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if pid is None:
                return self.write(generation, files, meta)
            return Writing(generation, folder, pid, deadline_s)
        code = 1
        try:  # the child: the parent's signals (Ctrl-C to the group) are not for it
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            _die_with(parent)
            self.commit(generation, meta, files(folder))
            code = 0
        except BaseException:
            print(f"writing checkpoint {folder} failed:", file=sys.stderr)
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)  # no atexit handlers, no flushing the parent's buffers

    def commit(self, generation: int, meta: dict, entries: list[dict]) -> None:
        """Write the manifest that makes ``generation`` complete, then drop generations
        older than the last ``keep`` complete ones."""
        folder = self.folder(generation)
        manifest = {"format": FORMAT, "generation": generation, "files": entries,
                    "state": meta}
        tmp = folder / f"{MANIFEST}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / MANIFEST)
        _fsync_dir(folder)
        kept = self.kept()
        for g in self.generations():
            if g < generation and g not in kept:
                shutil.rmtree(self.folder(g), ignore_errors=True)

    def kept(self) -> list[int]:
        """The last ``keep`` generations that have a manifest, ascending."""
        return [g for g in self.generations() if (self.folder(g) / MANIFEST).exists()
                ][-self.keep:]

    def load(self, names: Collection[str] | None = None) -> Saved | None:
        """The newest complete generation (every file checked, only those ``names``
        loaded, if given), or None if there is none. Incomplete or corrupt ones are
        skipped with a warning naming them; a manifest of another format raises
        ValueError (start with a fresh state directory)."""
        for generation in reversed(self.generations()):
            try:
                return self._load(generation, names)
            except CorruptCheckpointError as e:
                warnings.warn(f"{e}; using the previous complete checkpoint", stacklevel=2)
        return None

    def _load(self, generation: int, names: Collection[str] | None = None) -> Saved:
        folder = self.folder(generation)
        path = folder / MANIFEST
        if not path.exists():
            raise CorruptCheckpointError(f"{folder} is incomplete (no manifest)")
        try:
            manifest = json.loads(path.read_text())
        except ValueError as e:
            raise CorruptCheckpointError(f"{path} is not JSON ({e})") from None
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{path} is not a {FORMAT} checkpoint (it says "
                             f"{manifest.get('format')!r}): start with a fresh --state-dir")
        files = {}
        for entry in manifest["files"]:
            file = folder / f"{entry['name']}.npz"
            if not file.exists() or file.stat().st_size != entry["bytes"] or (
                    sha256(file) != entry["sha256"]):
                raise CorruptCheckpointError(f"{file} is missing or does not match its "
                                             "manifest (size or SHA-256)")
            if names is None or entry["name"] in names:
                files[entry["name"]] = read_arrays(file)
        return Saved(generation, folder, manifest["state"], files)


def _die_with(parent: int) -> None:
    """Have the kernel kill this (forked) process when its parent dies (Linux), and exit
    now if the parent already has."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the deadline bounds it
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
