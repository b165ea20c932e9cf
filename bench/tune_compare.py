#!/usr/bin/env python3
"""Is `stoke tune`'s walk within 5 % of the grid's best? The two configs measured again, head to head.

The grid's best is the largest of ~50 single windows, so it keeps the luck of its best draw; the walk's choice
was seen in one or a few windows of its own. This script takes the walk's chosen knobs (WALK/tune.json) and the
grid's best --top configs (GRID/tune.json, accepted points by goodput), serves each as tune did (`stoke serve`
with the knobs as flags, tune.json's `serve_args`, a free port), measures it with `stoke bench` (same load,
workload, SLOs and pre-built requests), and alternates the configs round by round so drift hits all alike.
Verdict: the walk's median goodput against the best median; within --tolerance (5 %) passes. A config whose
p99 is over the SLO in a round scores that round's goodput all the same (bench counts the requests that met
it) and is flagged.

  python3 bench/tune_compare.py --stoke .bundle/bin/stoke --walk $OUT/tune_bert --grid $OUT/tune_bert_grid \\
      --workload /tmp/bert_128.jsonl --rounds 3 --window 4 -o $OUT/tune_bert_compare.json

Standard library only; exit 0 whatever the verdict (it is in the JSON and on stdout), 1 when nothing could be
measured, 2 on bad input.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

FLAGS = {"max_batch_size": "--max-batch-size", "max_queue_delay_us": "--max-queue-delay-us",
         "instances": "--instances", "max_num_seqs": "--max-num-seqs",
         "max_num_batched_tokens": "--max-num-batched-tokens"}


def knob_flags(knobs):
    """tune.json's knobs ("own" = the server's) -> the stoke serve flags tune gave (Knobs::Flags)."""
    a = []
    for k, v in knobs.items():
        if v == "own":
            continue
        if k in FLAGS:
            a += [FLAGS[k], str(v)]
        elif k == "chunked_prefill" and v == "off":
            a.append("--no-chunked-prefill")
        elif k == "cuda_graphs":
            a += ["--cuda-graphs", v]
    return a


def describe(knobs):
    return ", ".join(f"{k} {v}" for k, v in knobs.items())


def start_server(stoke, args, log_path, timeout_s=300):
    log = open(log_path, "w")
    p = subprocess.Popen([stoke, "serve", *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.time() + timeout_s
    url = None
    while time.time() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"stoke serve exited {p.returncode}: " + open(log_path).read()[-1500:])
        if url is None:
            m = re.search(r"listening on (http://\S+)", open(log_path).read())
            url = m.group(1) if m else None
        if url:
            try:
                with urllib.request.urlopen(url + "/health/ready", timeout=5) as r:
                    if r.status == 200:
                        return p, url
            except OSError:
                pass
        time.sleep(0.05)
    p.kill()
    raise RuntimeError("stoke serve was not ready: " + open(log_path).read()[-1500:])


def stop_server(p):
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def bench_args(tune, a):
    """stoke bench's flags for the load tune measured with (tune.json) and this script's options."""
    load = tune["load"]
    args = ["--concurrency" if load["mode"] == "concurrency" else "--rate", str(load["value"]),
            "--warmup", str(a.warmup), "--window", str(a.window), "--duration", str(a.window), "--stability", "0",
            "--quiet", "--no-scrape"]
    if tune["kind"] == "decoder":
        args += ["--api", "openai-chat", "--prebuilt-requests", str(a.prebuilt or 2048)]
    else:
        args += ["--api", "kserve-http", "--prebuilt-requests", str(a.prebuilt or 512)]
    slo = tune["slo"]
    parts = [f"{name}={slo[key]}ms" for key, name in (("p99_ms", "e2e"), ("ttft_p99_ms", "ttft"),
                                                     ("tpot_p99_ms", "tpot")) if slo.get(key, 0) > 0]
    if parts:
        args += ["--slo", ",".join(parts)]
    if a.workload:
        args += ["--workload", a.workload]
    return args + a.bench_args.split()


def measure(stoke, serve_args, bench, served_name, work, tag):
    p, url = start_server(stoke, serve_args, os.path.join(work, tag + ".serve.log"))
    try:
        out = os.path.join(work, tag)
        r = subprocess.run([stoke, "bench", "--url", url, "--model", served_name, *bench, "--output-dir", out],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"stoke bench exited {r.returncode}: {(r.stdout + r.stderr)[-1500:]}")
        pt = json.load(open(os.path.join(out, "bench.json")))["points"][0]
    finally:
        stop_server(p)
    return {"goodput_rps": pt["goodput"]["requests_per_s"], "requests_per_s": pt["throughput"]["requests_per_s"],
            "p99_ms": pt["latency_ms"].get("p99"), "ttft_p99_ms": pt["ttft_ms"].get("p99"),
            "tpot_p99_ms": pt["tpot_ms"].get("p99"), "valid": pt.get("valid", True),
            "generator_cpu_percent": pt["generator"]["cpu_percent"]}


def candidates(walk, grid, top):
    """The walk's choice first, then the grid's best `top` accepted points (by goodput), without repeats."""
    out = [("walk", walk["chosen"])]
    pts = sorted((m for m in grid["measurements"] if m["accepted"]), key=lambda m: -m["goodput_rps"])
    for m in pts:
        if len(out) > top:
            break
        if all(m["knobs"] != k for _, k in out):
            out.append((f"grid#{m['index']} ({m['goodput_rps']:.0f}/s there)", m["knobs"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stoke", required=True)
    ap.add_argument("--walk", required=True, help="tune --out DIR of the walk")
    ap.add_argument("--grid", required=True, help="tune --out DIR of the --grid run")
    ap.add_argument("--workload", default="", help="as given to tune (--workload)")
    ap.add_argument("--bench-args", default="", help="more stoke bench flags (e.g. --input-len 512)")
    ap.add_argument("--top", type=int, default=2, help="the grid's best configs to measure")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=1)
    ap.add_argument("--window", type=float, default=4)
    ap.add_argument("--prebuilt", type=int, default=0, help="pre-built requests (0: tune's default)")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    try:
        walk = json.load(open(os.path.join(a.walk, "tune.json")))
        grid = json.load(open(os.path.join(a.grid, "tune.json")))
    except (OSError, ValueError) as e:
        sys.exit(f"tune_compare: {e}")
    if walk.get("mode") != "walk" or grid.get("mode") != "grid":
        print("tune_compare: --walk must be a walk's tune.json and --grid a --grid run's", file=sys.stderr)
        return 2
    base = ["--model", walk["model"], "--port", "0", "--grpc-port", "-1", "--drain-seconds", "1"]
    if walk.get("device") not in ("", "model's own", None):
        base += ["--device", walk["device"]]
    bench = bench_args(walk, a)
    configs = [{"label": label, "knobs": k, "flags": knob_flags(k), "rounds": []}
               for label, k in candidates(walk, grid, a.top)]
    work = tempfile.mkdtemp(prefix="tune_compare")
    for rnd in range(a.rounds):
        for i, c in enumerate(configs):
            try:
                m = measure(a.stoke, base + c["flags"] + walk.get("serve_args", []), bench, walk["served_name"],
                            work, f"r{rnd}_c{i}")
            except RuntimeError as e:
                m = {"error": str(e)[:400], "goodput_rps": 0}
            c["rounds"].append(m)
            print(f"round {rnd} {c['label']:28} {describe(c['knobs'])}: goodput {m['goodput_rps']:.1f}/s "
                  f"p99 {m.get('p99_ms') or 0:.1f} ms{'  ' + m['error'] if 'error' in m else ''}", flush=True)
    for c in configs:
        g = [m["goodput_rps"] for m in c["rounds"]]
        c["median_goodput_rps"] = statistics.median(g)
        c["spread"] = (max(g) - min(g)) / c["median_goodput_rps"] if c["median_goodput_rps"] else None
    best = max(configs, key=lambda c: c["median_goodput_rps"])
    ratio = configs[0]["median_goodput_rps"] / best["median_goodput_rps"] if best["median_goodput_rps"] else 0
    verdict = (f"the walk's choice ({describe(configs[0]['knobs'])}) reaches {100 * ratio:.1f} % of the best "
               f"median goodput ({best['label']}: {best['median_goodput_rps']:.1f}/s) over {a.rounds} rounds: "
               + ("within" if ratio >= 1 - a.tolerance else "NOT within") + f" {100 * a.tolerance:.0f} %")
    out = {"what": "stoke tune's walk against the grid's best, re-measured head to head (bench/tune_compare.py)",
           "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "walk": {"measurement_count": walk["measurement_count"], "measuring_s": walk["measuring_s"]},
           "grid": {"measurement_count": grid["measurement_count"], "measuring_s": grid["measuring_s"],
                    "budget_exhausted": grid.get("budget_exhausted")},
           "bench_args": bench, "configs": configs, "ratio": ratio,
           "within_tolerance": ratio >= 1 - a.tolerance, "verdict": verdict}
    json.dump(out, open(a.out, "w"), indent=1)
    print(verdict)
    return 0 if best["median_goodput_rps"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
