"""The HTTP side of a real `stoke serve`: health endpoints, /metrics accepted by Prometheus' own promtool,
keep-alive with many idle connections, --config with flags winning, graceful shutdown on SIGTERM/SIGINT."""
import json
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest
import requests


def test_health_endpoints(server):
    r = server.get("/health/live")
    assert r.status_code == 200 and r.json() == {"status": "live"}
    r = server.get("/health/ready")
    assert r.status_code == 200 and r.json() == {"status": "ready"}
    assert server.get("/health").status_code == 200
    r = requests.post(server.base_url + "/health/ready", timeout=10)
    assert r.status_code == 405 and r.headers["Allow"] == "GET"


def test_ready_is_503_until_loaded(stoke_bin, smollm2_path):
    # Loading SmolLM2 takes a second or two; the port is open (and /health/live answers) from the start.
    p = subprocess.Popen([str(stoke_bin), "serve", "--model", str(smollm2_path), "--port", "0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first = p.stderr.readline()
        port = int(re.search(r"listening on http://[^:]+:(\d+)", first).group(1))
        base = f"http://127.0.0.1:{port}"
        assert requests.get(base + "/health/live", timeout=10).status_code == 200
        r = requests.get(base + "/health/ready", timeout=10)
        assert r.status_code == 503 and r.json() == {"status": "loading"} and r.headers["Retry-After"] == "1"
        r = requests.post(base + "/v1/completions", json={"prompt": "x"}, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        deadline = time.time() + 180
        while requests.get(base + "/health/ready", timeout=10).status_code != 200:
            assert time.time() < deadline and p.poll() is None
            time.sleep(0.05)
        assert requests.post(base + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                             timeout=60).status_code == 200
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0


def is_dcgm_exporter_lint(line):
    """GPU telemetry (on a GPU host) keeps dcgm-exporter's names and labels (modelName, DCGM_FI_..._COUNTER), which
    promtool's lint flags; docs/telemetry.md."""
    return line.startswith(("DCGM_FI_", "stoke_gpu_")) and (
        line.endswith("label names should be written in 'snake_case' not 'camelCase'")
        or line.endswith("metric name should not include type 'counter'"))


LLM_FAMILIES = ["time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                "request_queue_time_seconds", "request_prompt_tokens", "request_generation_tokens",
                "num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio", "kv_cache_blocks_free",
                "kv_cache_blocks_used", "prefix_cache_hits_total", "prefix_cache_queries_total",
                "prefix_cache_evictions_total", "prompt_tokens_total", "generation_tokens_total",
                "request_success_total", "step_prefill_tokens", "step_decode_tokens", "step_admission_stop_total",
                "request_stage_seconds"]


def promtool_check(text):
    """(exit code, non-empty stderr lines) of `promtool check metrics` on `text`; skips without promtool."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus')")
    p = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    return p.returncode, [l for l in (p.stdout + p.stderr).decode().splitlines() if l.strip()]


def test_metrics_pass_promtool(server, openai_client, model_name):
    openai_client.completions.create(model=model_name, prompt="Hello", max_tokens=4, temperature=0)
    r = server.get("/metrics")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = r.text
    for name in LLM_FAMILIES:
        assert f"# TYPE stoke:{name} " in text, name
    for stage in ["recv", "queue", "preprocess", "compute", "postprocess", "send"]:
        assert server.metric("stoke:request_stage_seconds_count", stage=stage) >= 1, stage
    assert server.metric("stoke:time_to_first_token_seconds_count") >= 1
    assert server.metric("stoke:kv_cache_blocks_free") > 0

    # The default (--metric-names vllm) spells families "stoke:..." after vLLM's "vllm:..."; promtool's only
    # complaint is then its lint against the colon, once per family, and it exits 3 (lint) -- never 1 (parse).
    # (On a GPU host, the GPU series keep dcgm-exporter's names, with lints of their own: is_dcgm_exporter_lint.)
    code, lines = promtool_check(text)
    families = {l.split()[2] for l in text.splitlines() if l.startswith("# TYPE ")}
    colon = [l for l in lines if l.endswith("metric names should not contain ':'")]
    assert code == 3, lines
    assert [l for l in lines if l not in colon and not is_dcgm_exporter_lint(l)] == []
    assert {l.split()[0] for l in colon} == {f for f in families if ":" in f}
    assert len(colon) >= len(LLM_FAMILIES)


def test_prometheus_metric_names_are_lint_clean(start_server):
    srv = start_server("--metric-names", "prometheus")
    r = srv.post("/v1/completions", json={"model": srv.model_name(), "prompt": "Hello", "max_tokens": 4,
                                          "temperature": 0})
    assert r.status_code == 200, r.text
    text = srv.get("/metrics").text
    # The same families, "stoke_" instead of "stoke:", and no colon left in any name.
    for name in LLM_FAMILIES:
        assert f"# TYPE stoke_{name} " in text, name
    assert srv.metric("stoke_time_to_first_token_seconds_count") >= 1
    assert not any(":" in l.split("{")[0].split(" ")[0] for l in text.splitlines() if not l.startswith("#"))
    code, lines = promtool_check(text)
    gpu = [l for l in lines if is_dcgm_exporter_lint(l)]  # GPU hosts only; none on a CPU machine
    assert [l for l in lines if l not in gpu] == []
    assert code == (3 if gpu else 0), lines


def test_metric_names_flag_is_checked(stoke_bin):
    p = subprocess.run([str(stoke_bin), "serve", "--model", "x.gguf", "--port", "0", "--metric-names", "statsd"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--metric-names" in p.stderr, p.stderr


def test_sampling_flag_is_checked(stoke_bin):
    p = subprocess.run([str(stoke_bin), "serve", "--model", "x.gguf", "--port", "0", "--sampling", "gpu"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--sampling" in p.stderr, p.stderr
    h = subprocess.run([str(stoke_bin), "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert "--sampling" in h.stdout and "device" in h.stdout and "host" in h.stdout


def test_keep_alive_reuses_one_connection(server):
    with requests.Session() as s:
        for _ in range(5):
            assert s.get(server.base_url + "/health/live", timeout=10).status_code == 200
    # raw: two requests on one socket, answered in order
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1 200") < 2 or not data.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        assert data.index(b'"status":"live"') < data.index(b'"object":"list"')


def test_many_idle_keep_alive_connections(server, openai_client, model_name):
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(500)]
    try:
        t0 = time.time()
        r = openai_client.completions.create(model=model_name, prompt="Hi", max_tokens=2, temperature=0)
        assert r.usage.completion_tokens >= 1
        assert time.time() - t0 < 30
        # and each idle one still works
        for s in socks[::100]:
            s.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        for s in socks:
            s.close()


def test_config_file_and_flags_win(start_server, tmp_path):
    cfg = tmp_path / "serve.json"
    cfg.write_text(json.dumps({"served-model-name": "from-config", "max_num_seqs": 2, "max-body-bytes": "4KiB"}))
    srv = start_server("--config", cfg)
    assert srv.model_name() == "from-config"
    r = srv.post("/v1/completions", data=b"x" * 5000, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    srv2 = start_server("--config", cfg, "--served-model-name", "from-flag")
    assert srv2.model_name() == "from-flag"


def test_bad_config_is_a_usage_error(stoke_bin, smollm2_path, tmp_path):
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps({"no-such-flag": 1}))
    p = subprocess.run([str(stoke_bin), "serve", "--model", str(smollm2_path), "--port", "0", "--config", str(cfg)],
                       capture_output=True, timeout=60)
    assert p.returncode == 2
    assert b"unknown key 'no-such-flag'" in p.stderr


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGINT])
def test_graceful_shutdown_finishes_in_flight_stream(start_server, signo):
    srv = start_server()
    name = srv.model_name()
    result = {}

    def stream():
        body = {"model": name, "prompt": "Tell me a story.", "max_tokens": 40, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with requests.post(srv.base_url + "/v1/completions", json=body, stream=True, timeout=120) as r:
            result["lines"] = [l for l in r.iter_lines() if l]

    t = threading.Thread(target=stream)
    t.start()
    deadline = time.time() + 30
    while srv.metric("stoke:num_requests_running") < 1 and time.time() < deadline:
        time.sleep(0.02)
    srv.proc.send_signal(signo)
    t.join(timeout=120)
    assert srv.proc.wait(timeout=60) == 0
    assert result["lines"][-1] == b"data: [DONE]"
    # the whole generation arrived: the finish chunk says it ran to max_tokens
    assert json.loads(result["lines"][-2][len(b"data: "):])["choices"][0]["finish_reason"] == "length"
    log = srv.log()
    assert "draining" in log and "stopped" in log
    # no longer listening
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=2)
