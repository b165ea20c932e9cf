"""Can `stoke bench` be trusted? Checked against tests/fixtures/delay_server.py, whose timing is known.

The fixture answers after a fixed delay (or streams with a fixed TTFT and inter-token gap) and records its
own view of every request. stoke bench must (1) never measure less than the delay, (2) agree with the
fixture's own per-request times within the timer resolution plus a little loopback overhead, (3) keep the
arrival process it was asked for, and (4) show overload as latency that grows, not as a flat line.

The fixture is Python on a shared 2-core machine, so it is sometimes late itself; comparisons are made
against what the fixture measured, and the configured delay is only a lower bound.
"""
import json
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "fixtures"))
from bench_helpers import DelayServer, cv, pct, run_bench, stoke_bin_path  # noqa: E402

FAST = ["--warmup", "0.5", "--window", "1", "--duration", "3", "--stability", "0"]
# Loopback + HTTP parsing + one event-loop tick on each side. Generous for a loaded 2-core machine.
OVERHEAD_MS = 3.0


@pytest.fixture(autouse=True)
def _need_binary():
    if not stoke_bin_path().exists():
        pytest.fail(f"stoke binary not found at {stoke_bin_path()}; build first")


def ms(seconds):
    return [s * 1e3 for s in seconds]


def test_closed_loop_latency_and_throughput_match_a_fixed_delay(tmp_path):
    for c in (1, 4):
        with DelayServer("--delay-ms", 50) as srv:
            run = run_bench(srv.url, tmp_path / str(c), "--api", "openai-embeddings", "--concurrency", c, *FAST)
            st = srv.stats()
        server_ms = ms(st["service_s"])
        assert min(server_ms) >= 50.0
        p = run.point(c)
        assert p["valid"], p["invalid_reasons"]
        assert p["requests"]["errors"] == {}
        lat = p["latency_ms"]
        assert lat["min"] >= 50.0, "measured faster than the server can answer"
        # Same requests seen from both ends (the server's list also has the warm-up ones): the client adds
        # only loopback overhead.
        assert pct(server_ms, 50) - 0.5 <= lat["p50"] <= pct(server_ms, 50) + OVERHEAD_MS
        assert lat["p99"] <= pct(server_ms, 99) + 2 * OVERHEAD_MS
        assert lat["p50"] <= 50 + 10
        # Little's law for a closed loop: throughput = clients / mean latency.
        tp = p["throughput"]["requests_per_s"]
        assert tp == pytest.approx(c / (lat["mean"] / 1e3), rel=0.05)
        assert tp <= c / 0.050 * 1.001
        assert p["generator"]["send_lag_ms"]["p99"] < 5
        assert p["requests"]["sent"] > 40 * c
        # Keep-alive: one connection per client (plus set-up calls and one per metrics scrape), not per request.
        assert st["connections"] < c + 12 < p["requests"]["sent"]


@pytest.mark.parametrize("api", ["openai-completions", "openai-chat"])
def test_streaming_ttft_and_inter_token_gaps_match_the_fixture(tmp_path, api):
    with DelayServer("--ttft-ms", 40, "--itl-ms", 15) as srv:
        run = run_bench(srv.url, tmp_path, "--api", api, "--concurrency", "2", "--input-len", 8,
                        "--output-len", 6, *FAST)
        st = srv.stats()
    p = run.point(2)
    assert p["valid"], p["invalid_reasons"]
    assert p["requests"]["errors"] == {}
    assert p["throughput"]["mean_output_tokens"] == 6
    assert p["throughput"]["mean_input_tokens"] == 8  # the fixture's usage: one token per word / id
    server_ttft, server_itl = ms(st["ttft_s"]), ms(st["itl_s"])
    ttft, itl, tpot = p["ttft_ms"], p["itl_ms"], p["tpot_ms"]
    assert ttft["min"] >= 40.0
    assert pct(server_ttft, 50) - 0.5 <= ttft["p50"] <= pct(server_ttft, 50) + OVERHEAD_MS
    assert abs(itl["p50"] - pct(server_itl, 50)) <= OVERHEAD_MS
    assert itl["p50"] >= 15.0 - OVERHEAD_MS
    assert tpot["p50"] == pytest.approx(15.0, abs=OVERHEAD_MS)
    assert p["latency_ms"]["p50"] == pytest.approx(40 + 5 * 15, abs=3 * OVERHEAD_MS)
    assert itl["count"] == 5 * p["requests"]["succeeded"]


def test_closed_loop_against_one_worker_queues(tmp_path):
    # 4 clients, one worker, 40 ms each: every request waits for the other three -> 160 ms, 25 req/s.
    with DelayServer("--delay-ms", 40, "--workers", 1) as srv:
        run = run_bench(srv.url, tmp_path, "--api", "openai-embeddings", "--concurrency", "4", *FAST)
        st = srv.stats()
    p = run.point(4)
    compute_ms = [s - q for s, q in zip(ms(st["service_s"]), ms(st["queue_s"]))]
    mean_compute = sum(compute_ms) / len(compute_ms)
    assert p["latency_ms"]["p50"] == pytest.approx(4 * mean_compute, rel=0.05)
    assert p["throughput"]["requests_per_s"] == pytest.approx(1000 / mean_compute, rel=0.05)
    assert st["peak_in_flight"] == 4


