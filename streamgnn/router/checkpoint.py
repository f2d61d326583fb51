"""`Checkpoints`: the service's state on disk as data, never pickles: numbered generations
``gen-000012/``, each a set of ``.npz`` array files (loaded with ``allow_pickle=False``) and
a ``manifest.json`` written last, naming every file with its size and SHA-256 beside the
small JSON state, and the SHA-256 of all that (the manifest's own state is checked like
the files). Every file is written to a temporary name, fsync'd and renamed.

A generation without its manifest (a process killed mid-write) is incomplete: loading
skips it. One whose manifest or files do not verify (torn, flipped or edited) is corrupt:
loading moves it aside to ``corrupt-gen-000012/`` (kept for inspection, never counted)
and takes the newest one that verifies. Retention keeps the last ``keep`` *verified*
generations: those this process loaded (checked file by file) or wrote itself (verified
by construction: the manifest names what was just written); it runs when a generation is
committed, so the newest verified one is never deleted for a newer one that is not. No
generation is re-read to verify it after the load.

Files of one generation may come from different processes (`write_arrays`, one shard per
rank; `streamgnn.npz`); `commit` makes the set complete. Processes that keep files of
each generation in a state directory of their own (MPI workers on other hosts: `Copies`)
check, move aside and drop their copies of a generation when this process decides, so no
process reads another's files; a generation verifies only if every process's files do.
Where all share one directory (one host, a shared filesystem), the copies are the same
folders.

`write` writes a generation here or, in the background, from a forked child: the child's
memory is a copy-on-write snapshot of this process at the fork, so the caller's state may
change at once while the child writes it as it was (the way Redis' BGSAVE does). Must not
import torch, kafka or mpi4py.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from streamgnn.errors import StreamGNNError, UserError
from streamgnn.npz import read_arrays, sha256

FORMAT = "streamgnn-state/8"
"""What a generation holds, named in its manifest: another one cannot be read."""
MANIFEST = "manifest.json"
CORRUPT = "corrupt-"
"""The prefix a corrupt generation's folder is renamed with."""


@dataclass
class Saved:
    """A complete generation: its number, folder, JSON state and the array files loaded
    (by name; every file of the generation was checked against the manifest)."""

    generation: int
    folder: Path
    meta: dict
    files: dict[str, dict[str, np.ndarray]]


class CorruptCheckpointError(StreamGNNError, ValueError):
    """A generation's manifest or file does not verify."""


class OtherFormatError(UserError, ValueError):
    """A manifest of another `FORMAT` (a state written by another version)."""


class NoVerifiedStateError(UserError):
    """No generation in the state directory verifies, but state was kept there (a corrupt
    generation, or a journal of batches since a checkpoint): starting over would rebuild
    the state from what the topic still holds."""

    def __init__(self, directory: Path, corrupt: int) -> None:
        super().__init__(
            f"no checkpoint in {directory} verifies against its manifest ({corrupt} moved "
            f"aside as {CORRUPT}gen-*): starting over would rebuild the state from what "
            "the updates topic still holds",
            "restore the state directory from a backup, or pass --rebuild-state "
            "(STREAMGNN_REBUILD_STATE=1) to bootstrap a new state there (its label "
            "changes carry a new epoch in their event ids)")


class Writing:
    """A generation `Checkpoints.write` is writing: ``done`` says whether it finished
    (None: still writing), ``wait`` waits for it; both are True once the generation is
    complete, False if the writer failed (it said why on stderr; the generation stays
    incomplete, so loading skips it) or ran past its ``deadline_s`` (then it is killed).
    ``on_complete`` runs in this process when a child's generation is found complete."""

    def __init__(self, generation: int, folder: Path, pid: int | None = None,
                 deadline_s: float = 0.0,
                 on_complete: Callable[[], None] = lambda: None) -> None:
        self.generation = generation
        self._manifest = folder / MANIFEST
        self._pid = pid  # the writing child, until it has been reaped
        self._deadline = time.monotonic() + deadline_s
        self._on_complete = on_complete
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
            else:
                if pid == 0:
                    return None
                self._pid, self._ok = None, os.waitstatus_to_exitcode(status) == 0
            if self._ok:
                self._on_complete()
        return self._ok


