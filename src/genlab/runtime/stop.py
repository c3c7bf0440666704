"""How a run takes the stop signals (SIGINT, SIGTERM): the first stops it at the next step boundary with a final
checkpoint; another, later, gives up at once (KeyboardInterrupt, no checkpoint)."""
from __future__ import annotations

import signal
import time

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# One stop can arrive as two signals microseconds apart: GNU `timeout -s INT` signals the command, then its whole
# process group (coreutils timeout.c, cleanup()); with compile workers in the group the second often lands after the
# handler ran for the first (4-64 us apart). Those are one request; a person's second Ctrl-C comes later.
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
    """Start inductor's compile-worker pool now with the stop signals blocked, which its processes inherit (a signal
    blocked meanwhile still reaches us once unblocked). torch starts the pool in our process group, and a stop sent to
    the group (GNU timeout, Ctrl-C at a terminal) killed it, leaving inductor waiting forever on its next compile. The
    pool still ends with this process (its shutdown at exit, or its watchdog when the parent is gone)."""
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
