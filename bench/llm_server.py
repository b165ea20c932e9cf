"""Shared by bench/llm_batching.py and bench/llm_prefix_cache.py: run `stoke serve` on a free port, read its
/metrics, stream one request with the `openai` client, describe the machine, wait for a quiet machine."""
import datetime
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_BIN = os.environ.get("STOKE_BIN", str(ROOT / "build/release/apps/stoke/stoke"))
METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
CLK_TCK = os.sysconf("SC_CLK_TCK")


class StokeServer:
    """`stoke serve --port 0 ...`; the port comes from the "listening on http://host:port" stderr line."""

    def __init__(self, stoke_bin: str, model: str, extra: list[str], ready_timeout: float = 300):
        self.args = [stoke_bin, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0", *extra]
        self.lines: list[str] = []
        self.ready_line = ""
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True, errors="replace")
        listening = threading.Event()
        ready = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                if "listening on http://" in line:
                    listening.set()
                if "ready on http://" in line:
                    self.ready_line = line.strip()
                    ready.set()
            listening.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        listening.wait(60)
        m = next((re.search(r"listening on (http://[^ ]+)", l) for l in self.lines if "listening on" in l), None)
        if not m:
            self._fail("no 'listening on' line")
        self.url = m.group(1)
        if not ready.wait(ready_timeout) or not self.ready_line:
            self._fail("not ready")

    def _fail(self, what: str):
        self.stop()
        sys.exit(f"stoke serve ({shlex.join(self.args)}): {what}\n" + "\n".join(self.lines[-30:]))

    def cpu_seconds(self) -> float:
        """user + system CPU seconds the server process has used so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def metrics(self) -> dict:
        """Prometheus text -> {name: value} with labels folded into the key as name{a="b"}, model_name dropped."""
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = METRIC_LINE.match(line)
            if not m:
                continue
            labels = [(k, v) for k, v in LABEL.findall(m.group(3) or "") if k != "model_name"]
            key = m.group(1) + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels)) + "}" if labels else "")
            out[key] = float(m.group(4))
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def openai_client(url: str):
    import openai
    # No retries: a failed request must show, not be silently repeated and timed twice.
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)


def stream_chat(client, model: str, messages: list[dict], max_tokens: int, seed: int) -> dict:
    """One streaming chat completion of exactly `max_tokens` tokens (ignore_eos + min_tokens).
    TTFT: request sent -> first chunk with content; gaps: between consecutive content chunks (one chunk per
    engine step that produced text, so one token except when text is held back, e.g. a split UTF-8 char)."""
    t0 = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0, seed=seed, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "min_tokens": max_tokens})
    times = []
    usage = None
    for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(now)
    t1 = time.perf_counter()
    if usage is None or not times:
        raise RuntimeError(f"stream without usage or content: usage={usage} chunks={len(times)}")
    details = getattr(usage, "prompt_tokens_details", None)
    return {"start": t0, "end": t1, "ttft": times[0] - t0, "gaps": [b - a for a, b in zip(times, times[1:])],
            "chunks": len(times), "completion_tokens": usage.completion_tokens,
            "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": getattr(details, "cached_tokens", None) if details is not None else None}


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def machine() -> dict:
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name")), "")
    except OSError:
        pass
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return {"cpu": model, "nproc": int(nproc) if nproc.isdigit() else os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in os.getloadavg()]}


def git_commit() -> dict:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.split("\n")
    return {"commit": head, "tracked_files_modified": sum(1 for l in dirty if l.strip())}


def wait_for_quiet(max_load: float, max_wait: float) -> dict:
    """Wait (polling every 15 s, up to max_wait s) until the 1-minute load average is <= max_load: other
    processes on a small machine take the cores the server would use."""
    t0 = time.time()
    while os.getloadavg()[0] > max_load and time.time() - t0 < max_wait:
        print(f"load {os.getloadavg()[0]:.2f} > {max_load}: waiting", file=sys.stderr, flush=True)
        time.sleep(15)
    load = os.getloadavg()
    return {"waited_s": round(time.time() - t0, 1), "loadavg_at_start": [round(x, 2) for x in load],
            "quiet": load[0] <= max_load}


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