class Copies(Protocol):
    """Other processes that write some files of every generation into state directories
    of their own (MPI workers: each its ``shard<p>``), the same folders as this process's
    or not. They act on their copies of a generation only when asked."""

    def owns(self, name: str) -> bool:
        """Whether a generation's file ``name`` is theirs (written and kept by them)."""
        ...

    def verify(self, generation: int, entries: list[dict]) -> list[str]:
        """Why their copies of the files ``entries`` name (manifest entries, theirs only)
        in generation ``generation`` do not match them: one reason per file that does
        not (none: they all match)."""
        ...

    def move_aside(self, generation: int) -> None:
        """Move their copies of generation ``generation`` aside (`Checkpoints.move_aside`)."""
        ...

    def drop_before(self, generation: int, kept: list[int]) -> None:
        """Delete their copies of every generation before ``generation`` but ``kept``."""
        ...


class Checkpoints:
    def __init__(self, directory: str | Path, keep: int = 2,
                 copies: Copies | None = None) -> None:
        """``copies``: other processes keeping their own files of each generation (this
        one decides, for them too, which generation verifies, and what is moved aside or
        deleted)."""
        self.directory = Path(directory)
        self.keep = keep
        self.copies = copies
        self.verified: set[int] = set()  # generations this process loaded or wrote
        for stale in self.directory.glob("gen-*/*.tmp*"):  # from a process killed mid-write
            stale.unlink(missing_ok=True)  # (or a live writer just renamed it)

    def generations(self) -> list[int]:
        """Generation numbers present (complete or not; not those moved aside),
        ascending."""
        return _numbered(self.directory.glob("gen-*"), "gen-")

    def corrupt(self) -> list[int]:
        """Generation numbers moved aside as corrupt, ascending."""
        return _numbered(self.directory.glob(f"{CORRUPT}gen-*"), f"{CORRUPT}gen-")

    def folder(self, generation: int) -> Path:
        return self.directory / f"gen-{generation:06d}"

    def next_generation(self) -> int:
        """One past every generation number used here, those moved aside included (a
        number, and its journal, is never reused)."""
        return max(self.generations() + self.corrupt(), default=0) + 1

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
        can be made (no memory or processes left), and where other processes keep
        `Copies` (they are told over MPI, which a forked child must not use), it writes in
        place."""
        folder = self.folder(generation)
        if not (background and hasattr(os, "fork")) or self.copies is not None:
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
            return Writing(generation, folder, pid, deadline_s,
                           lambda: self._retain(generation))  # the child deleted already
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
        """Write the manifest that makes ``generation`` complete (and verified), then drop
        the generations before it but the last ``keep`` verified ones."""
        folder = self.folder(generation)
        manifest = json.loads(json.dumps({  # as it will read back (keys as strings)
            "format": FORMAT, "generation": generation, "files": entries, "state": meta}))
        tmp = folder / f"{MANIFEST}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({**manifest, "sha256": _digest(manifest)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / MANIFEST)
        _fsync_dir(folder)
        self._retain(generation)

    def _retain(self, generation: int) -> None:
        """``generation`` is complete and verified: keep the last ``keep`` verified
        generations, and drop every other one before ``generation`` (verified or not)."""
        self.verified.add(generation)
        self.verified = set(self.kept())
        self.drop_before(generation, self.kept())

    def drop_before(self, generation: int, kept: list[int]) -> None:
        """Delete every generation before ``generation`` but those ``kept``, here and in
        the other processes' `Copies`."""
        for g in self.generations():
            if g < generation and g not in kept:
                shutil.rmtree(self.folder(g), ignore_errors=True)
        if self.copies is not None:
            self.copies.drop_before(generation, kept)

    def move_aside(self, generation: int) -> None:
        """Rename generation ``generation``'s folder ``corrupt-gen-...`` (kept for
        inspection, never loaded, its number never reused), here and in the other
        processes' `Copies`. A folder that is not there (moved already: one folder
        shared with them) is left alone."""
        folder = self.folder(generation)
        self.verified.discard(generation)  # (written here, then damaged: kept no longer)
        with contextlib.suppress(OSError):
            folder.rename(self.directory / f"{CORRUPT}{folder.name}")
        if self.copies is not None:
            self.copies.move_aside(generation)

    def kept(self) -> list[int]:
        """The last ``keep`` verified generations, ascending (a restart takes the newest
        of them that still verifies)."""
        return sorted(self.verified)[-self.keep:]

    def load(self, names: Collection[str] | None = None) -> Saved | None:
        """The newest generation that verifies (every file checked, only those ``names``
        loaded, if given, of this process's files), or None if there is none; the
        `Copies` check theirs. Incomplete ones are skipped and corrupt ones moved aside,
        with a warning naming them; a manifest of another format raises
        `OtherFormatError`."""
        for generation in reversed(self.generations()):
            try:
                saved = self._load(generation, names)
            except CorruptCheckpointError as e:
                reason, folder = str(e), self.folder(generation)
                if (folder / MANIFEST).exists():
                    self.move_aside(generation)
                    reason += f": moved aside to {CORRUPT}{folder.name}"
                warnings.warn(f"{reason}; using the previous checkpoint", stacklevel=2)
                continue
            self.verified.add(generation)
            return saved
        return None

    def peek(self, name: str) -> Saved | None:
        """The newest generation whose manifest and file ``name`` verify, that file loaded;
        nothing else is checked or moved aside, and a manifest of another format is
        passed over: a worker's look at a state directory that another process's `load`
        decides on (a worker's own directory holds no manifest: None)."""
        for generation in reversed(self.generations()):
            folder = self.folder(generation)
            try:
                manifest = self._manifest(generation)
                entries = [e for e in manifest["files"] if e["name"] == name]
                if entries and not self.check(generation, entries):
                    return Saved(generation, folder, manifest["state"],
                                 {name: read_arrays(folder / f"{name}.npz")})
            except (CorruptCheckpointError, OtherFormatError, OSError):
                continue  # (OSError: moved aside meanwhile by the process that decides)
        return None

    def check(self, generation: int, entries: list[dict]) -> list[str]:
        """Why the files ``entries`` name (manifest entries) in generation ``generation``
        here do not match them: one reason per file missing or differing in size or
        SHA-256 (none: they all match)."""
        reasons = []
        for entry in entries:
            file = self.folder(generation) / f"{entry['name']}.npz"
            try:
                intact = (file.stat().st_size == entry["bytes"]
                          and sha256(file) == entry["sha256"])
            except OSError:  # missing
                intact = False
            if not intact:
                reasons.append(f"{file} is missing or does not match its manifest (size or "
                               "SHA-256)")
        return reasons

    def _load(self, generation: int, names: Collection[str] | None = None) -> Saved:
        manifest = self._manifest(generation)
        theirs = [e for e in manifest["files"]
                  if self.copies is not None and self.copies.owns(e["name"])]
        mine = [e for e in manifest["files"] if e not in theirs]
        reasons = self.check(generation, mine)
        if not reasons and theirs:
            reasons = self.copies.verify(generation, theirs)
        if reasons:
            raise CorruptCheckpointError("; ".join(reasons))
        folder = self.folder(generation)
        return Saved(generation, folder, manifest["state"], {
            e["name"]: read_arrays(folder / f"{e['name']}.npz") for e in mine
            if names is None or e["name"] in names})

    def _manifest(self, generation: int) -> dict:
        """Generation ``generation``'s manifest, once it verifies against its own SHA-256
        (else `CorruptCheckpointError`) and names this `FORMAT` (else `OtherFormatError`)."""
        folder = self.folder(generation)
        path = folder / MANIFEST
        if not path.exists():
            raise CorruptCheckpointError(f"{folder} is incomplete (no manifest)")
        try:
            manifest = json.loads(path.read_text())
        except ValueError as e:
            raise CorruptCheckpointError(f"{path} is not JSON ({e})") from None
        if not isinstance(manifest, dict):
            raise CorruptCheckpointError(f"{path} is not a manifest")
        digest = manifest.pop("sha256", None)
        if digest is not None and digest != _digest(manifest):
            raise CorruptCheckpointError(f"{path} does not match its own SHA-256 (edited "
                                         "or damaged)")
        if manifest.get("format") != FORMAT:
            raise OtherFormatError(f"{path} is not a {FORMAT} checkpoint (it says "
                                   f"{manifest.get('format')!r})",
                                   "start with a fresh --state-dir")
        if digest is None or manifest.get("generation") != generation:
            raise CorruptCheckpointError(f"{path} has no SHA-256 of its own or names "
                                         "another generation")
        return manifest


def _digest(manifest: dict) -> str:
    """The SHA-256 of ``manifest`` as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _numbered(folders: Iterable[Path], prefix: str) -> list[int]:
    """The numbers of ``folders`` named ``prefix`` + digits, ascending."""
    return sorted(int(p.name.removeprefix(prefix)) for p in folders
                  if p.name.removeprefix(prefix).isdigit())


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
