#!/usr/bin/env python3
"""Soak: N concurrent client connections for T seconds against running stoke servers, counting every response.

  python bench/soak.py --openai http://127.0.0.1:8000 --kserve http://127.0.0.1:8100 --grpc 127.0.0.1:8101 \
      --connections 200 --seconds 180 --out bench/results/soak.json
  # one process serving both (stoke serve --model chat=... --model minilm=...):
  python bench/soak.py --openai URL --kserve URL --grpc HOST:PORT --chat-model chat --kserve-model minilm ...

Each connection is a thread with its own keep-alive HTTP session that loops until the time is up, each time
picking one operation among those its servers offer: chat completion (non-streaming or streaming, exactly
--max-tokens tokens with ignore_eos), KServe v2 REST infer, /v1/embeddings (when the KServe server is an encoder),
KServe v2 gRPC ModelInfer (over a few shared channels). Every response is checked:
  ok          the right status and a well-formed body (token counts, [DONE], output shapes)
  backpressure 503 with Retry-After (gRPC UNAVAILABLE): the documented load shedding
  malformed   200 whose body is wrong
  5xx         any other 5xx (gRPC: any other error status)
  lost        no response (connection error, reset, timeout)
Per minute: requests, outcomes, p50/p99 latency; and per server (found by its listening port in /proc, or given
with --pid URL=PID) its RSS and open descriptors, sampled every --sample-seconds, and once more --settle-seconds
after the load (the descriptors should be back). Exit status 1 when anything was lost, malformed or a 5xx other than
503. The JSON has the command, commit, machine (nproc, uname -a, load average before and after) and date.

The client raises its own descriptor limit (RLIMIT_NOFILE) to the hard limit, so it can hold --connections
connections; the server raises its own at start.
"""
import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import random
import re
import resource
import subprocess
import sys
import threading
import time
import urllib.parse

import requests

OUTCOMES = ("ok", "backpressure", "malformed", "5xx", "lost")


