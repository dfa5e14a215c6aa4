"""What stops a run in progress: the stop signals (SIGINT, SIGTERM, SIGHUP), raised as Interrupted where they land, or
held while a step is being committed (StopSignals.defer / release), so that a stop never leaves half an update
behind; and a step whose numbers are not finite (NonFinite), which is never committed."""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading


class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) received during a run; `signum` says which."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)


class RunStopped(SystemExit):
    """A run stopped by a stop signal and saved: `line` says where it stopped and what was saved, `resume` how a
    `train` command continues it; the exit message holds both. A command that ran the training (demo) replaces
    `resume` with its own."""

    def __init__(self, line: str, resume: str):
        self.line, self.resume = line, resume
        super().__init__(f"{line} {resume}")


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
            print(
                f"entropy-rft: {signal.Signals(signum).name} again while stopping; the save goes on (SIGKILL stops "
                "at once, losing the steps since the last checkpoint)",
                file=sys.stderr,
            )
            return
        if self.deferring:
            self.held = signum
            print(
                f"entropy-rft: {signal.Signals(signum).name}: finishing the step under way, then saving",
                file=sys.stderr,
            )
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


class NonFinite(ArithmeticError):
    """A step whose loss, gradient or sampled logits are not finite: the trainer commits nothing of it (no metrics
    line, no checkpoint) and stops, so the newest checkpoint stays the last good one. The message says which."""


class NonFiniteReward(NonFinite):
    """A reward that is not a finite number: the task's reward function is at fault, not the update, so the advice
    is to fix the reward (a smaller lr would meet the same step)."""


def check_finite(**values: float) -> None:
    """Raise NonFinite naming the first of `values` (name=number, already on the host) that is not finite."""
    for name, value in values.items():
        if not math.isfinite(value):
            raise NonFinite(f"the {name.replace('_', ' ')} is {value}")


@contextlib.contextmanager
def finite_sampling():
    """Sampling whose logits are not finite (torch.multinomial's "probability tensor contains either inf, nan or
    element < 0") raises NonFinite instead of the library's error."""
    try:
        yield
    except RuntimeError as err:
        if "probability tensor contains" not in str(err):
            raise
        raise NonFinite("the sampled logits are not finite (inf or nan): the policy's weights have diverged") from None
