"""The console's wait before a run's first iteration (issue 27 item 6): `Waiting` prints
`compiling... 12 s` while the programs compile, so the start line is not followed by a minute
of silence. The run's own progress (`ppo_async.report.metrics.Progress`: a bar on a terminal or
in a notebook, plain lines otherwise) takes over at the first iteration.

On a terminal the line is rewritten in place about every second and wiped when the wait ends;
where stderr is no terminal (a file, a CI log) a plain line every `LINE_EVERY_S` seconds, never
a `\\r` frame. Nothing when disabled (`--quiet`, a process other than 0).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Any, Callable

TTY_EVERY_S = 1.0
"""How often the line is redrawn on a terminal."""
LINE_EVERY_S = 15.0
"""How often a plain line is printed where stderr is no terminal."""
CLEAR_LINE = "\r\x1b[K"
"""Back to the start of the line and erase it (ANSI)."""


def waiting_text(what: str, elapsed_s: float) -> str:
    """`compiling... 12 s`: what is being waited for and for how long (pure)."""
    return f"{what}... {elapsed_s:.0f} s"


def interactive(stream: IO[str]) -> bool:
    """Whether `stream` is a terminal a line can be redrawn on."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def a_bar_is_live() -> bool:
    """Whether a tqdm progress bar is on screen (it owns the terminal line from then on)."""
    tqdm = sys.modules.get("tqdm")
    return bool(tqdm is not None and len(getattr(tqdm.tqdm, "_instances", ())))


class Waiting:
    """`compiling... N s` on stderr from `start()` until `done()` (the first iteration) or
    `stop()`, whichever comes first; a context manager (start on enter, stop on exit).

    `done` takes any arguments, so it can be given as `train(..., on_iteration=waiting.done)`.
    The wait also ends, silently, once a progress bar is live (`bar_live`): on a terminal the
    run's bar is drawn when the recorder opens, just before the first iteration.
    """

    def __init__(self, what: str = "compiling", enabled: bool = True, *, stream: IO[str] | None = None,
                 tty: bool | None = None, every_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, bar_live: Callable[[], bool] = a_bar_is_live) -> None:
        self.what, self.enabled = what, enabled
        self.stream = sys.stderr if stream is None else stream
        self.tty = interactive(self.stream) if tty is None else tty
        self.every_s = (TTY_EVERY_S if self.tty else LINE_EVERY_S) if every_s is None else every_s
        self.clock, self.bar_live = clock, bar_live
        self.started = clock()
        self.drawn = False  # a terminal line of ours is on screen (to wipe at the end)
        self.lines: list[str] = []  # the texts shown, in order
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def tick(self) -> bool:
        """Shows the elapsed time once; False (and nothing shown) once the wait is over."""
        with self._lock:
            if self._ended.is_set() or not self.enabled:
                return False
            if self.bar_live():
                self.drawn = False  # the bar drew over our line: leave it be
                self._ended.set()
                return False
            text = waiting_text(self.what, self.clock() - self.started)
            self.lines.append(text)
            self.stream.write(f"\r{text}\x1b[K" if self.tty else f"{text}\n")
            self.stream.flush()
            self.drawn = self.tty
            return True

    def _loop(self) -> None:
        while not self._ended.wait(self.every_s) and self.tick():
            pass

    def start(self) -> "Waiting":
        """Starts the clock and the ticking thread (nothing when disabled)."""
        self.started = self.clock()
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ppo_async-waiting", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the wait (idempotent): no more lines; a terminal line of ours is wiped."""
        with self._lock:
            self._ended.set()
            if self.drawn:
                self.stream.write(CLEAR_LINE)
                self.stream.flush()
                self.drawn = False
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def done(self, *_: Any) -> None:
        """The first iteration is done: `stop()` (later calls cost a flag check)."""
        if not self._ended.is_set() or self._thread is not None:
            self.stop()

    def __enter__(self) -> "Waiting":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
