"""The timeline (POST /v1/debug/trace, `stoke trace`) against real `stoke serve` processes: the synthetic model behind
the dynamic batcher (with a fake NVML for the GPU counter tracks) and SmolLM2 behind the LLM loop. Load runs while a
trace is on; the file must be trace-event JSON (schema per phase), spans on one track must nest, every request's
stage spans must sum to its span, and the totals must reconcile with /metrics and /v1/debug/requests for the same
requests. No wall-clock bounds: a trace is ended with DELETE once the load is done and counted on /metrics."""
import collections
import concurrent.futures
import json
import pathlib
import subprocess
import threading
import time

import pytest
import requests

from classic_server import ClassicServer, write_model_file
from conftest import parse_metrics
from test_gpu_telemetry import environ, fake_nvml_path

IN, OUT = 64, 40
EPS_US = 0.002  # µs: ts/dur carry ns with 3 decimals


# --- helpers -------------------------------------------------------------------------------------------------------

class Trace:
    """POST /v1/debug/trace on a thread; the constructor returns once the server is recording (GET says so)."""

    def __init__(self, base_url, seconds=60, max_events=None):
        self.base_url = base_url
        q = f"seconds={seconds}" + (f"&max_events={max_events}" if max_events else "")
        self.response = None
        self.thread = threading.Thread(target=self._run, args=(q,))
        self.thread.start()
        deadline = time.time() + 60
        while time.time() < deadline:
            if requests.get(base_url + "/v1/debug/trace", timeout=30).json()["recording"]:
                return
            assert self.response is None, (self.response.status_code, self.response.text)
            time.sleep(0.02)
        raise AssertionError("the trace never started")

    def _run(self, q):
        self.response = requests.post(self.base_url + "/v1/debug/trace?" + q, timeout=600)

    def stop(self):
        r = requests.delete(self.base_url + "/v1/debug/trace", timeout=30)
        assert r.status_code == 200, r.text
        self.thread.join(timeout=120)
        assert self.response is not None and self.response.status_code == 200, self.response
        return self.response.json()


def check_schema(trace):
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    assert trace["displayTimeUnit"] == "ms"
    other = trace["otherData"]
    assert isinstance(other["dropped_events"], int) and isinstance(other["events"], int)
    assert other["events"] == len(trace["traceEvents"])
    for e in trace["traceEvents"]:
        assert isinstance(e["name"], str) and e["name"], e
        assert e["ph"] in ("X", "C", "M", "i"), e
        assert isinstance(e["ts"], (int, float)) and isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["args"], dict), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        elif e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index"), e
            if e["name"] != "process_sort_index":
                assert isinstance(e["args"]["name"], str) and e["args"]["name"], e
        elif e["ph"] == "i":
            assert e["s"] in ("t", "p", "g"), e


def names(trace):
    """{pid: process name}, {(pid, tid): thread name}"""
    procs, threads = {}, {}
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        if e["ph"] == "M" and e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    return procs, threads


def spans_by_track(trace):
    tracks = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append(e)
    return tracks


def check_nesting(trace):
    """On every track, two spans are either disjoint or one holds the other (Perfetto drops the rest)."""
    procs, threads = names(trace)
    for track, spans in spans_by_track(trace).items():
        assert track in threads, f"track {track} has no thread_name"
        assert track[0] in procs, f"pid {track[0]} has no process_name"
        stack = []
        for s in sorted(spans, key=lambda s: (s["ts"], -s["dur"])):
            end = s["ts"] + s["dur"]
            while stack and s["ts"] >= stack[-1] - EPS_US:
                stack.pop()
            if stack:
                assert end <= stack[-1] + EPS_US, f"{s} overlaps its parent on {threads[track]}"
            stack.append(end)


def request_tracks(trace):
    """[(request span, [stage spans])] for the tracks of process "requests"."""
    procs, _ = names(trace)
    out = []
    for (pid, tid), spans in spans_by_track(trace).items():
        if procs[pid] != "requests":
            continue
        parents = [s for s in spans if "id" in s["args"]]
        assert len(parents) == 1, spans
        out.append((parents[0], [s for s in spans if "id" not in s["args"]]))
    return out


