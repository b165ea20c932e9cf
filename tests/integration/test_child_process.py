"""die_with_parent: a server started by a test dies with the process that started it, even when that process
is SIGKILLed and runs no teardown (an OOM-killed pytest worker)."""
import os
import pathlib
import signal
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent

_PARENT = """
import subprocess, sys
sys.path.insert(0, sys.argv[1])
from child_process import die_with_parent
c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=die_with_parent())
print(c.pid, flush=True)
sys.stdin.read()
"""


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_child_dies_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(HERE)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.time() + 30  # a bound on waiting, not on speed: the signal is sent as the parent exits
        while _alive(child) and time.time() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"child {child} outlived its SIGKILLed parent"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
