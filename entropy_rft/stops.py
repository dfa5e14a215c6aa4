"""Stop signals of a run in progress (SIGINT, SIGTERM, SIGHUP): raised as Interrupted where they land, or held
while a step is being committed (StopSignals.defer / release), so that a stop never leaves half an update behind."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading


class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) received during a run; `signum` says which."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)


STOP_SIGNALS = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s))


class StopSignals:
    """The stop signals of a run in progress. Outside `defer()` a stop raises Interrupted at once; from `defer()`
    until `release()` (a step whose first optimizer step has changed the weights, until its metrics line is
    written) it is held, and `release()` raises it, so a stop never leaves half an update behind."""

    def __init__(self):
        self.fired: list[int] = []
        self.held: int | None = None
        self.deferring = False

    def handler(self, signum, frame):
        if self.fired or self.held is not None:
            print(f"entropy-rft: {signal.Signals(signum).name} again while stopping; the save goes on (SIGKILL stops "
                  "at once, losing the steps since the last checkpoint)", file=sys.stderr)
            return
        if self.deferring:
            self.held = signum
            print(f"entropy-rft: {signal.Signals(signum).name}: finishing the step under way, then saving",
                  file=sys.stderr)
            return
        self.fired.append(signum)
        raise Interrupted(signum)

    def defer(self) -> None:
        self.deferring = True

    def release(self) -> None:
        self.deferring = False
        if self.held is not None:
            signum, self.held = self.held, None
            self.fired.append(signum)
            raise Interrupted(signum)


@contextlib.contextmanager
def stop_signals_interrupt():
    """While inside: SIGINT, SIGTERM and SIGHUP raise Interrupted in the main thread (once; repeats are ignored so
    the save they trigger completes), or are held while the yielded StopSignals defers them. Signals ignored when
    entering stay ignored; handlers are restored on exit. Outside the main thread (where Python cannot install
    handlers) nothing changes."""
    stops = StopSignals()
    if threading.current_thread() is not threading.main_thread():
        yield stops
        return
    previous = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, stops.handler)
    try:
        yield stops
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
