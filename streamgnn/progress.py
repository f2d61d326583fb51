"""Progress of long work, shown one way everywhere: a bar on a terminal; elsewhere (a log
file, a pipe) a plain line every `period_s` seconds with the count, the average rate and
the time elapsed, and a last one at the end when any was written. Rates are averages
since the start (or `Progress.reset`), never smoothed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

PERIOD_ENV = "STREAMGNN_PROGRESS_SECONDS"
DEFAULT_PERIOD_S = 10.0

T = TypeVar("T")


def period_s() -> float:
    """Seconds between progress lines off a terminal (`PERIOD_ENV`, else 10)."""
    return float(os.environ.get(PERIOD_ENV) or DEFAULT_PERIOD_S)


class Progress:
    """Counts ``unit``s of work called ``desc`` (out of ``total`` when known), on stderr;
    off when ``enabled`` is false. The bar goes when closed: a summary follows."""

    def __init__(self, desc: str, unit: str = "it", total: int | None = None,
                 enabled: bool = True) -> None:
        self.desc, self.unit, self.total = desc, unit, total
        self.n = 0
        self.postfix: dict[str, Any] = {}
        self._bar = None
        self._period = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, smoothing=0, leave=False,
                             dynamic_ncols=True)
        elif enabled:
            self._period = period_s()
        self._lines = 0
        self._shown: tuple[int, dict[str, Any]] | None = None  # in the last line
        self._start = self._last = time.monotonic()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        """``n`` more units done."""
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._period is not None and time.monotonic() - self._last >= self._period:
            self._line()

    def set(self, n: int, **postfix: Any) -> None:
        """The count is ``n`` now, with these fields shown after it."""
        self.postfix = postfix
        if self._bar is not None:
            self._bar.set_postfix(postfix, refresh=False)
        self.update(n - self.n)

    def reset(self) -> None:
        """Start again from 0 (and the clock from now)."""
        self.n, self.postfix = 0, {}
        self._start = self._last = time.monotonic()
        if self._bar is not None:
            self._bar.reset()
            self._bar.set_postfix({}, refresh=False)

    def write(self, text: str) -> None:
        """A message on stdout (above the bar, on a terminal)."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def close(self) -> None:
        """Done: the bar closes; off a terminal a last line, if any came before and the
        count or fields changed since."""
        if self._bar is not None:
            self._bar.refresh()
            self._bar.close()
        elif self._lines and self._shown != (self.n, self.postfix):
            self._line()

    def _line(self) -> None:
        now = time.monotonic()
        self._last = now
        self._lines += 1
        self._shown = (self.n, dict(self.postfix))
        elapsed = now - self._start
        count = f"{self.n:,}" if self.total is None else (
            f"{self.n:,}/{self.total:,} ({self.n / max(self.total, 1):.0%})")
        fields = "".join(f", {k}={v}" for k, v in self.postfix.items())
        print(f"{self.desc}: {count} {self.unit}, {self.n / max(elapsed, 1e-9):,.0f} "
              f"{self.unit}/s, {elapsed:,.1f} s{fields}", file=sys.stderr, flush=True)


def track(items: Iterable[T], desc: str, unit: str = "it", total: int | None = None,
          enabled: bool = True) -> Iterator[T]:
    """``items``, counted by a `Progress` as they are taken."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(desc, unit, total, enabled) as progress:
        for item in items:
            yield item
            progress.update()