def test_open_loop_below_capacity_does_not_queue(tmp_path):
    with DelayServer("--delay-ms", 40, "--workers", 1) as srv:
        run = run_bench(srv.url, tmp_path, "--api", "openai-embeddings", "--rate", "10", "--arrival", "constant",
                        *FAST)
        st = srv.stats()
    p = run.point(10)
    assert p["valid"], p["invalid_reasons"]
    assert p["requests"]["sent"] == pytest.approx(30, abs=1)
    assert p["latency_ms"]["min"] >= 40.0
    assert p["latency_ms"]["p50"] <= pct(ms(st["service_s"]), 50) + OVERHEAD_MS
    gaps = [b - a for a, b in zip(st["arrivals"], st["arrivals"][1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.03)
    assert cv(gaps) < 0.15  # evenly spaced


def test_open_loop_poisson_arrivals(tmp_path):
    with DelayServer("--delay-ms", 5) as srv:
        run = run_bench(srv.url, tmp_path, "--api", "openai-embeddings", "--rate", "40", "--arrival", "poisson",
                        "--seed", 3, *FAST)
        st = srv.stats()
    p = run.point(40)
    assert p["valid"], p["invalid_reasons"]
    gaps = [b - a for a, b in zip(st["arrivals"], st["arrivals"][1:])]
    assert len(gaps) > 100
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 40, rel=0.2)
    assert 0.7 < cv(gaps) < 1.3  # exponential gaps have a coefficient of variation of 1


def test_open_loop_overload_shows_growing_latency(tmp_path):
    # Capacity 25 req/s (one worker, 40 ms); offered 40 req/s, evenly spaced. Request k is scheduled at
    # 25k ms but can only finish at 40(k+1) ms: latency grows by 15 ms per request, without bound.
    with DelayServer("--delay-ms", 40, "--workers", 1) as srv:
        run = run_bench(srv.url, tmp_path, "--api", "openai-embeddings", "--rate", "40", "--arrival", "constant",
                        "--drain-timeout", 30, *FAST)
        st = srv.stats()
    p = run.point(40)
    assert p["valid"], p["invalid_reasons"]  # the generator kept its schedule; the server fell behind
    assert not p["stable"]
    w = [x["p50_ms"] for x in p["windows"]]
    assert w[0] < w[1] < w[2] and w[2] > 1.5 * w[0], w
    assert p["latency_ms"]["p99"] > 10 * 40
    mean_compute = sum(s - q for s, q in zip(st["service_s"], st["queue_s"])) / len(st["service_s"]) * 1e3
    assert p["throughput"]["requests_per_s"] == pytest.approx(1000 / mean_compute, rel=0.1)
    # Latency of request k (k from the start of the point) ~ compute + k * (compute - 25 ms); the measured
    # requests are k = 20 .. 139 (scheduled in [0.5 s, 3.5 s)).
    expected_mean = mean_compute + (mean_compute - 25) * (20 + 139) / 2
    assert p["latency_ms"]["mean"] == pytest.approx(expected_mean, rel=0.15)
    # The server's queue shows in its own metrics, scraped during the run.
    sm = run.report["server_metrics"]
    assert sm["available"]
    waiting = [v for v in sm["series"]["stoke:num_requests_waiting"] if v is not None]
    assert max(waiting) > 10
    assert "stage_ms:queue" in sm["series"]


def test_requests_cut_by_the_drain_timeout_are_counted_not_hidden(tmp_path):
    with DelayServer("--delay-ms", 40, "--workers", 1) as srv:
        run = run_bench(srv.url, tmp_path, "--api", "openai-embeddings", "--rate", "50", "--arrival", "constant",
                        "--drain-timeout", 0.3, "--warmup", 0.2, "--window", 1, "--duration", 1, "--stability", 0)
    p = run.point(50)
    sent = p["requests"]["sent"]
    assert sent == pytest.approx(50, abs=1)
    assert p["requests"]["errors"].get("incomplete", 0) > 10
    assert p["requests"]["succeeded"] + sum(p["requests"]["errors"].values()) == sent


def test_a_point_the_generator_cannot_drive_is_marked_invalid(tmp_path):
    # One connection can carry 50 req/s at 20 ms; asked for 200 req/s the sends fall behind the schedule.
    with DelayServer("--delay-ms", 20) as srv:
        args = ["--api", "openai-embeddings", "--rate", "200", "--arrival", "constant", "--max-connections", 1,
                "--drain-timeout", 1, "--warmup", 0.2, "--window", 0.5, "--duration", 1, "--stability", 0]
        run = run_bench(srv.url, tmp_path / "a", *args)
        strict = run_bench(srv.url, tmp_path / "b", *args, "--fail-on-invalid", check=False)
    p = run.point(200)
    assert not p["valid"]
    assert any("send lag" in r for r in p["invalid_reasons"]), p["invalid_reasons"]
    assert p["generator"]["send_lag_ms"]["p99"] > 100
    assert "INVALID" in run.stdout
    assert "INVALID" in (tmp_path / "a" / "report.html").read_text()
    assert strict.returncode == 3


def test_kserve_http_json_and_binary(tmp_path):
    with DelayServer("--delay-ms", 20) as srv:
        run_json = run_bench(srv.url, tmp_path / "json", "--api", "kserve-http", "--model", "fixture",
                             "--concurrency", 2, *FAST)
        run_bin = run_bench(srv.url, tmp_path / "bin", "--api", "kserve-http", "--model", "fixture",
                            "--concurrency", 2, "--kserve-binary", *FAST)
        st = srv.stats()
    for run in (run_json, run_bin):
        p = run.point(2)
        assert p["valid"], p["invalid_reasons"]
        assert p["requests"]["errors"] == {}
        assert p["latency_ms"]["min"] >= 20.0
        assert p["latency_ms"]["p50"] <= 20 + 10
    assert st["paths"]["/v2/models/fixture/infer"] > 100
    assert st["paths"]["/v2/models/fixture"] == 2  # metadata, once per run


def test_server_errors_are_reported_by_kind(tmp_path):
    with DelayServer("--delay-ms", 5) as srv:
        run = run_bench(srv.url, tmp_path, "--api", "kserve-http", "--model", "fixture", "--concurrency", 1,
                        *FAST)
        ok_point = run.point(1)
        assert ok_point["requests"]["errors"] == {}
        # A model the fixture doesn't serve: the metadata call fails before any load.
        bad = run_bench(srv.url, tmp_path / "bad", "--api", "kserve-http", "--model", "nope", "--concurrency", 1,
                        *FAST, check=False)
    assert bad.returncode == 1
    assert "HTTP 404" in bad.stderr


def test_usage_errors(tmp_path):
    b = str(stoke_bin_path())

    def rc(*args):
        return subprocess.run([b, "bench", *map(str, args)], capture_output=True, text=True, timeout=60)

    r = rc("--concurrency", 1, "--output-dir", tmp_path)
    assert r.returncode == 2 and "--url" in r.stderr
    r = rc("--url", "http://127.0.0.1:9", "--concurrency", 1, "--rate", 2, "--output-dir", tmp_path)
    assert r.returncode == 2 and "exactly one" in r.stderr
    r = rc("--url", "http://127.0.0.1:9", "--concurrency", 1, "--slo", "ttft=fast", "--output-dir", tmp_path)
    assert r.returncode == 2 and "ttft" in r.stderr
    r = rc("--url", "http://127.0.0.1:9", "--concurrency", 1, "--api", "kserve-grpc", "--model", "m",
           "--output-dir", tmp_path)
    assert r.returncode == 1 and "grpc://HOST:PORT" in r.stderr
    r = rc("--url", "grpc://127.0.0.1:9", "--concurrency", 1, "--api", "kserve-grpc", "--output-dir", tmp_path)
    assert r.returncode == 1 and "needs --model" in r.stderr
    # Nothing serves gRPC on port 9: the metadata call fails with the gRPC status, not a hang.
    r = rc("--url", "grpc://127.0.0.1:9", "--concurrency", 1, "--api", "kserve-grpc", "--model", "m",
           "--output-dir", tmp_path)
    assert r.returncode == 1 and "grpc_unavailable" in r.stderr, r.stderr
    # Nothing listens on port 9 of loopback: a clear error, not a hang.
    r = rc("--url", "http://127.0.0.1:9", "--model", "m", "--concurrency", 1, "--output-dir", tmp_path,
           "--warmup", 0, "--duration", 1, "--no-scrape")
    assert r.returncode == 1 and "connect" in r.stderr


def test_compare_reports_ratios_with_spread(tmp_path):
    with DelayServer("--delay-ms", 20) as fast, DelayServer("--delay-ms", 40) as slow:
        a = run_bench(fast.url, tmp_path / "a", "--api", "openai-embeddings", "--concurrency", "1,2", *FAST)
        b = run_bench(slow.url, tmp_path / "b", "--api", "openai-embeddings", "--concurrency", "1,2", *FAST)
    out = tmp_path / "cmp.json"
    r = subprocess.run([str(stoke_bin_path()), "bench", "compare", str(a.out_dir / "bench.json"),
                        str(b.out_dir / "bench.json"), "--output", str(out)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {(row["load"], row["metric"]): row for row in json.loads(out.read_text())["rows"]}
    tp = rows[(1, "requests_per_s")]
    assert tp["ratio"] == pytest.approx(0.5, rel=0.1)
    assert tp["significant"] and tp["spread"] < 0.05
    assert rows[(2, "latency_p50_ms")]["ratio"] == pytest.approx(2.0, rel=0.1)
    assert "worse" in r.stdout