def listening_pid(port):
    """The PID of the process listening on TCP `port` on this machine (None if not found)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


def proc_sample(pid):
    try:
        status = open(f"/proc/{pid}/status").read()
        rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
        return {"rss_kb": rss_kb, "fds": len(os.listdir(f"/proc/{pid}/fd"))}
    except (OSError, AttributeError):
        return None


def percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Recorder:
    def __init__(self, start):
        self.start = start
        self.mu = threading.Lock()
        self.events = []  # (t since start, op, outcome, latency s)
        self.examples = {}  # outcome -> first few descriptions

    def add(self, op, outcome, latency, detail=None):
        with self.mu:
            self.events.append((time.time() - self.start, op, outcome, latency))
            if outcome not in ("ok", "backpressure") and detail is not None:
                self.examples.setdefault(f"{op}:{outcome}", [])
                if len(self.examples[f"{op}:{outcome}"]) < 5:
                    self.examples[f"{op}:{outcome}"].append(str(detail)[:300])


def classify_http(r, check):
    if r.status_code == 503:
        return "backpressure" if r.headers.get("Retry-After") else "5xx"
    if r.status_code >= 500:
        return "5xx"
    if r.status_code != 200:
        return "malformed"
    try:
        return "ok" if check(r) else "malformed"
    except (ValueError, KeyError, IndexError, TypeError):
        return "malformed"


class Ops:
    """The operations the given servers offer, each a function(session) -> (outcome, detail)."""

    def __init__(self, args):
        self.args = args
        self.ops = []
        if args.openai:
            self.chat_model = args.chat_model or \
                requests.get(args.openai + "/v1/models", timeout=30).json()["data"][0]["id"]
            self.ops += [("chat", self.chat), ("chat_stream", self.chat_stream)]
        if args.kserve:
            index = requests.post(args.kserve + "/v2/repository/index", json={}, timeout=30).json()
            self.kserve_model = args.kserve_model or index[0]["name"]
            meta = requests.get(f"{args.kserve}/v2/models/{self.kserve_model}", timeout=30).json()
            self.kserve_inputs, self.grpc_inputs = self.make_inputs(meta["inputs"])
            self.kserve_outputs = {o["name"]: o for o in meta["outputs"]}
            self.ops.append(("kserve_rest", self.kserve_rest))
            probe = requests.post(args.kserve + "/v1/embeddings", json={"model": self.kserve_model, "input": "probe"},
                                  timeout=60)
            if probe.status_code == 200:
                self.ops.append(("embeddings", self.embeddings))
        if args.grpc:
            import grpc
            from tritonclient.grpc import service_pb2, service_pb2_grpc
            self.pb = service_pb2
            self.grpc = grpc
            self.stubs = [service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(args.grpc))
                          for _ in range(args.grpc_channels)]
            if not args.kserve:
                sys.exit("--grpc needs --kserve (the model and its inputs are read over REST)")
            self.ops.append(("kserve_grpc", self.kserve_grpc))
        if not self.ops:
            sys.exit("give at least one of --openai, --kserve")

    @staticmethod
    def make_inputs(specs):
        rest, grpc_inputs = [], []
        for s in specs:
            shape = [1 if d == -1 else d for d in s["shape"]]
            n = 1
            for d in shape:
                n *= d
            if s["datatype"] == "BYTES":
                data = ["the soak test sends this sentence"] * n
            else:
                data = [1] * n
            rest.append({"name": s["name"], "datatype": s["datatype"], "shape": shape, "data": data})
            grpc_inputs.append((s["name"], s["datatype"], shape, data))
        return rest, grpc_inputs

    def chat(self, session):
        body = {"model": self.chat_model, "messages": [{"role": "user", "content": "Tell me about the sea."}],
                "max_tokens": self.args.max_tokens, "ignore_eos": True, "temperature": 0.7}
        r = session.post(self.args.openai + "/v1/chat/completions", json=body, timeout=self.args.timeout)

        def check(r):
            j = r.json()
            return (j["usage"]["completion_tokens"] == self.args.max_tokens and
                    isinstance(j["choices"][0]["message"]["content"], str))
        return classify_http(r, check), r.text[:200]

    def chat_stream(self, session):
        body = {"model": self.chat_model, "messages": [{"role": "user", "content": "Write a short poem."}],
                "max_tokens": self.args.max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        with session.post(self.args.openai + "/v1/chat/completions", json=body, stream=True,
                          timeout=self.args.timeout) as r:
            if r.status_code != 200:
                r.content  # noqa: B018 - read the body so the connection can be reused
                return classify_http(r, lambda _: False), r.text[:200]
            lines = [line for line in r.iter_lines() if line]
        ok = (len(lines) >= 3 and lines[-1] == b"data: [DONE]" and
              json.loads(lines[-2][6:])["usage"]["completion_tokens"] == self.args.max_tokens)
        return ("ok" if ok else "malformed"), lines[-3:]

    def kserve_rest(self, session):
        r = session.post(f"{self.args.kserve}/v2/models/{self.kserve_model}/infer",
                         json={"inputs": self.kserve_inputs}, timeout=self.args.timeout)

        def check(r):
            outs = r.json()["outputs"]
            return len(outs) == len(self.kserve_outputs) and all(o["shape"][0] == 1 for o in outs)
        return classify_http(r, check), r.text[:200]

    def embeddings(self, session):
        r = session.post(self.args.kserve + "/v1/embeddings",
                         json={"model": self.kserve_model, "input": ["one sentence", "and another"]},
                         timeout=self.args.timeout)
        return classify_http(r, lambda r: len(r.json()["data"]) == 2 and len(r.json()["data"][0]["embedding"]) > 0), \
            r.text[:200]

    def kserve_grpc(self, session):
        req = self.pb.ModelInferRequest(model_name=self.kserve_model)
        for name, datatype, shape, data in self.grpc_inputs:
            t = req.inputs.add(name=name, datatype=datatype, shape=shape)
            if datatype == "BYTES":
                t.contents.bytes_contents.extend(d.encode() for d in data)
            elif datatype.startswith("INT") or datatype.startswith("UINT"):
                if datatype in ("INT64",):
                    t.contents.int64_contents.extend(data)
                elif datatype.startswith("UINT"):
                    t.contents.uint_contents.extend(data)
                else:
                    t.contents.int_contents.extend(data)
            else:
                t.contents.fp32_contents.extend(float(x) for x in data)
        try:
            resp = random.choice(self.stubs).ModelInfer(req, timeout=self.args.timeout)
        except self.grpc.RpcError as e:
            if e.code() == self.grpc.StatusCode.UNAVAILABLE:
                return "backpressure", e.details()
            if e.code() in (self.grpc.StatusCode.DEADLINE_EXCEEDED,):
                return "lost", e.details()
            return "5xx", f"{e.code()}: {e.details()}"
        ok = len(resp.outputs) == len(self.kserve_outputs) and all(o.shape[0] == 1 for o in resp.outputs)
        return ("ok" if ok else "malformed"), str(resp)[:200]


def raise_fd_limit(connections):
    """Raises RLIMIT_NOFILE to the hard limit; exits when even that cannot hold the connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 4 * connections + 256)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < connections + 64:
        sys.exit(f"RLIMIT_NOFILE is {soft} (hard {hard}): too few descriptors for {connections} connections")
    return soft


