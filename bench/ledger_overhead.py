#!/usr/bin/env python3
"""What the per-request time ledger costs: throughput with the ledger recorded vs `stoke serve --no-ledger`.

Issue 12 asks for < 1 % throughput overhead. Two servers of the same model run side by side, one recording
ledgers (the default) and one with `--no-ledger`; `stoke bench` drives them in turn, alternating within each
round and swapping the order every round (AB, BA, AB, ...), so drift of the machine (other users, clocks, heat)
falls on both alike. Only one server is driven at a time; the other sits idle.

Cases (closed loop, `stoke bench --stability 0`, fixed window per point):
  synthetic  a zero-cost synthetic model (64-byte input/output, no kernels, no CPU cost) over KServe HTTP at
             c=64: the server's own per-request overhead is all there is to measure (requests/s)
  llm        smollm2-135m-instruct decode over OpenAI completions (streaming) at c=16, 32 prompt tokens,
             64 generated (output tokens/s)

Self-contained: Python 3 standard library and the stoke binary (no pip packages; runs on the GPU machine).

  python3 bench/ledger_overhead.py --stoke build/release/apps/stoke/stoke --out bench/results/x.json
  python3 bench/ledger_overhead.py --stoke .bundle/bin/stoke --device cuda --llm-model /path/SmolLM2-135M-Instruct.Q4_1.gguf \
      --out $OUT/ledger_gpu.json      # the GPU machine has no internet: give the GGUF (scripts/split_for_device.sh)

On a slow CPU pass --llm-output-len 16 --llm-seconds 30 so that every window completes requests. The result
JSON holds per round both figures and their ratio, the medians, the spread of the per-round ratios, and how many
requests the ledger histogram counted on each server (the --no-ledger one must show 0).
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Server:
    def __init__(self, stoke, model, extra, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [stoke, "serve", "--model", model, "--port", str(self.port), "--no-gpu-telemetry"] + extra
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s=600):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}): {' '.join(self.cmd)}")
            try:
                http_get(self.url + "/health/ready", timeout=1)
                return
            except Exception:
                time.sleep(0.3)
        raise RuntimeError(f"server not ready in {timeout_s} s: {' '.join(self.cmd)}")

    def stage_count(self):
        """Requests the ledger histogram counted (stoke:request_stage_seconds{stage="recv"}_count)."""
        total = 0.0
        for line in http_get(self.url + "/metrics").splitlines():
            if line.startswith(("stoke:request_stage_seconds_count", "stoke_request_stage_seconds_count")) \
                    and 'stage="recv"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def cpu_seconds(self):
        """The server process's user + system CPU time so far (/proc/PID/stat)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def run_bench(stoke, server, case, seconds, warmup, out_dir):
    seconds = seconds or case["seconds"]
    cmd = [stoke, "bench", "--url", server.url, "--concurrency", str(case["concurrency"]),
           "--duration", str(seconds), "--window", str(seconds), "--stability", "0", "--warmup", str(warmup),
           "--no-scrape", "--quiet", "--output-dir", out_dir] + case["bench_args"]
    cpu0 = server.cpu_seconds()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=seconds * 4 + 300)
    cpu = server.cpu_seconds() - cpu0
    with open(os.path.join(out_dir, "bench.json")) as f:
        point = json.load(f)["points"][0]
    done = point["requests"].get("succeeded", 0)
    # Server CPU time per request: less sensitive to other load on the machine than throughput. Exact with
    # --warmup 0 (the default: each server is warmed once before the rounds); with a warm-up the warm-up's
    # requests are in the CPU time but not in the count.
    return {"value": point["throughput"][case["metric"]], "requests": done, "valid": point["valid"],
            "server_cpu_s": cpu, "server_cpu_ms_per_request": 1e3 * cpu / done if done else None,
            "p50_ms": point["latency_ms"].get("p50"), "p99_ms": point["latency_ms"].get("p99")}


def spread(xs):
    return {"min": min(xs), "max": max(xs), "median": statistics.median(xs)}


