#!/usr/bin/env python3
"""The synthetic model with "device": "cuda" through a real `stoke serve` (KServe v2 REST, binary tensors), for the
GPU machine: standard library only (no pytest, no tritonclient there). For each example model file in
examples/synthetic/ (and instance-count variants): serve it, check every output row against the model's rule (byte j
= input byte j mod input_bytes XOR 0x5A), run a closed loop at concurrency 8 for a few seconds, and report throughput
and the mean of each ledger stage from /metrics. One JSON line per run on stdout and in OUT/synthetic_serve.jsonl.
Exit 1 if a server fails, a row is wrong, or the ledger lacks h2d/compute/d2h.

  python3 tests/gpu/synthetic_serve_check.py --stoke .bundle/bin/stoke --out /tmp/out [--seconds 4] [--cpu]
"""
import argparse
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
STAGES = ("recv", "queue", "preprocess", "h2d", "compute", "d2h", "postprocess", "send")


class Server:
    def __init__(self, stoke, model_file, log_path):
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen([stoke, "serve", "--model", str(model_file), "--port", "0", "--grpc-port", "-1"],
                                     stdout=subprocess.DEVNULL, stderr=self.log, stdin=subprocess.DEVNULL)
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline and self.proc.poll() is None:
            text = pathlib.Path(log_path).read_text(errors="replace")
            m = re.search(r"listening on http://[^:]+:(\d+)", text)
            if m and self.port is None:
                self.port = int(m.group(1))
            if "ready on" in text:
                return
            time.sleep(0.05)
        raise RuntimeError(f"stoke serve did not get ready:\n{pathlib.Path(log_path).read_text(errors='replace')}")

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        return self.proc.returncode


def infer(server, model, rows):
    """Binary-tensor KServe infer; returns the OUTPUT0 bytes."""
    raw = b"".join(rows)
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [len(rows), len(rows[0])],
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    req = urllib.request.Request(server.url(f"/v2/models/{model}/infer"), data=header + raw, method="POST",
                                 headers={"Inference-Header-Content-Length": str(len(header)),
                                          "Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        body = resp.read()
        n = int(resp.headers["Inference-Header-Content-Length"])
    return body[n:]


def expected(rows, out_bytes):
    return b"".join(bytes(r[j % len(r)] ^ 0x5A for j in range(out_bytes)) for r in rows)


def metrics(server):
    out = {}
    with urllib.request.urlopen(server.url("/metrics"), timeout=30) as resp:
        for line in resp.read().decode().splitlines():
            m = re.match(r'^stoke:request_stage_seconds_(sum|count)\{(.*)\}\s+(\S+)$', line)
            if m:
                stage = re.search(r'stage="([^"]+)"', m.group(2)).group(1)
                out.setdefault(stage, {})[m.group(1)] = float(m.group(3))
    return out


def run_one(stoke, model_file, name, seconds, out_dir):
    cfg = json.loads(pathlib.Path(model_file).read_text())
    in_bytes, out_bytes = cfg["input_bytes"], cfg["output_bytes"]
    server = Server(stoke, model_file, out_dir / f"serve_{name}.log")
    ok = True
    try:
        rng = random.Random(1)
        # Correctness: a few requests of 1..3 rows, sequential.
        for i in range(4):
            rows = [bytes(rng.getrandbits(8) for _ in range(min(in_bytes, 4096))) * (in_bytes // min(in_bytes, 4096))
                    for _ in range(1 + i % 3)]
            rows = [r + bytes(in_bytes - len(r)) for r in rows]
            if infer(server, cfg["name"], rows) != expected(rows, out_bytes):
                print(f"{name}: WRONG OUTPUT for {len(rows)} rows", file=sys.stderr)
                ok = False
        # Throughput: closed loop, concurrency 8, one row per request.
        before = metrics(server)
        row = [bytes(range(256)) * (in_bytes // 256) + bytes(in_bytes % 256)]
        done = [0]
        lock = threading.Lock()
        stop_at = time.time() + seconds

        def worker():
            while time.time() < stop_at:
                infer(server, cfg["name"], row)
                with lock:
                    done[0] += 1

        t0 = time.time()
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        time.sleep(0.2)
        after = metrics(server)
        stage_ms = {}
        for s in STAGES:
            n = after.get(s, {}).get("count", 0) - before.get(s, {}).get("count", 0)
            total = after.get(s, {}).get("sum", 0) - before.get(s, {}).get("sum", 0)
            stage_ms[s] = round(1e3 * total / n, 3) if n else None
        for s in ("h2d", "compute", "d2h"):
            if not stage_ms[s]:
                print(f"{name}: ledger stage {s} is empty or zero", file=sys.stderr)
                ok = False
        rec = {"run": name, "model_file": str(model_file), "instances": cfg.get("instance_group", [{}])[0].get("count", 1),
               "requests": done[0], "seconds": round(wall, 2), "req_per_s": round(done[0] / wall, 1),
               "mean_stage_ms": stage_ms, "ok": ok}
    finally:
        rc = server.stop()
    if rc != 0:
        print(f"{name}: stoke serve exited {rc}", file=sys.stderr)
        rec["ok"] = False
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stoke", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/stoke_gpu_out"))
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--cpu", action="store_true",
                    help="debug the script on a machine without a GPU: device cpu, kernel work scaled by 1/100")
    a = ap.parse_args()
    out_dir = pathlib.Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="synthetic_gpu_"))
    runs = []
    for base in ("small_kernels", "cpu_preprocess", "bandwidth"):
        cfg = json.loads((ROOT / "examples/synthetic" / f"{base}.json").read_text())
        for count in (1, 2, 4):
            cfg["instance_group"] = [{"count": count}]
            if a.cpu:
                cfg.update(device="cpu", cpu_scale=0.01)
            f = tmp / f"{base}_x{count}.json"
            f.write_text(json.dumps(cfg))
            runs.append((f"{base}_x{count}", f))
    all_ok = True
    with open(out_dir / "synthetic_serve.jsonl", "w") as log:
        for name, f in runs:
            try:
                rec = run_one(a.stoke, f, name, a.seconds, out_dir)
            except Exception as e:  # noqa: BLE001 - report and go on to the next run
                rec = {"run": name, "ok": False, "error": str(e)[-2000:]}
            all_ok &= rec["ok"]
            line = json.dumps(rec)
            print(line, flush=True)
            log.write(line + "\n")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