def git_commit():
    """HEAD of this checkout at the start of the run, marked (dirty) when tracked files differ from it."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=here).stdout.strip()
    except OSError:
        return "unknown"
    return commit + (" (dirty)" if dirty else "")


def machine_facts():
    def run(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
        except OSError:
            return None
    return {"nproc": run("nproc"), "uname": run("uname", "-a"), "load_average": os.getloadavg()}


def worker(ops, rec, deadline, seed):
    rnd = random.Random(seed)
    session = requests.Session()
    while time.time() < deadline:
        name, fn = rnd.choice(ops.ops)
        t0 = time.time()
        try:
            outcome, detail = fn(session)
        except (requests.RequestException, ConnectionError, OSError, ValueError) as e:
            outcome, detail = "lost", repr(e)
            session.close()
            session = requests.Session()  # the connection is gone: a new one
        rec.add(name, outcome, time.time() - t0, detail)
    session.close()  # the server's descriptor count after the load shows what it kept


def summarize(rec, seconds, window):
    minutes = []
    for w in range(int((seconds + window - 1) // window)):
        evs = [e for e in rec.events if w * window <= e[0] < (w + 1) * window]
        ok_lat = [e[3] for e in evs if e[2] == "ok"]
        by_op = {}
        for _, op, outcome, lat in evs:
            by_op.setdefault(op, []).append(lat)
        minutes.append({
            "window": w, "from_s": w * window, "requests": len(evs),
            **{o: sum(1 for e in evs if e[2] == o) for o in OUTCOMES},
            "p50_ms": round(1000 * percentile(ok_lat, 0.50), 1) if ok_lat else None,
            "p99_ms": round(1000 * percentile(ok_lat, 0.99), 1) if ok_lat else None,
            "p99_ms_by_op": {op: round(1000 * percentile(l, 0.99), 1) for op, l in sorted(by_op.items())},
        })
    return minutes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--openai", help="base URL of a decoder server (chat completions)")
    ap.add_argument("--kserve", help="base URL of a KServe v2 server (REST infer; /v1/embeddings if an encoder)")
    ap.add_argument("--grpc", help="host:port of its KServe v2 gRPC endpoint")
    ap.add_argument("--chat-model", help="the decoder to chat with (default: the first of /v1/models)")
    ap.add_argument("--kserve-model", help="the model for KServe and embeddings (default: the first of the index)")
    ap.add_argument("--grpc-channels", type=int, default=4)
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--window", type=float, default=60, help="seconds per reported window (default a minute)")
    ap.add_argument("--sample-seconds", type=float, default=5)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=300, help="per request; past it the request is lost")
    ap.add_argument("--warmup-seconds", type=float, default=None,
                    help="RSS growth is measured from the first sample after this (default: a third of the run)")
    ap.add_argument("--pid", action="append", default=[], help="URL=PID when the server is not on this machine's "
                    "/proc under its port")
    ap.add_argument("--settle-seconds", type=float, default=5,
                    help="after the load, wait this long and sample the servers once more")
    ap.add_argument("--machine", default=platform.node())
    ap.add_argument("--out")
    args = ap.parse_args()

    commit = git_commit()
    fd_limit = raise_fd_limit(args.connections)
    machine_before = machine_facts()
    ops = Ops(args)
    urls = list(dict.fromkeys(u for u in (args.openai, args.kserve) if u))  # one process may serve both
    pids = dict(p.split("=", 1) for p in args.pid)
    servers = {}
    for u in urls:
        pid = int(pids[u]) if u in pids else listening_pid(urllib.parse.urlparse(u).port)
        servers[u] = {"pid": pid, "samples": []}

    start = time.time()
    rec = Recorder(start)
    deadline = start + args.seconds
    stop = threading.Event()

    def sampler():
        while True:
            for s in servers.values():
                if s["pid"]:
                    sample = proc_sample(s["pid"])
                    if sample:
                        s["samples"].append({"t_s": round(time.time() - start, 1), **sample})
            if stop.wait(args.sample_seconds):
                return

    st = threading.Thread(target=sampler, daemon=True)
    st.start()
    with concurrent.futures.ThreadPoolExecutor(args.connections) as pool:
        list(pool.map(lambda i: worker(ops, rec, deadline, i), range(args.connections)))
    stop.set()
    st.join()
    for s in servers.values():  # one sample once every client is done (their connections closed)
        if s["pid"] and (sample := proc_sample(s["pid"])):
            s["end_of_load"] = {"t_s": round(time.time() - start, 1), **sample}
    time.sleep(args.settle_seconds)
    for s in servers.values():  # and one after the clients closed their connections
        if s["pid"] and (sample := proc_sample(s["pid"])):
            s["after_load"] = {"t_s": round(time.time() - start, 1), **sample}

    totals = {o: sum(1 for e in rec.events if e[2] == o) for o in OUTCOMES}
    totals["requests"] = len(rec.events)
    warm = args.warmup_seconds if args.warmup_seconds is not None else args.seconds / 3
    for s in servers.values():
        after = [x for x in s["samples"] if warm <= x["t_s"] <= args.seconds]  # under load
        if len(after) >= 2:
            s["rss_growth_after_warmup_pct"] = round(100 * (after[-1]["rss_kb"] / after[0]["rss_kb"] - 1), 2)
            s["rss_max_growth_after_warmup_pct"] = round(
                100 * (max(x["rss_kb"] for x in after) / after[0]["rss_kb"] - 1), 2)
            s["rss_kb_first_max_last_after_warmup"] = [after[0]["rss_kb"], max(x["rss_kb"] for x in after),
                                                       after[-1]["rss_kb"]]
            s["fds_first_last_after_warmup"] = [after[0]["fds"], after[-1]["fds"]]
            s["fds_min_max_after_warmup"] = [min(x["fds"] for x in after), max(x["fds"] for x in after)]
    result = {
        "command": " ".join(sys.argv),
        "commit": commit,
        "machine": f"{args.machine}, {os.cpu_count()} CPUs",
        "machine_facts": {"before": machine_before, "after": machine_facts()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_at_end": os.getloadavg(),
        "config": {"connections": args.connections, "seconds": args.seconds, "ops": [n for n, _ in ops.ops],
                   "max_tokens": args.max_tokens, "window_s": args.window, "warmup_s": warm,
                   "client_fd_limit": fd_limit},
        "totals": totals,
        "windows": summarize(rec, args.seconds, args.window),
        "servers": servers,
        "examples": rec.examples,
        "passed": totals["lost"] == 0 and totals["malformed"] == 0 and totals["5xx"] == 0,
    }
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(json.dumps({k: result[k] for k in ("totals", "passed")}))
    for w in result["windows"]:
        print(f"window {w['window']}: {w['requests']} requests, ok {w['ok']}, 503 {w['backpressure']}, "
              f"lost {w['lost']}, malformed {w['malformed']}, 5xx {w['5xx']}, p99 {w['p99_ms']} ms")
    for u, s in servers.items():
        if s["samples"]:
            print(f"{u} (pid {s['pid']}): RSS {s['samples'][0]['rss_kb']} -> {s['samples'][-1]['rss_kb']} KiB "
                  f"(after warm-up {s.get('rss_growth_after_warmup_pct')} %), fds {s['samples'][0]['fds']} -> "
                  f"{s['samples'][-1]['fds']} under load, {s.get('after_load', {}).get('fds')} after")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
