#!/usr/bin/env python3
"""Dynamic batching and instances on the CPU, measured with perf_analyzer against `stoke serve`:

  1. all-MiniLM-L6-v2 (BYTES "text", ~16-token sentences): throughput and p99 at concurrency 1..64 with
     batching off vs on at a few max_queue_delay values; the gain at equal p99 is read off the curves.
  2. the synthetic model (bench/synthetic/*.json) with 1 vs 2 vs 4 instances.

  .venv/bin/python bench/classic_batching.py [--stoke build/release/apps/stoke/stoke] [--protocol grpc]
        [--concurrency 1,2,4,8,16,32,64] [--window-ms 2000] [--only minilm|synthetic]

Each point is one perf_analyzer run at one concurrency (its stability rule: 3 windows within --stability %),
the server's statistics diffed around it for the average batch size. One server per configuration.
Writes bench/results/cpu_classic_batching_<date>.json = {command, commit, machine, date, minilm, synthetic}.
"""
import argparse
import csv
import datetime
import json
import os
import pathlib
import platform
import random
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from classic_server import ClassicServer, write_model_file  # noqa: E402

MODEL_DIR = pathlib.Path(os.environ.get("STOKE_MODEL_DIR", pathlib.Path.home() / ".cache/stoke/models"))
SUBJECTS = ["The old farmer", "A young engineer", "My neighbour", "The tired doctor", "Our new teacher"]
VERBS = ["repaired", "painted", "described", "sold", "carried", "measured", "cleaned", "discovered"]
OBJECTS = ["the broken fence", "a wooden boat", "an ancient map", "the red bicycle", "a heavy suitcase"]
PLACES = ["near the river", "after lunch", "in the rain", "at the market", "on Sunday", "by the station"]


def perf_analyzer_env():
    exe = os.environ.get("STOKE_PERF_ANALYZER", str(ROOT / ".venv/perf_analyzer/bin/perf_analyzer"))
    env = dict(os.environ)
    try:
        import nvidia.cuda_runtime
        lib = str(pathlib.Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib")
        env["LD_LIBRARY_PATH"] = lib + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    except ImportError:
        pass
    return exe, env


def input_data(path, n=200, seed=1):
    rng = random.Random(seed)
    data = [{"text": {"content": [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
                                  f"{rng.choice(PLACES)}."], "shape": [1]}} for _ in range(n)]
    path.write_text(json.dumps({"data": data}))
    return path


def stats(server, model):
    s = server.get(f"/v2/models/{model}/stats").json()["model_stats"][0]
    return s["inference_count"], s["execution_count"]


def point(args, server, model, concurrency, extra, tmp):
    exe, env = perf_analyzer_env()
    url = server.grpc_url if args.protocol == "grpc" else server.http_url
    out = pathlib.Path(tmp) / f"pa_{model}_{concurrency}.csv"
    cmd = [exe, "-m", model, "-u", url, "-i", args.protocol, "--concurrency-range", str(concurrency),
           "--measurement-interval", str(args.window_ms), "--stability-percentage", str(args.stability),
           "--max-trials", "8", "-f", str(out), *extra]
    inf0, exe0 = stats(server, model)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    inf1, exe1 = stats(server, model)
    if p.returncode != 0 or not out.exists():
        return {"concurrency": concurrency, "error": (p.stdout + p.stderr)[-500:]}
    row = next(csv.DictReader(out.open()))
    return {
        "concurrency": concurrency,
        "throughput": float(row["Inferences/Second"]),
        "p50_ms": int(row["p50 latency"]) / 1000,
        "p99_ms": int(row["p99 latency"]) / 1000,
        "server_queue_ms": int(row["Server Queue"]) / 1000,
        "server_compute_ms": int(row["Server Compute Infer"]) / 1000,
        "avg_batch": round((inf1 - inf0) / max(1, exe1 - exe0), 2),
        "stable": "Failed to obtain stable measurement" not in p.stdout,
    }


def best_under(points, p99_ms):
    ok = [p for p in points if "throughput" in p and p["p99_ms"] <= p99_ms]
    return max((p["throughput"] for p in ok), default=0.0)


def run_minilm(args, tmp):
    configs = [("off", None), ("delay_0us", 0), ("delay_1000us", 1000), ("delay_5000us", 5000)]
    data = input_data(pathlib.Path(tmp) / "sentences.json")
    out = {"model": "all-MiniLM-L6-v2 (fp32), BYTES text of ~16 tokens", "max_batch_size": 32, "instances": 1,
           "threads": args.threads, "configs": {}}
    for name, delay in configs:
        cfg = dict(type="bert", model=str(MODEL_DIR / "all-minilm-l6-v2"), name="minilm", max_batch_size=32)
        if delay is not None:
            cfg["dynamic_batching"] = {"max_queue_delay_microseconds": delay}
        model = write_model_file(tmp, **cfg)
        server = ClassicServer(args.stoke, model, "--threads", args.threads, log_dir=tmp)
        try:
            points = [point(args, server, "minilm", c, ["--input-data", str(data)], tmp) for c in args.concurrency]
        finally:
            server.stop()
        out["configs"][name] = points
        print(name, json.dumps(points), flush=True)
    targets = sorted({p["p99_ms"] for p in out["configs"]["off"] if "p99_ms" in p})
    out["equal_p99"] = [{"p99_ms_at_most": t, **{n: best_under(pts, t) for n, pts in out["configs"].items()}}
                        for t in targets]
    return out


def run_synthetic(args, tmp):
    out = {}
    for scenario in ("cpu_preprocess", "bandwidth"):
        base = json.loads((ROOT / "bench" / "synthetic" / f"{scenario}.json").read_text())
        res = {"config": base, "instances": {}}
        for n in (1, 2, 4):
            cfg = dict(base, instance_group=[{"count": n}])
            model = write_model_file(tmp, **cfg)
            server = ClassicServer(args.stoke, model, log_dir=tmp)
            try:
                res["instances"][str(n)] = [point(args, server, base["name"], c, [], tmp) for c in (1, 16)]
            finally:
                server.stop()
            print(scenario, n, json.dumps(res["instances"][str(n)]), flush=True)
        out[scenario] = res
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stoke", default=str(ROOT / "build/release/apps/stoke/stoke"))
    ap.add_argument("--protocol", default="grpc", choices=["grpc", "http"])
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--window-ms", type=int, default=2000)
    ap.add_argument("--stability", type=int, default=50)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--only", choices=["minilm", "synthetic"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    result = {
        "command": "bench/classic_batching.py " + shlex.join(sys.argv[1:]),
        "commit": commit + (" (dirty tree)" if dirty else ""),
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(),
                    "loadavg_before": list(os.getloadavg())},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "method": f"perf_analyzer ({args.protocol}) one concurrency per run, {args.window_ms} ms windows, "
                  f"stability {args.stability}%, max 8 windows; avg_batch from the server's statistics",
    }
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "minilm"):
            result["minilm"] = run_minilm(args, tmp)
        if args.only in (None, "synthetic"):
            result["synthetic"] = run_synthetic(args, tmp)
    result["machine"]["loadavg_after"] = list(os.getloadavg())
    date = result["date"][:10]
    path = pathlib.Path(args.out or ROOT / "bench" / "results" / f"cpu_classic_batching_{date}.json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
