"""How a run takes the stop signals (SIGINT, SIGTERM). The first asks it to stop at the next step boundary with a
final checkpoint; another one, later, gives up at once (KeyboardInterrupt, no checkpoint). Launchers often signal a
run's whole process group, so the compile workers torch starts in that group are kept out of the way.
"""
from __future__ import annotations

import signal
import time

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# One stop can arrive as two signals microseconds apart: GNU `timeout -s INT` signals the command, then its whole
# process group, the command included (coreutils timeout.c, cleanup()). With inductor's 16 compile workers in the group
# (a compiled run on a 16-core host) the second often lands after Python ran the handler for the first (CPU: the
# handler ran twice in 7 of 10 tries, 4-64 us apart; alone in its group, 0 of 10): issue 32's compiled MeanFlow run
# stopped that way without its checkpoint. Those are one request; a person's second Ctrl-C comes later.
SAME_REQUEST_S = 1.0


class StopSignals:
    """A signal handler's memory of when the first stop signal came."""

    def __init__(self, clock=time.monotonic):
        self.clock, self.first = clock, None

    def is_second(self) -> bool:
        """Count one signal: True for a second request (give up at once); False for the first and its echoes."""
        now = self.clock()
        if self.first is None:
            self.first = now
            return False
        return now - self.first >= SAME_REQUEST_S


def start_compile_workers(device) -> None:
    """Start inductor's compile-worker pool now, as torch.compile would at its first CUDA graph, with the stop signals
    blocked, which its processes inherit (and the signal blocked meanwhile still reaches us, once unblocked).

    torch starts the pool in our process group. A stop signalled to the whole group (GNU timeout, the suite driver,
    Ctrl-C at a terminal) killed it: SIGTERM at any time, SIGINT in its first second or so, before it ignores SIGINT
    itself; and inductor, which holds the pipe's other end, then waits forever on its next compile (the run hangs
    until killed, without a checkpoint). The pool still ends with this process: its shutdown at exit, or its
    watchdog when its parent is gone."""
    if device.type != "cuda":  # the pool compiles Triton kernels only
        return
    try:  # a private torch function (2.2 to 2.13 at least): without it torch starts the pool itself, unprotected
        from torch._inductor.async_compile import maybe_warm_pool  # imported before the window: seconds
    except ImportError:
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        maybe_warm_pool()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
