"""stoke bench against the real `stoke serve` (SmolLM2 on the CPU): exact token counts through the vLLM
extensions stoke supports, streamed timings that agree with the server's own ledger, and its metrics scraped."""
import json
import pathlib
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "fixtures"))
from bench_helpers import NO_MACHINE_LIMITS, run_bench  # noqa: E402

SHORT = ["--input-len", 16, "--output-len", 8, "--warmup", 1, "--window", 2, "--duration", 4, "--stability", 0,
         *NO_MACHINE_LIMITS]
# No warm-up: every request bench sends is one it measures, so the server's ledger over the run holds exactly
# bench's requests, and the two views can be compared request for request (sums and counts), not as two
# samples of a latency that a loaded machine moves between the warm-up and the measurement.
MEASURE_ALL = ["--input-len", 16, "--output-len", 8, "--warmup", 0, "--window", 2, "--duration", 4,
               "--stability", 0, *NO_MACHINE_LIMITS]
# What the client's side may add to a request over the server's own e2e time: loopback, SSE parsing and late
# wake-ups, the server's own before it reads a request included (its clock starts then). A fraction of a
# millisecond when idle, a few ms on 2 busy cores beside a CPU hog, tens of ms with a second test suite running:
# bench may add SLACK_MS plus half the server's own time (100+ ms per request).
SLACK_MS = 20.0


def hist_sum_count(server, name):
    m = server.metrics()
    s = sum(v for (n, _), v in m.items() if n == name + "_sum")
    c = sum(v for (n, _), v in m.items() if n == name + "_count")
    return s, c


def settled_sum_count(server, name, count_at_least, timeout=30):
    """hist_sum_count once the count has reached `count_at_least`: a request is counted once its last byte is
    written, which can be just after the client has read it."""
    deadline = time.time() + timeout
    while True:
        s, c = hist_sum_count(server, name)
        if c >= count_at_least or time.time() > deadline:
            return s, c
        time.sleep(0.02)


def test_completions_sweep_against_stoke_serve(server, tmp_path):
    s0, c0 = hist_sum_count(server, "stoke:e2e_request_latency_seconds")
    run = run_bench(server.base_url, tmp_path, "--api", "openai-completions", "--concurrency", "1,2", *MEASURE_ALL)
    assert run.report["run"]["model"] == server.model_name()
    for c in (1, 2):
        p = run.point(c)
        assert p["valid"], p["invalid_reasons"]
        assert p["requests"]["errors"] == {}, p["requests"]["error_examples"]
        assert p["requests"]["succeeded"] > 0
        # ignore_eos + min_tokens = max_tokens: every request generates exactly 8 tokens from 16 prompt ids.
        assert p["throughput"]["mean_output_tokens"] == 8
        assert p["throughput"]["mean_input_tokens"] == 16
        assert 0 < p["ttft_ms"]["p50"] < p["latency_ms"]["p50"]
        assert p["itl_ms"]["count"] > 0
    # The client's view and the server's ledger of the same requests (no warm-up: the server saw exactly bench's
    # requests): the client's clock starts before the server's and stops after it, adding only its own side.
    n = sum(run.point(c)["requests"]["succeeded"] for c in (1, 2))
    s1, c1 = settled_sum_count(server, "stoke:e2e_request_latency_seconds", c0 + n)
    assert c1 - c0 == n
    server_mean_ms = (s1 - s0) / n * 1e3
    bench_mean_ms = sum(run.point(c)["latency_ms"]["mean"] * run.point(c)["requests"]["succeeded"] for c in (1, 2)) / n
    # (5 ms: the server's write wakes the client, which on a busy machine may read before the server stamps.)
    assert server_mean_ms - 5.0 <= bench_mean_ms <= 1.5 * server_mean_ms + SLACK_MS, (bench_mean_ms, server_mean_ms)
    sm = run.report["server_metrics"]
    assert sm["available"], sm["note"]
    assert any(k.endswith("num_requests_running") for k in sm["series"])
    assert any(k.startswith("stage_ms:") for k in sm["series"])
    # The engine's step split: mean model / host ms per step in each scrape interval where steps ran.
    model_ms = [v for v in sm["series"]["step_ms:model"] if v is not None and v == v]
    host_ms = [v for v in sm["series"]["step_ms:host"] if v is not None and v == v]
    assert model_ms and all(v > 0 for v in model_ms), sm["series"]["step_ms:model"]
    assert host_ms and all(v >= 0 for v in host_ms)
    assert "Mean engine step time by part" in (tmp_path / "report.html").read_text()


def test_chat_streaming_against_stoke_serve(server, tmp_path):
    run = run_bench(server.base_url, tmp_path, "--api", "openai-chat", "--concurrency", "2", *SHORT)
    p = run.point(2)
    assert p["valid"], p["invalid_reasons"]
    assert p["requests"]["errors"] == {}, p["requests"]["error_examples"]
    assert p["throughput"]["mean_output_tokens"] == 8
    # 16 words of synthetic text plus the chat template: more than 16 tokens, counted by the server.
    assert p["throughput"]["mean_input_tokens"] > 16
    assert json.loads((tmp_path / "bench.json").read_text())["run"]["api"] == "openai-chat"
