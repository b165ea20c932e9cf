"""A real `stoke serve` process in classic mode (encoder or synthetic model behind the dynamic batcher, KServe v2
REST + gRPC, /v1/embeddings), for the test_kserve_*, test_embeddings_* and test_perf_analyzer tests.

Both ports are picked by the kernel (--port 0 --grpc-port 0) and read back from the lines stoke prints on stderr:
  stoke serve: listening on http://127.0.0.1:PORT (loading ...)
  stoke serve: gRPC listening on 127.0.0.1:PORT
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import tempfile
import time

import requests

from child_process import die_with_parent

READY_TIMEOUT_S = float(os.environ.get("STOKE_READY_TIMEOUT", "180"))


class ClassicServer:
    def __init__(self, stoke_bin, model, *extra, log_dir=None):
        self.log_path = pathlib.Path(log_dir or tempfile.mkdtemp(prefix="stoke-classic-")) / "stderr.log"
        self._log = open(self.log_path, "wb")
        # model None: the models come from `extra` (several --model flags, or --model-repository DIR).
        model_args = [] if model is None else ["--model", str(model)]
        self.args = [str(stoke_bin), "serve", *model_args, "--host", "127.0.0.1", "--port", "0",
                     "--grpc-port", "0", *map(str, extra)]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=self._log, stdin=subprocess.DEVNULL,
                                  preexec_fn=die_with_parent())
        self.port = int(self._wait_for(r"listening on http://[^:]+:(\d+)"))
        self.grpc_port = int(self._wait_for(r"gRPC listening on [^:]+:(\d+)"))
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.http_url = f"127.0.0.1:{self.port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self._wait_ready()

    def log(self):
        return self.log_path.read_text(errors="replace")

    def _fail(self, what):
        self.stop()
        raise RuntimeError(f"{what}\n--- stoke serve stderr ---\n{self.log()}")

    def _wait_for(self, pattern, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, self.log())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                self._fail(f"stoke serve exited with {self.proc.returncode} before printing {pattern!r}")
            time.sleep(0.05)
        self._fail(f"stoke serve did not print {pattern!r} within {timeout} s")

    def _wait_ready(self):
        deadline = time.time() + READY_TIMEOUT_S
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self._fail(f"stoke serve exited with {self.proc.returncode} while loading")
            try:
                if requests.get(self.base_url + "/v2/health/ready", timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        self._fail(f"/v2/health/ready not 200 within {READY_TIMEOUT_S} s")

    def get(self, path, **kw):
        return requests.get(self.base_url + path, timeout=kw.pop("timeout", 60), **kw)

    def post(self, path, **kw):
        return requests.post(self.base_url + path, timeout=kw.pop("timeout", 120), **kw)

    def metrics(self):
        """{(name, frozenset(labels.items())): value} from /metrics."""
        out = {}
        for line in self.get("/metrics").text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$', line)
            assert m, line
            labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
        return out

    def metric(self, name, **labels):
        want = set((k, str(v)) for k, v in labels.items())
        return sum(v for (n, ls), v in self.metrics().items() if n == name and want <= ls)

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def write_model_file(directory, **config):
    """A model file for `stoke serve --model FILE.json`; returns its path."""
    path = pathlib.Path(directory) / f"{config.get('name', 'model')}.json"
    path.write_text(json.dumps(config))
    return path


def stoke_embed(stoke_bin, model, texts):
    """`stoke embed` output for `texts`: the reference the server's embeddings must equal."""
    out = subprocess.run([str(stoke_bin), "embed", "--model", str(model), *texts], capture_output=True, check=True,
                         timeout=300)
    return json.loads(out.stdout)