def check_request_stages(trace):
    reqs = request_tracks(trace)
    for req, stages in reqs:
        total = sum(s["dur"] for s in stages)
        assert abs(total - req["dur"]) <= EPS_US * (len(stages) + 1), (req, stages)
        for s in stages:
            assert req["ts"] - EPS_US <= s["ts"] and s["ts"] + s["dur"] <= req["ts"] + req["dur"] + EPS_US
    return reqs


def stage_sums(metrics, model):
    """{stage: (count, sum seconds)} of stoke:request_stage_seconds for one model."""
    out = {}
    for (name, labels), v in metrics.items():
        d = dict(labels)
        if d.get("model_name") != model or "stage" not in d:
            continue
        if name == "stoke:request_stage_seconds_count":
            out.setdefault(d["stage"], [0, 0.0])[0] = v
        elif name == "stoke:request_stage_seconds_sum":
            out.setdefault(d["stage"], [0, 0.0])[1] = v
    return out


def wait_until(fn, what, timeout=120, show=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if fn():
            return
        time.sleep(0.05)
    raise AssertionError(what + (f" (last: {show()})" if show else ""))


def reconcile(trace, before, after, model, log, n):
    """The trace's requests are the n the metrics counted; stage sums equal; each equals its request-log entry."""
    reqs = check_request_stages(trace)
    assert len(reqs) == n
    b, a = stage_sums(before, model), stage_sums(after, model)
    traced = collections.defaultdict(float)
    for _, stages in reqs:
        for s in stages:
            traced[s["name"]] += s["dur"] * 1e-6
    assert a["recv"][0] - b.get("recv", [0, 0])[0] == n
    for stage, seconds in traced.items():
        delta = a[stage][1] - b.get(stage, [0, 0.0])[1]
        assert delta == pytest.approx(seconds, rel=1e-6, abs=1e-8 * n), stage
    by_id = {e["id"]: e for e in log}
    for req, stages in reqs:
        entry = by_id[req["args"]["id"]]
        assert req["args"]["model"] == entry["model"]
        assert req["dur"] / 1000 == pytest.approx(entry["e2e_ms"], abs=0.0011)
        for s in stages:
            assert s["dur"] / 1000 == pytest.approx(entry["stages_ms"][s["name"]], abs=0.0011), s["name"]


# --- the classic path ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def synth(stoke_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("trace_synth")
    model = write_model_file(d, type="synthetic", name="synth", input_bytes=IN, output_bytes=OUT,
                             preprocess_us_per_item=200, kernels=[{"count": 2, "flops_per_item": 1e5, "bytes": 65536}],
                             postprocess_us=50, buffers="pinned", max_batch_size=8,
                             dynamic_batching={"max_queue_delay_microseconds": 2000}, instance_group=[{"count": 2}])
    with environ(STOKE_NVML_LIBRARY=fake_nvml_path(), FAKE_NVML_GPM=1, FAKE_NVML_DEVICES=1, FAKE_NVML_FAIL=None):
        server = ClassicServer(stoke_bin, model, "--gpu-telemetry-interval-ms", 100, "--debug-requests", 1000,
                               log_dir=d)
    yield server
    assert server.stop() == 0, server.log()


def infer(server, i, rows=1):
    body = {"id": f"req-{i}", "inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [rows, IN],
                                          "data": [(i + j) % 256 for j in range(rows * IN)]}]}
    r = server.post("/v2/models/synth/infer", json=body)
    assert r.status_code == 200, r.text
    return r.json()["id"]


