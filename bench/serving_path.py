#!/usr/bin/env python3
"""The serving path's own cost: a zero-cost synthetic model (no kernels, no pre/postprocessing, batch size 1)
served by `stoke serve`, driven by `stoke bench` over KServe HTTP (binary tensor extension) and gRPC at c=1 and
c=64, plus KServe HTTP with a 1 MiB binary input at c=1, twice: from `stoke bench` and from a raw-socket client
here that sends one pre-built request at a time (`stoke bench` draws each 1 MiB input element by element, which
costs it ~20 ms a request: that point measures the generator as much as the server). Reports the client's p50/p99 and the
server's own ledger (GET /v1/debug/requests): p50 of recv, queue, send and of recv+queue+send per request.

Self-contained: python3's standard library and the stoke binary. With --before, two binaries are measured
alternately (before, after, before, after, ...) so that machine noise hits both alike; the figures are the
medians over --reps repetitions.

    bench/serving_path.py --stoke build/release/apps/stoke/stoke -o out.json
    bench/serving_path.py --before /tmp/stoke.old --stoke build/release/apps/stoke/stoke --reps 3 -o out.json
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ZERO = {"type": "synthetic", "name": "zero", "input_bytes": 16, "output_bytes": 16, "kernels": [],
        "preprocess_us_per_item": 0, "postprocess_us_per_item": 0}
BIG = dict(ZERO, name="big", input_bytes=1 << 20)

# (name, model, api, concurrency)
POINTS = [
    ("http_c1", "zero", "kserve-http", 1),
    ("http_c64", "zero", "kserve-http", 64),
    ("grpc_c1", "zero", "kserve-grpc", 1),
    ("grpc_c64", "zero", "kserve-grpc", 64),
    ("http_1MiB_c1", "big", "kserve-http", 1),
    ("http_1MiB_c1_raw", "big", "raw-http", 1),
]


def raw_http_point(server, model, size, seconds):
    """c=1 over one keep-alive connection: a pre-built KServe binary request, sent whole, response read whole."""
    import socket
    hdr = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [size],
                                  "parameters": {"binary_data_size": size}}],
                      "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = hdr + bytes(size)
    req = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
           f"Inference-Header-Content-Length: {len(hdr)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    s = socket.create_connection(("127.0.0.1", server.http))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lat, errors = [], 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(lat) < 20:
        t = time.perf_counter()
        s.sendall(req)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                sys.exit("raw client: the server closed the connection")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        length = int(next(l for l in lines if l.lower().startswith("content-length")).split(":")[1])
        while len(rest) < length:
            rest += s.recv(65536)
        lat.append((time.perf_counter() - t) * 1e3)
        errors += lines[0].split()[1] != "200"
    s.close()
    lat.sort()
    return {"latency_ms": {"count": len(lat), "p50": statistics.median(lat), "p99": lat[int(0.99 * (len(lat) - 1))]},
            "throughput": {"requests_per_s": len(lat) / (time.perf_counter() - start)},
            "generator": {"cpu_percent": None}, "valid": errors == 0}


class Server:
    def __init__(self, stoke, model_file, log_path, http_threads):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [stoke, "serve", "--model", model_file, "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0",
             "--threads", "1", "--http-threads", str(http_threads), "--debug-requests", "4000",
             "--no-gpu-telemetry"], stdout=self.log, stderr=subprocess.STDOUT)
        self.http = int(self._wait(r"listening on http://[^:]+:(\d+)"))
        self.grpc = int(self._wait(r"gRPC listening on [^:]+:(\d+)"))
        self._wait(r"ready on")

    def _wait(self, pattern, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, open(self.log_path).read())
            if m:
                return m.group(1) if m.groups() else m.group(0)
            if self.proc.poll() is not None:
                sys.exit(f"stoke serve exited:\n{open(self.log_path).read()}")
            time.sleep(0.05)
        sys.exit(f"stoke serve did not print {pattern!r}:\n{open(self.log_path).read()}")

    def ledgers(self, model, n):
        url = f"http://127.0.0.1:{self.http}/v1/debug/requests?model={model}&limit={n}"
        return json.load(urllib.request.urlopen(url, timeout=30))["requests"]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def run_point(stoke, server, model, api, c, duration, workdir):
    if api == "raw-http":
        raw_http_point(server, model, BIG["input_bytes"], 1)  # warm-up
        p = raw_http_point(server, model, BIG["input_bytes"], duration)
    else:
        url = f"http://127.0.0.1:{server.http}" if api == "kserve-http" else f"127.0.0.1:{server.grpc}"
        out = os.path.join(workdir, "bench")
        cmd = [stoke, "bench", "--url", url, "--api", api, "--model", model, "--concurrency", str(c),
               "--warmup", "1", "--window", "1", "--duration", str(duration), "--stability", "0",
               "--kserve-binary", "--output-dir", out]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode not in (0, 3):
            sys.exit(f"stoke bench failed ({r.returncode}):\n{r.stderr[-3000:]}")
        p = json.load(open(os.path.join(out, "bench.json")))["points"][0]
    n = max(1, min(4000, int(p["latency_ms"]["count"])))
    led = [x["stages_ms"] for x in server.ledgers(model, n)]
    med = lambda k: statistics.median([x[k] for x in led]) * 1e3 if led else None
    return {
        "client_p50_ms": p["latency_ms"]["p50"],
        "client_p99_ms": p["latency_ms"]["p99"],
        "requests_per_s": p["throughput"]["requests_per_s"],
        "generator_cpu_percent": p["generator"]["cpu_percent"],
        "valid": p["valid"],
        "server_requests": len(led),
        "recv_p50_us": med("recv"),
        "queue_p50_us": med("queue"),
        "send_p50_us": med("send"),
        "recv_queue_send_p50_us": statistics.median([(x["recv"] + x["queue"] + x["send"]) * 1e3 for x in led])
        if led else None,
    }


def git_commit(path):
    try:
        d = os.path.dirname(os.path.realpath(path))
        return subprocess.run(["git", "-C", d, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stoke", required=True, help="the stoke binary to measure")
    ap.add_argument("--before", help="a second binary (the baseline), measured alternately with --stoke")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=4, help="measured seconds per point")
    ap.add_argument("--http-threads", type=int, default=2, help="stoke serve --http-threads for --stoke")
    ap.add_argument("--before-http-threads", type=int, help="the same for --before (default: --http-threads)")
    ap.add_argument("--points", default=",".join(p[0] for p in POINTS))
    ap.add_argument("--commit", help="the commit --stoke was built from (default: git at the binary's folder)")
    ap.add_argument("--before-commit", help="the commit --before was built from")
    ap.add_argument("-o", "--output", help="write the JSON here (also printed)")
    args = ap.parse_args()
    wanted = set(args.points.split(","))
    binaries = [("before", args.before), ("after", args.stoke)] if args.before else [("stoke", args.stoke)]
    runs = {label: {name: [] for name, *_ in POINTS if name in wanted} for label, _ in binaries}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for m in (ZERO, BIG):
            files[m["name"]] = os.path.join(tmp, m["name"] + ".json")
            json.dump(m, open(files[m["name"]], "w"))
        for rep in range(args.reps):
            for label, binary in binaries:
                servers = {}
                try:
                    for model in sorted({m for name, m, *_ in POINTS if name in wanted}):
                        threads = args.http_threads
                        if label == "before" and args.before_http_threads:
                            threads = args.before_http_threads
                        servers[model] = Server(binary, files[model], os.path.join(tmp, f"{label}_{model}.log"),
                                                threads)
                    for name, model, api, c in POINTS:
                        if name not in wanted:
                            continue
                        r = run_point(binary, servers[model], model, api, c, args.duration, tmp)
                        runs[label][name].append(r)
                        print(f"rep {rep + 1} {label:6} {name:16} client p50 {r['client_p50_ms']:.3f} ms "
                              f"p99 {r['client_p99_ms']:.3f} ms | server p50 recv {r['recv_p50_us']:.1f} "
                              f"queue {r['queue_p50_us']:.1f} send {r['send_p50_us']:.1f} "
                              f"sum {r['recv_queue_send_p50_us']:.1f} us", file=sys.stderr, flush=True)
                finally:
                    for s in servers.values():
                        s.stop()

    def medians(rs):
        keys = [k for k in rs[0] if isinstance(rs[0][k], (int, float)) and not isinstance(rs[0][k], bool)]
        out = {k: round(statistics.median([r[k] for r in rs if r[k] is not None]), 4) for k in keys}
        out["generator_cpu_percent"] = out.get("generator_cpu_percent")
        out["valid_reps"] = sum(1 for r in rs if r["valid"])
        return out

    result = {
        "benchmark": "serving_path",
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"nproc": os.cpu_count(), "cpu": cpu_model(), "kernel": platform.release()},
        "binaries": {label: {"path": b, "commit": (args.before_commit if label == "before" else args.commit)
                             or git_commit(b)} for label, b in binaries},
        "model": ZERO,
        "big_model": BIG,
        "reps": args.reps,
        "http_threads": {"before": args.before_http_threads or args.http_threads, "after": args.http_threads}
        if args.before else args.http_threads,
        "duration_s": args.duration,
        "figures": {label: {name: medians(rs) for name, rs in pts.items()} for label, pts in runs.items()},
        "runs": runs,
    }
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(result, indent=1)
    if args.output:
        open(args.output, "w").write(text + "\n")
    # The summary: one line per point and binary.
    print(f"{'point':17} {'binary':7} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>9} {'recv us':>8} {'queue us':>8} "
          f"{'send us':>8} {'r+q+s us':>8}")
    for name, *_ in POINTS:
        for label, _ in binaries:
            f = result["figures"][label].get(name)
            if f:
                print(f"{name:17} {label:7} {f['client_p50_ms']:8.3f} {f['client_p99_ms']:8.3f} "
                      f"{f['requests_per_s']:9.1f} {f['recv_p50_us']:8.1f} {f['queue_p50_us']:8.1f} "
                      f"{f['send_p50_us']:8.1f} {f['recv_queue_send_p50_us']:8.1f}")


if __name__ == "__main__":
    main()