def run_case(args, case, work):
    servers = {}
    try:
        for name, extra in (("ledger_on", []), ("ledger_off", ["--no-ledger"])):
            servers[name] = Server(args.stoke, case["model"], case["serve_args"] + extra,
                                   os.path.join(work, f"serve_{case['name']}_{name}.log"))
        for s in servers.values():
            s.wait_ready()
        for name, s in servers.items():  # warm-up: caches, the first requests' allocations
            run_bench(args.stoke, s, case, max(2.0, case["seconds"] / 2), 0,
                      os.path.join(work, f"warm_{case['name']}_{name}"))
        rounds = []
        for r in range(args.rounds):
            order = ["ledger_on", "ledger_off"] if r % 2 == 0 else ["ledger_off", "ledger_on"]
            row = {"round": r + 1, "order": order}
            for name in order:
                d = os.path.join(work, f"{case['name']}_{name}_{r + 1}")
                row[name] = run_bench(args.stoke, servers[name], case, None, args.warmup, d)
            on_v, off_v = row["ledger_on"]["value"], row["ledger_off"]["value"]
            # A point where no request finished in the window has no throughput: the round is left out.
            row["ratio_off_over_on"] = off_v / on_v if on_v > 0 and off_v > 0 else None
            rounds.append(row)
            print(f"  {case['name']} round {r + 1}: on {on_v:.1f}  off {off_v:.1f}  off/on "
                  f"{row['ratio_off_over_on']}", file=sys.stderr)
        # The switch really switched: the ledger histogram counted requests only where it was on.
        counted = {name: s.stage_count() for name, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop()
    ok = [r for r in rounds if r["ratio_off_over_on"] is not None]
    if not ok:
        raise RuntimeError(f"{case['name']}: no round finished a request in its window (raise --seconds)")
    on = [r["ledger_on"]["value"] for r in ok]
    off = [r["ledger_off"]["value"] for r in ok]
    ratios = [r["ratio_off_over_on"] for r in ok]
    cpu_on = [r["ledger_on"]["server_cpu_ms_per_request"] for r in ok]
    cpu_off = [r["ledger_off"]["server_cpu_ms_per_request"] for r in ok]
    cpu_ratios = [a / b for a, b in zip(cpu_on, cpu_off)]
    med_on, med_off = statistics.median(on), statistics.median(off)
    return {
        "case": case["name"], "what": case["what"], "metric": case["metric"], "concurrency": case["concurrency"],
        "seconds_per_point": case["seconds"], "serve": case["serve_args"], "bench": case["bench_args"],
        "rounds": rounds, "rounds_used": len(ok),
        "ledger_on": spread(on), "ledger_off": spread(off),
        "ratio_off_over_on_of_medians": med_off / med_on,
        "overhead_pct_of_medians": (med_off / med_on - 1) * 100,
        "per_round_ratio": spread(ratios),
        "server_cpu_ms_per_request_on": spread(cpu_on), "server_cpu_ms_per_request_off": spread(cpu_off),
        "cpu_per_request_on_over_off_of_medians": statistics.median(cpu_on) / statistics.median(cpu_off),
        "per_round_cpu_ratio_on_over_off": spread(cpu_ratios),
        "ledger_requests_counted_on_metrics": counted,
    }


def machine(device):
    m = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            m["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except Exception:
        pass
    if device == "cuda" and shutil.which("nvidia-smi"):
        m["gpu"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    return m


def git_commit(stoke):
    try:
        head = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", HERE, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except Exception:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stoke", required=True, help="the stoke binary")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cases", default="synthetic,llm")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=10, help="measured seconds per synthetic point")
    ap.add_argument("--llm-seconds", type=float, default=20, help="measured seconds per LLM point")
    ap.add_argument("--llm-output-len", type=int, default=64,
                    help="generated tokens per LLM request (a slow CPU needs fewer to finish requests in a window)")
    ap.add_argument("--warmup", type=float, default=0,
                    help="warm-up seconds before each point (each server is also warmed once before the rounds)")
    ap.add_argument("--llm-model", default="smollm2-135m-instruct")
    ap.add_argument("--llm-concurrency", type=int, default=16)
    ap.add_argument("--synthetic-concurrency", type=int, default=64)
    ap.add_argument("--out", required=True, help="JSON result")
    ap.add_argument("--keep", help="folder for server logs and bench reports (default: a temporary one)")
    args = ap.parse_args()
    args.stoke = os.path.abspath(args.stoke)

    work = args.keep or tempfile.mkdtemp(prefix="stoke_ledger_")
    os.makedirs(work, exist_ok=True)
    model_file = os.path.join(work, "zero.json")
    with open(model_file, "w") as f:
        json.dump({"type": "synthetic", "name": "zero", "device": args.device, "input_bytes": 64,
                   "output_bytes": 64, "max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 0},
                   "instance_group": [{"count": 1}]}, f)
    device = ["--device", args.device]
    cases = {
        "synthetic": {"name": "synthetic", "model": model_file, "serve_args": device + ["--grpc-port", "-1"],
                      "concurrency": args.synthetic_concurrency, "metric": "requests_per_s", "seconds": args.seconds,
                      "bench_args": ["--api", "kserve-http", "--model", "zero"],
                      "what": "zero-cost synthetic model (64 B in/out, no kernels), KServe v2 HTTP JSON, "
                              "max_batch_size 8, delay 0"},
        "llm": {"name": "llm", "model": args.llm_model, "serve_args": device,
                "concurrency": args.llm_concurrency, "metric": "output_tokens_per_s", "seconds": args.llm_seconds,
                "bench_args": ["--api", "openai-completions", "--input-len", "32", "--output-len",
                               str(args.llm_output_len)],
                "what": f"{args.llm_model} decode, OpenAI completions (streaming), 32 prompt tokens, "
                        f"{args.llm_output_len} generated (ignore_eos)"},
    }
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    results = []
    for name in args.cases.split(","):
        print(f"case {name}", file=sys.stderr)
        results.append(run_case(args, cases[name], work))
    out = {
        "what": "per-request time ledger overhead: throughput with ledgers recorded (default) vs "
                "`stoke serve --no-ledger`, two servers side by side, driven in turn (order swapped each round)",
        "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
        "commit": git_commit(args.stoke),
        "stoke": args.stoke,
        "device": args.device,
        "machine": machine(args.device),
        "date": started.strftime("%Y-%m-%d"),
        "started_utc": started.isoformat(timespec="seconds"),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "rounds": args.rounds, "warmup_s": args.warmup,
        "cases": results,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for c in results:
        print(f"{c['case']}: {c['metric']} median on {c['ledger_on']['median']:.1f} off "
              f"{c['ledger_off']['median']:.1f}: off/on {c['ratio_off_over_on_of_medians']:.4f} "
              f"(per round {c['per_round_ratio']['min']:.4f}-{c['per_round_ratio']['max']:.4f}); server CPU "
              f"ms/request on/off {c['cpu_per_request_on_over_off_of_medians']:.4f} (per round "
              f"{c['per_round_cpu_ratio_on_over_off']['min']:.4f}-{c['per_round_cpu_ratio_on_over_off']['max']:.4f})")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