def test_classic_trace_nests_and_reconciles_with_the_ledger(synth):
    n = 32
    before = parse_metrics(synth.get("/metrics").text)
    tr = Trace(synth.base_url)
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        ids = list(ex.map(lambda i: infer(synth, i), range(n)))
    assert sorted(ids) == sorted(f"req-{i}" for i in range(n))
    count = lambda: stage_sums(parse_metrics(synth.get("/metrics").text), "synth").get("recv", [0])[0]
    base = stage_sums(before, "synth").get("recv", [0])[0]
    wait_until(lambda: count() - base == n, "the requests never reached /metrics", show=lambda: (count(), base))
    time.sleep(0.3)  # not a bound: lets the 100 ms GPU sampler put a few ticks into the window
    trace = tr.stop()
    after = parse_metrics(synth.get("/metrics").text)

    check_schema(trace)
    check_nesting(trace)
    assert trace["otherData"]["dropped_events"] == 0
    assert trace["otherData"]["kernel_track"].startswith(("off: ", "cupti"))  # why there is no kernel track
    log = synth.get("/v1/debug/requests?model=synth").json()["requests"]
    reconcile(trace, before, after, "synth", log, n)
    assert sorted(r["args"]["id"] for r, _ in request_tracks(trace)) == sorted(ids)

    # Batches: one track per instance, rows add up to the requests', count = the executions /metrics counted.
    procs, threads = names(trace)
    batches = [s for (pid, tid), spans in spans_by_track(trace).items() if procs[pid] == "batcher synth"
               for s in spans if s["name"] == "batch"]
    assert sum(b["args"]["rows"] for b in batches) == n
    execs = lambda m: sum(v for (k, ls), v in m.items() if k == "stoke:inference_exec_count_total")
    assert len(batches) == execs(after) - execs(before)
    assert all(b["args"]["close_reason"] in ("full", "preferred", "delay", "immediate") for b in batches)
    copies = [s for (pid, tid), spans in spans_by_track(trace).items() if procs[pid] == "batcher synth"
              for s in spans if s["name"] in ("h2d", "d2h")]
    assert copies and all(c["args"]["memory"] == "pinned" for c in copies)
    assert {threads[(pid, tid)] for (pid, tid) in spans_by_track(trace) if procs[pid] == "batcher synth"} <= {
        "instance 0", "instance 1"}

    # GPU counters from the (fake) NVML sampler as counter tracks.
    gpu = [e for e in trace["traceEvents"] if e["ph"] == "C" and procs.get(e["pid"]) == "GPU 0"]
    assert {"SM active", "tensor active", "DRAM active", "power W"} <= {e["name"] for e in gpu}
    assert all(e["args"]["value"] == 0.6 for e in gpu if e["name"] == "SM active")


def test_one_trace_at_a_time_and_bad_queries(synth):
    assert synth.post("/v1/debug/trace?seconds=0").status_code == 400
    assert synth.post("/v1/debug/trace?seconds=1e9").status_code == 400
    assert synth.post("/v1/debug/trace?seconds=1&max_events=0").status_code == 400
    assert synth.post("/v1/debug/trace?sekonds=1").status_code == 400
    assert requests.delete(synth.base_url + "/v1/debug/trace", timeout=30).status_code == 404
    tr = Trace(synth.base_url)
    r = synth.post("/v1/debug/trace?seconds=1")
    assert r.status_code == 409 and "already" in r.json()["error"]
    trace = tr.stop()
    assert not synth.get("/v1/debug/trace").json()["recording"]
    check_schema(trace)


def test_the_budget_counts_drops_and_says_so(synth):
    tr = Trace(synth.base_url, max_events=20)
    for i in range(10):
        infer(synth, 1000 + i)
    trace = tr.stop()
    check_schema(trace)
    assert len(trace["traceEvents"]) == 20
    assert trace["otherData"]["dropped_events"] > 0
    assert "dropped" in trace["otherData"]["note"]


