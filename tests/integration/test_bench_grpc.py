"""stoke bench --api kserve-grpc: against a real `stoke serve` of all-MiniLM-L6-v2 over KServe v2 gRPC (BYTES text
and INT64 ids, raw_input_contents), the client's latencies checked against the server's own ledger, and errors counted
by gRPC status code against the delay fixture. The perf_analyzer cross-check is in test_bench_perf_analyzer.py."""
import pathlib
import re
import sys
import time

import pytest

from classic_server import ClassicServer, write_model_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "fixtures"))
from bench_helpers import NO_MACHINE_LIMITS, DelayServer, run_bench  # noqa: E402

pytest.importorskip("grpc")

FAST = ["--warmup", 1, "--window", 2, "--duration", 4, "--stability", 0, *NO_MACHINE_LIMITS]
# No warm-up: every request bench sends is one it measures, so the server's counters over the run hold exactly
# bench's requests and the two views compare request for request (sums and counts), not as two samples of a
# latency that a loaded machine moves between the warm-up and the measurement.
MEASURE_ALL = ["--warmup", 0, "--window", 2, "--duration", 4, "--stability", 0, *NO_MACHINE_LIMITS]
# What the client's side may add to a request over the server's own time: loopback, gRPC framing, the hop from
# the completion-queue thread and late wake-ups, the server's own before it reads a request included (its clock
# starts then). Well under a millisecond when idle, ~5 ms on the mean on 2 busy cores beside a CPU hog, tens of
# ms with a second test suite running: bench may add SLACK_MS plus half the server's own time.
SLACK_MS = 20.0


@pytest.fixture(scope="module")
def server(stoke_bin, minilm_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("bench_grpc")
    model = write_model_file(d, type="bert", model=str(minilm_path), name="minilm", max_batch_size=8,
                             dynamic_batching={"max_queue_delay_microseconds": 1000}, instance_group=[{"count": 1}])
    s = ClassicServer(stoke_bin, model, "--threads", "2", log_dir=d)
    yield s
    assert s.stop() == 0, s.log()


def counter(server, name, model):
    return server.metric(name, model_name=model)


def settled_counters(server, ok_at_least, timeout=30):
    """(success count, duration us) once the server has counted `ok_at_least` successes: a request is counted
    once its response is written, which can be just after the client has read it."""
    deadline = time.time() + timeout
    while True:
        ok = counter(server, "stoke:inference_request_success_total", "minilm")
        us = counter(server, "stoke:inference_request_duration_us_total", "minilm")
        if ok >= ok_at_least or time.time() > deadline:
            return ok, us
        time.sleep(0.02)


def test_closed_loop_text_over_grpc(server, tmp_path):
    ok0 = counter(server, "stoke:inference_request_success_total", "minilm")
    us0 = counter(server, "stoke:inference_request_duration_us_total", "minilm")
    run = run_bench(f"grpc://{server.grpc_url}", tmp_path, "--api", "kserve-grpc", "--model", "minilm",
                    "--concurrency", "1,4", "--metrics-url", server.base_url, *MEASURE_ALL)
    assert run.report["run"]["api"] == "kserve-grpc"
    total = 0
    for c in (1, 4):
        p = run.point(c)
        assert p["valid"], p["invalid_reasons"]
        assert p["requests"]["errors"] == {}, p["requests"]["error_examples"]
        assert p["requests"]["succeeded"] > 0
        lat = p["latency_ms"]
        assert 0 < lat["min"] <= lat["p50"] <= lat["p99"] <= lat["max"], lat
        total += p["requests"]["succeeded"]
    # No warm-up: the model served exactly the requests bench counted.
    ok1, us1 = settled_counters(server, ok0 + total)
    assert ok1 - ok0 == total
    # The client's mean latency and the server's own (first byte to outputs) over the same requests: the client
    # adds only loopback, gRPC framing and its own wake-ups, and can never see less than the server spent.
    server_ms = (us1 - us0) / 1e3 / total
    bench_ms = sum(run.point(c)["latency_ms"]["mean"] * run.point(c)["requests"]["succeeded"] for c in (1, 4)) / total
    # (5 ms: the server's write wakes the client, which on a busy machine may read before the server stamps.)
    assert server_ms - 5.0 <= bench_ms <= 1.5 * server_ms + SLACK_MS, (bench_ms, server_ms)
    sm = run.report["server_metrics"]
    assert sm["available"], sm["note"]
    assert "mean_batch_size" in sm["series"]


def test_token_ids_over_grpc_and_server_errors_by_code(server, tmp_path):
    # "minilm-ids" takes INT64 input_ids and attention_mask. bench fills INT64 inputs as kserve-http does, with
    # random values in [0, 100): fine ids, but mostly not a 0/1 mask; stoke answers INVALID_ARGUMENT naming the
    # element it read -- so the raw little-endian INT64 payload arrived intact, and each failure counts by its code.
    run = run_bench(f"grpc://{server.grpc_url}", tmp_path, "--api", "kserve-grpc", "--model", "minilm-ids",
                    "--concurrency", 2, "--no-scrape", *FAST)
    p = run.point(2)
    errors = p["requests"]["errors"]
    assert set(errors) == {"grpc_invalid_argument"}, errors
    example = p["requests"]["error_examples"]["grpc_invalid_argument"]
    # A mask of 0 is "no real tokens"; 2..99 "must be 0 or 1" naming the value read (the first error is kept).
    m = re.search(r"input 'attention_mask': (element \[0, 0\] is (\d+); must be 0 or 1|row 0 has no real tokens)",
                  example)
    assert m and (m.group(2) is None or 2 <= int(m.group(2)) < 100), example
    # The mask is one element ([-1, -1] is sent as [1, 1]); it is 1 in 1 % of requests, which succeed.
    ok, bad = p["requests"]["succeeded"], errors["grpc_invalid_argument"]
    assert bad > 100 and ok / (ok + bad) < 0.06, (ok, bad)


def test_unknown_model_fails_before_load(server, tmp_path):
    run = run_bench(server.grpc_url, tmp_path, "--api", "kserve-grpc", "--model", "nope", "--concurrency", 1,
                    *FAST, check=False)
    assert run.returncode == 1
    assert "grpc_not_found" in run.stderr or "grpc_unavailable" in run.stderr, run.stderr


def test_errors_counted_by_grpc_status(tmp_path):
    pytest.importorskip("tritonclient.grpc")  # the fixture's gRPC messages
    with DelayServer("--delay-ms", 10, "--grpc-port", 0, "--grpc-error-every", 4) as srv:
        run = run_bench(srv.grpc_url, tmp_path, "--api", "kserve-grpc", "--model", "fixture", "--concurrency", 2,
                        *FAST)
        served = srv.stats()
    p = run.point(2)
    errors = p["requests"]["errors"]
    assert set(errors) == {"grpc_resource_exhausted"}, errors
    assert "every Nth request fails" in p["requests"]["error_examples"]["grpc_resource_exhausted"]
    ok, bad = p["requests"]["succeeded"], errors["grpc_resource_exhausted"]
    # One call in four fails at once; the others take 10 ms.
    assert bad == pytest.approx(ok / 3, rel=0.25, abs=3), (ok, bad)
    assert p["latency_ms"]["p50"] >= 10
    assert served["paths"]["grpc:ModelInfer"] >= ok + bad
    assert run.report["server_metrics"]["available"] is False  # no --metrics-url: nothing to scrape over gRPC
