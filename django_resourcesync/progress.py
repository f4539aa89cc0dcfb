"""A small text progress bar for management commands (rate and ETA), on standard error."""

import sys
import time


class ProgressBar:
    def __init__(self, stream=None, interval=0.5, width=30):
        self.stream = stream or sys.stderr
        self.interval = interval
        self.width = width
        self._phase = None
        self._started = 0.0
        self._shown = 0.0
        self._visible = False

    def __call__(self, phase, done, total=None, *, unit="", note=""):
        """Show ``done`` of ``total`` for ``phase``; ``unit="B"`` shows sizes in MB."""
        now = time.monotonic()
        if phase != self._phase:
            self.end()
            self._phase, self._started, self._shown = phase, now, float("-inf")
        finished = total is not None and done >= total
        if now - self._shown < self.interval and not finished:
            return
        self._shown = now
        elapsed = max(now - self._started, 1e-9)
        rate = done / elapsed if elapsed > 0.1 else 0

        def amount(value):  # counts (and rates of them) whole, with thousands separated
            return f"{value / 2**20:,.1f} MB" if unit == "B" else f"{value:,.0f}"

        if total:
            filled = int(self.width * min(done / total, 1))
            eta = (total - done) / rate if rate else 0
            line = f"{phase:<14} [{'#' * filled}{'.' * (self.width - filled)}] {amount(done)}/{amount(total)}"
            line += f" {amount(rate)}/s ETA {eta:,.0f}s" if rate else ""
        else:
            line = f"{phase:<14} {amount(done)}" + (f" {amount(rate)}/s" if rate else "")
        if note:
            line += f" ({note})"
        self._write("\r" + line)
        self._visible = True

    def _write(self, text):
        if hasattr(self.stream, "ending"):  # a management command's OutputWrapper
            self.stream.write(text, ending="")
        else:
            self.stream.write(text)
        self.stream.flush()

    def end(self):
        if self._visible:
            self._write("\n")
        self._phase, self._visible = None, False
