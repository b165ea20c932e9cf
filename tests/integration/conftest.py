"""Fixtures that run a real `stoke serve` process on a free loopback port with the real SmolLM2 model.

  server          the shared default server (session scope): .base_url, .metrics(), .proc
  start_server    a factory for servers with extra flags (e.g. --no-prefix-cache, --max-waiting 1);
                  every server it starts is stopped (SIGTERM) at the end of the session
  openai_client   an `openai.OpenAI` client for `server` (no retries: a 503 must stay a 503)
  smollm2_vocab   llama-cpp-python's tokenizer for the same GGUF file (the reference for token counts)

The servers listen on port 0 (the kernel picks a free port) and the fixture reads the port from the
"listening on http://host:port" line stoke prints on stderr, so parallel runs never collide.
"""
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest
import requests

from child_process import die_with_parent

READY_TIMEOUT_S = float(os.environ.get("STOKE_READY_TIMEOUT", "180"))
METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """Prometheus text -> {(name, ((label, value), ...)): float}, labels sorted."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = METRIC_LINE.match(line)
        assert m, f"unparsable metrics line: {line!r}"
        labels = tuple(sorted(LABEL.findall(m.group(3) or "")))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


class StokeServer:
    def __init__(self, args, log_path):
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self._log, stdin=subprocess.DEVNULL,
                                  preexec_fn=die_with_parent())
        self.port = self._wait_for_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    def log(self):
        return pathlib.Path(self.log_path).read_text(errors="replace")

    def _fail(self, what):
        self.stop()
        pytest.fail(f"{what}\n--- stoke serve stderr ---\n{self.log()}")

    def _wait_for_port(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            m = re.search(r"listening on http://[^:]+:(\d+)", self.log())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                self._fail(f"stoke serve exited with {self.proc.returncode} before listening")
            time.sleep(0.05)
        self._fail("stoke serve did not print its listening line within 30 s")

    def _wait_ready(self):
        deadline = time.time() + READY_TIMEOUT_S
        self.saw_not_ready = False
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self._fail(f"stoke serve exited with {self.proc.returncode} while loading")
            try:
                r = requests.get(self.base_url + "/health/ready", timeout=5)
                if r.status_code == 200:
                    return
                assert r.status_code == 503, r.text
                self.saw_not_ready = True
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        self._fail(f"/health/ready not 200 within {READY_TIMEOUT_S} s")

    def get(self, path, **kw):
        return requests.get(self.base_url + path, timeout=kw.pop("timeout", 60), **kw)

    def post(self, path, json=None, **kw):
        return requests.post(self.base_url + path, json=json, timeout=kw.pop("timeout", 120), **kw)

    def metrics_text(self):
        r = self.get("/metrics")
        assert r.status_code == 200, r.text
        return r.text

    def metrics(self):
        return parse_metrics(self.metrics_text())

    def metric(self, name, **labels):
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for (n, ls), v in self.metrics().items():
            if n == name and all((k, str(val)) in ls for k, val in labels.items()):
                total += v
        return total

    def model_name(self):
        return self.get("/v1/models").json()["data"][0]["id"]

    def stop(self, timeout=30):
        """SIGTERM, then wait; returns the exit code (kills after `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def start_server(stoke_bin, smollm2_path, tmp_path_factory):
    started = []

    def start(*extra, model=None):
        log = tmp_path_factory.mktemp("serve") / "stderr.log"
        args = [str(stoke_bin), "serve", "--model", str(model or smollm2_path), "--host", "127.0.0.1", "--port", "0",
                *map(str, extra)]
        server = StokeServer(args, log)
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def server(start_server):
    return start_server()


@pytest.fixture(scope="session")
def base_url(server):
    return server.base_url


@pytest.fixture(scope="session")
def model_name(server):
    return server.model_name()


@pytest.fixture(scope="session")
def openai_client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def smollm2_vocab(smollm2_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=str(smollm2_path), vocab_only=True, verbose=False)
