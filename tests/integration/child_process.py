"""Servers the tests start die with the pytest process that started them.

A pytest worker that is killed (the OOM killer, a CI timeout) never runs its fixtures' teardown, and its
`stoke serve` children would live on, holding memory and ports for the rest of the run. `die_with_parent` is a
Popen preexec_fn that asks Linux to send the child SIGTERM when the thread that forked it exits
(prctl PR_SET_PDEATHSIG). That is the thread, not the process: a server started from another thread would die
when that thread ends, so only a fork from the main thread (the worker itself) asks for it.
"""
import ctypes
import os
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent(parent_pid=None):
    """A preexec_fn: SIGTERM to the child when its parent exits. None (nothing asked) off Linux or off the main
    thread."""
    if _libc is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid() if parent_pid is None else parent_pid

    def preexec():
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec
