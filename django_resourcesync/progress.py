"""A small text progress bar for management commands (rate and ETA), on standard error.

On a terminal the bar is drawn again in place, and a phase ends with a newline. Elsewhere (a
pipe, a log file, a test's ``StringIO``) nothing is drawn in place: a phase's state is written as
a whole line now and then (every ten seconds), and its last state once when it ends.
"""

import sys
import time


def _isatty(stream):
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


class ProgressBar:
    """``interval``: the least seconds between two lines shown; by default half a second on a
    terminal, ten elsewhere."""

    def __init__(self, stream=None, interval=None, width=30):
        self.stream = stream or sys.stderr
        self.tty = _isatty(self.stream)
        self.interval = interval if interval is not None else (0.5 if self.tty else 10.0)
        self.width = width
        self._phase = None
        self._started = 0.0
        self._shown = 0.0
        self._line = None  # the phase's line last shown
        self._pending = None  # what the phase was told last and did not show yet
        self._finished = None  # (done, total) of the phase shown finished

    def __call__(self, phase, done, total=None, *, unit="", note=""):
        """Show ``done`` of ``total`` for ``phase``; ``unit="B"`` shows sizes in MB."""
        now = time.monotonic()
        if phase != self._phase:
            self.end()
            # Without a terminal the phase's first line waits for the interval (or the phase's end).
            self._phase, self._started, self._shown = phase, now, float("-inf") if self.tty else now
        finished = total is not None and done >= total
        if finished and self._finished == (done, total):
            return  # told again that the phase is done (a build's last part, then the build): shown once
        if now - self._shown < self.interval and not finished:
            self._pending = (done, total, unit, note, now)
            return
        if finished:
            self._finished = (done, total)
        self._show(self._line_of(phase, done, total, unit, note, now))
        self._shown, self._pending = now, None

    def _show(self, line):
        if self.tty:
            # Spaces over what is left of a longer line before it (a rate or an ETA gone).
            self._write("\r" + line.ljust(len(self._line or "")))
        else:
            self._write(line + "\n")
        self._line = line

    def _line_of(self, phase, done, total, unit, note, now):
        elapsed = max(now - self._started, 1e-9)
        rate = done / elapsed if elapsed > 0.1 else 0

        def amount(value):  # counts (and rates of them) whole, with thousands separated
            return f"{value / 2**20:,.1f} MB" if unit == "B" else f"{value:,.0f}"

        if total:
            filled = int(self.width * min(done / total, 1))
            eta = (total - done) / rate if rate else 0
            line = f"{phase:<14} [{'#' * filled}{'.' * (self.width - filled)}] {amount(done)}/{amount(total)}"
            line += f" {amount(rate)}/s ETA {eta:,.0f}s" if rate and done < total else (f" {amount(rate)}/s" if rate else "")
        else:
            line = f"{phase:<14} {amount(done)}" + (f" {amount(rate)}/s" if rate else "")
        if note:
            line += f" ({note})"
        return line

    def _write(self, text):
        if hasattr(self.stream, "ending"):  # a management command's OutputWrapper: unstyled (not an error's red)
            self.stream.write(text, style_func=str, ending="")
        else:
            self.stream.write(text)
        self.stream.flush()

    def end(self):
        """End the phase shown: its last state on a line of its own, then nothing more of it."""
        if self._pending is not None:
            self._show(self._line_of(self._phase, *self._pending))
        if self.tty and self._line is not None:
            self._write("\n")
        self._phase, self._line, self._pending, self._finished = None, None, None, None
