#!/usr/bin/env python3
"""The load generator's own cost: CPU time of `stoke bench`'s io thread per request, against a zero-cost
synthetic model (no sleep, no kernels, batch size 1) over KServe HTTP with JSON tensors, closed loop.

Variants, alternated within each repetition so machine load hits all alike:
  before      an older stoke binary (--before), its generator as it was
  after       this binary, requests built as they go (the DOM-free response check only)
  prebuilt    this binary with --prebuilt-requests N (requests built and serialized before the point)

Figure per run: generator CPU us/request = (cpu_percent / 100) x wall / requests, approximated as
(cpu_percent / 100) / requests_per_s (both from bench.json; the point's warm-up and drain are in cpu_percent's
wall too, so this slightly overstates it, alike for every variant). Medians over --reps.

  python3 bench/generator_cost.py --before /work/main/build/release/apps/stoke/stoke \\
      --after build/release/apps/stoke/stoke --reps 3 -o bench/results/cpu_bench_generator_cost_<date>.json
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = {
    # what BERT-base's response looks like to the client: thousands of numbers of JSON to check
    "bert_like": {"type": "synthetic", "name": "bert_like", "input_bytes": 512, "output_bytes": 3072,
                  "max_batch_size": 1},
    "tiny": {"type": "synthetic", "name": "tiny", "input_bytes": 16, "output_bytes": 16, "max_batch_size": 1},
}


def start_server(stoke, model_path, log):
    p = subprocess.Popen([stoke, "serve", "--model", model_path, "--port", "0", "--grpc-port", "-1",
                          "--http-threads", "1"], stderr=open(log, "w"), stdout=subprocess.DEVNULL)
    for _ in range(300):
        text = open(log).read()
        m = re.search(r"listening on (http://\S+)", text)
        if m and "ready" in text:
            return p, m.group(1)
        if m:
            url = m.group(1)
        time.sleep(0.05)
        if p.poll() is not None:
            raise RuntimeError(open(log).read())
    if 'url' in locals():
        return p, url
    raise RuntimeError("server did not start: " + open(log).read())


def run_bench(stoke, url, model, seconds, concurrency, prebuilt, out_dir):
    args = [stoke, "bench", "--url", url, "--api", "kserve-http", "--model", model, "--concurrency",
            str(concurrency), "--warmup", "1", "--window", str(seconds), "--duration", str(seconds),
            "--stability", "0", "--no-scrape", "--quiet", "--max-generator-cpu", "101", "--output-dir", out_dir]
    if prebuilt:
        args += ["--prebuilt-requests", str(prebuilt)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 120)
    if r.returncode != 0:
        raise RuntimeError(r.stdout + r.stderr)
    p = json.load(open(os.path.join(out_dir, "bench.json")))["points"][0]
    rps = p["throughput"]["requests_per_s"] if "throughput" in p else p["requests_per_s"]
    cpu = p["generator"]["cpu_percent"]
    return {"requests_per_s": rps, "cpu_percent": cpu, "cpu_us_per_request": cpu / 100 / rps * 1e6 if rps else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--server", help="stoke binary that serves (default: --after)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prebuilt", type=int, default=512)
    ap.add_argument("--before-commit", default="")
    ap.add_argument("--after-commit", default="")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    server_bin = a.server or a.after
    tmp = tempfile.mkdtemp(prefix="gencost")
    results = {}
    for name, cfg in MODELS.items():
        path = os.path.join(tmp, name + ".json")
        json.dump(cfg, open(path, "w"))
        proc, url = start_server(server_bin, path, os.path.join(tmp, name + ".log"))
        runs = {"before": [], "after": [], "prebuilt": []}
        try:
            for rep in range(a.reps):
                for variant, binary, prebuilt in (("before", a.before, 0), ("after", a.after, 0),
                                                  ("prebuilt", a.after, a.prebuilt)):
                    r = run_bench(binary, url, name, a.seconds, a.concurrency, prebuilt,
                                  os.path.join(tmp, f"{name}_{variant}_{rep}"))
                    runs[variant].append(r)
                    print(f"{name} rep {rep} {variant:8} {r['requests_per_s']:9.1f} req/s  generator "
                          f"{r['cpu_percent']:5.1f} %  {r['cpu_us_per_request']:6.1f} us/request", flush=True)
        finally:
            proc.terminate()
            proc.wait()
        results[name] = {
            "model": cfg,
            "runs": runs,
            "median_cpu_us_per_request": {v: statistics.median(x["cpu_us_per_request"] for x in rs)
                                          for v, rs in runs.items()},
            "median_requests_per_s": {v: statistics.median(x["requests_per_s"] for x in rs) for v, rs in runs.items()},
        }
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    out = {
        "what": "stoke bench's load generator: CPU time of its io thread per request against a zero-cost synthetic "
                "model (KServe HTTP, JSON tensors, closed loop), before vs after (DOM-free response check) vs after "
                "with pre-built requests",
        "command": " ".join(sys.argv),
        "before_commit": a.before_commit, "after_commit": a.after_commit,
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}",
        "load_average_at_end": load,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "concurrency": a.concurrency, "seconds": a.seconds, "reps": a.reps, "prebuilt_requests": a.prebuilt,
        "results": results,
    }
    json.dump(out, open(a.out, "w"), indent=1)
    for name, r in results.items():
        print(name, "median us/request:", {k: round(v, 1) for k, v in r["median_cpu_us_per_request"].items()},
              "req/s:", {k: round(v) for k, v in r["median_requests_per_s"].items()})


if __name__ == "__main__":
    main()
