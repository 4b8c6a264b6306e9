"""What ``mrcnic demo`` shows while a run goes: one progress bar on the terminal, the logs in
a file.

The simulation runs in a child process (the simulator, with cocotb in it); its output (the
simulator's, cocotb's, the warnings of the libraries it imports) goes to the run's log file.
The bench (:class:`mrcnic.netsim.demo_bench.Progress`) appends its progress lines, prefixed
``mrcnic-progress``, to a file of the run's folder; :class:`ProgressFollower` reads them in a
thread of the parent and :class:`DemoBar` draws them: bytes placed of bytes to write,
simulated time, wall time and an estimate of the time left.
"""

import contextlib
import os
import sys
import threading
import time
import warnings
from pathlib import Path

from mrcnic.netsim.demo_bench import PROGRESS_PREFIX

__all__ = ["ProgressFollower", "DemoBar", "warnings_to"]


class ProgressFollower(threading.Thread):
    """Follows the progress file ``path`` (lines ``mrcnic-progress PHASE PLACED SIZE T_NS``)
    and calls ``report(phase, placed, size, t_ns)`` for each new line, until :meth:`stop`
    (which reads what is left first). Lines without the prefix are ignored. ``idle``, when
    given, is called at every look that found no new line (the bar's clock moves on while
    the model builds)."""

    POLL_S = 0.25

    def __init__(self, path, report, idle=None):
        super().__init__(daemon=True)
        self.path, self.report, self.idle = Path(path), report, idle
        self._stop_event = threading.Event()
        self._offset = 0

    def _read(self):
        """Report the complete lines written since the last look; True if there were any."""
        if not self.path.exists():
            return False
        with open(self.path) as f:
            f.seek(self._offset)
            text = f.read()
        end = text.rfind("\n") + 1             # a line still being written waits
        self._offset += len(text[:end].encode())
        for line in text[:end].splitlines():
            parts = line.split()
            if len(parts) == 5 and parts[0] == PROGRESS_PREFIX:
                self.report(parts[1], int(parts[2]), int(parts[3]), float(parts[4]))
        return end > 0

    def run(self):
        while not self._stop_event.wait(self.POLL_S):
            if not self._read() and self.idle is not None:
                self.idle()

    def stop(self):
        """Stop following, after the lines written so far are reported."""
        self._stop_event.set()
        self.join()
        self._read()


class DemoBar:
    """The progress bar of one run (tqdm, on stderr): ``name``, the share of ``size`` bytes
    placed at NIC b, bytes placed, what the run is doing (``status``: the Verilator build,
    the NICs' bring-up, or the simulated time), wall time and an estimate of the time left.
    A context manager: the bar ends on its own line."""

    # tqdm's {postfix} brings its own ", "; sizes in KiB
    FORMAT = ("{desc} {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} KiB placed{postfix} "
              "[wall {elapsed}, left {remaining}]")

    def __init__(self, name, size):
        from tqdm import tqdm
        # Not a terminal (a CI log): a redraw every 30 s, not twice a second. A terminal
        # that reports no size (a pseudo-terminal without one) gets 100 columns and 24
        # rows: tqdm draws nothing in 0.
        try:
            width = os.get_terminal_size(sys.stderr.fileno()).columns
        except OSError:
            width = 0
        self.bar = tqdm(total=size / 1024, desc=f"{name:13}", unit="KiB",
                        bar_format=self.FORMAT, file=sys.stderr,
                        **({"dynamic_ncols": True} if width else {"ncols": 100, "nrows": 24}),
                        mininterval=0.5 if sys.stderr.isatty() else 30.0, smoothing=0.1)
        self.bar.set_postfix_str("starting", refresh=True)
        self._last_tick = time.monotonic()

    def tick(self):
        """Redraw, at most every ``mininterval`` (the wall clock moves on while nothing
        else does)."""
        now = time.monotonic()
        if now - self._last_tick >= self.bar.mininterval:
            self._last_tick = now
            self.bar.refresh()

    def status(self, text):
        """What the run does before bytes flow (shown in place of the simulated time)."""
        self.bar.set_postfix_str(text)

    def note(self, text):
        """A line above the bar (the bar stays the last line)."""
        self.bar.write(text, file=sys.stderr)

    def report(self, phase, placed, size, t_ns):
        """A progress line of the bench (the callback of :class:`ProgressFollower`)."""
        if phase == "bring-up":
            self.bar.set_postfix_str("NICs' bring-up", refresh=False)
        else:
            self.bar.set_postfix_str(f"{t_ns / 1000:.1f} us simulated", refresh=False)
        self.bar.update(max(0.0, min(placed, size) / 1024 - self.bar.n))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.bar.close()
        return False


@contextlib.contextmanager
def warnings_to(log_path):
    """Python warnings raised in this process meanwhile (the export's, the libraries'),
    appended to ``log_path`` instead of the terminal."""
    caught = []

    def keep(message, category, filename, lineno, file=None, line=None):
        caught.append(warnings.formatwarning(message, category, filename, lineno, line))
    saved = warnings.showwarning
    warnings.showwarning = keep
    try:
        yield
    finally:
        warnings.showwarning = saved
        if caught:
            with open(log_path, "a") as f:
                f.write("\n== warnings of mrcnic demo itself ==\n" + "".join(caught))