def test_stoke_trace_cli_writes_the_file_and_a_summary(stoke_bin, synth, tmp_path):
    out = tmp_path / "trace.json"
    p = subprocess.Popen([str(stoke_bin), "trace", "--url", synth.base_url, "--seconds", "1", "-o", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for i in range(4):
        infer(synth, 2000 + i)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr
    trace = json.loads(out.read_text())
    check_schema(trace)
    check_nesting(trace)
    assert f"{len(trace['traceEvents'])} events on" in stdout
    assert "0 dropped" in stdout and "GPU kernels: none recorded" in stdout
    s = subprocess.run([str(stoke_bin), "trace", "--summarize", str(out)], capture_output=True, text=True, timeout=60)
    assert s.returncode == 0 and s.stdout == stdout
    h = subprocess.run([str(stoke_bin), "trace", "--help"], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and "--seconds" in h.stdout and "--url" in h.stdout


# --- the LLM path --------------------------------------------------------------------------------------------------

def test_llm_trace_steps_and_requests_reconcile(start_server):
    server = start_server("--no-prefix-cache", "--debug-requests", 100, "--max-num-seqs", 4)
    model = server.model_name()
    n = 4
    before = server.metrics()
    tr = Trace(server.base_url)

    def one(i):
        r = server.post("/v1/completions", json={"model": model, "prompt": f"Count to {i}:", "max_tokens": 6,
                                                 "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()

    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        outs = list(ex.map(one, range(n)))
    base = stage_sums(before, model).get("recv", [0])[0]
    wait_until(lambda: stage_sums(server.metrics(), model)["recv"][0] - base == n, "requests not on /metrics")
    # A step is recorded after its tokens went out (the last one after the last response): wait until the step
    # histograms hold every decode token (each request's first token comes from its prefill step). The server
    # traces a step before it counts it, so the trace then holds them too.
    hsum = lambda m, name: sum(v for (k, ls), v in m.items() if k == name)
    decoded = sum(o["usage"]["completion_tokens"] - 1 for o in outs)
    wait_until(lambda: hsum(server.metrics(), "stoke:step_decode_tokens_sum")
               - hsum(before, "stoke:step_decode_tokens_sum") == decoded, "the last step not on /metrics")
    trace = tr.stop()
    after = server.metrics()

    check_schema(trace)
    check_nesting(trace)
    log = server.get(f"/v1/debug/requests?model={model}").json()["requests"]
    reconcile(trace, before, after, model, log, n)
    assert sorted(r["args"]["id"] for r, _ in request_tracks(trace)) == sorted(o["id"] for o in outs)

    # Steps: the loop's track; tokens and counts equal the step histograms' for the same window.
    procs, _ = names(trace)
    steps = [s for (pid, tid), spans in spans_by_track(trace).items() if procs[pid] == f"engine {model}"
             for s in spans if s["name"].startswith("step")]
    assert steps
    delta = lambda name: hsum(after, name) - hsum(before, name)
    assert sum(s["args"]["prefill_tokens"] for s in steps) == delta("stoke:step_prefill_tokens_sum")
    assert sum(s["args"]["decode_tokens"] for s in steps) == delta("stoke:step_decode_tokens_sum")
    assert sum(1 for s in steps if s["dur"] > 0) == delta("stoke:step_duration_seconds_count")
    prompt = sum(o["usage"]["prompt_tokens"] for o in outs)
    completion = sum(o["usage"]["completion_tokens"] for o in outs)
    assert sum(s["args"]["prefill_tokens"] for s in steps) == prompt
    # A request's first token comes from its last prefill step; every later one from a decode step.
    assert sum(s["args"]["decode_tokens"] for s in steps) == completion - n
    counters = {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"}
    assert {"sequences", "kv_blocks", "step_tokens"} <= counters


def test_summary_of_a_cupti_trace_reads_gpu_idle_gaps(stoke_bin):
    """A timeline recorded on the H200 through CuptiTracer (10 kernels, pinned and pageable HtoD, a memset, DtoH)."""
    path = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "trace_cupti_h200.json"
    trace = json.loads(path.read_text())
    check_schema(trace)
    check_nesting(trace)
    assert trace["otherData"]["kernel_track"].startswith("cupti")
    copies = {e["args"]["src"] for e in trace["traceEvents"] if e["name"] == "memcpy HtoD"}
    assert copies == {"pinned", "pageable"}
    s = subprocess.run([str(stoke_bin), "trace", "--summarize", str(path)], capture_output=True, text=True, timeout=60)
    assert s.returncode == 0, s.stderr
    assert "GPU 0: 14 kernel/copy records" in s.stdout and "13 idle gaps" in s.stdout
