"""The engine's per-step split on /metrics (stoke:step_seconds_total{part}, step_read_bytes_total{kind},
step_flops_total{kind}) against a real `stoke serve` of SmolLM2-135M-Instruct (Q4_1 GGUF) on the CPU.

One greedy request alone on a fresh server runs a known sequence of steps: one prefill step over its P prompt
tokens (it samples the first token), then N - 1 decode steps at positions P .. P + N - 2. So every counter is
known exactly from the model's shape, read here from the GGUF itself (the gguf package), not from stoke:
  KV positions read     P + sum_{i=1}^{N-1} (P + i)        x 2 x layers x kv_heads x head_dim x 4 bytes (fp32 KV)
  query-key pairs       P (P + 1) / 2 + sum_{i=1}^{N-1} (P + i)   x 4 x layers x heads x head_dim FLOPs
  matmul FLOPs          2 x matmul params x (P + N - 1) + 2 x lm_head params x N
  weight bytes          N x (the file's bytes per 2-D parameter x (matmul + lm_head) + 4 x norms)
and the two measured parts add up to the step time. No wall-clock bound.
"""
import re
import time

import pytest
import requests

gguf = pytest.importorskip("gguf")

N = 12


def scrape(url):
    """{(name, frozenset(labels)): value} of /metrics."""
    out = {}
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)', line)
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(samples, name, **labels):
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= set(ls)]
    assert found, f"{name} {labels} not on /metrics"
    return sum(found)


def shape(path):
    r = gguf.GGUFReader(str(path))

    def field(key):
        f = r.fields[key]
        return int(f.parts[f.data[0]][0])

    L, H = field("llama.block_count"), field("llama.embedding_length")
    heads, kv = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
    F = field("llama.feed_forward_length")
    V = len(r.fields["tokenizer.ggml.tokens"].data)
    hd = H // heads
    nbytes = sum(int(t.n_bytes) for t in r.tensors if len(t.shape) == 2)
    numel = sum(int(t.n_elements) for t in r.tensors if len(t.shape) == 2)
    return dict(L=L, H=H, heads=heads, kv=kv, hd=hd, F=F, V=V, bytes_per_param=nbytes / numel)


def test_one_request_alone_gives_exact_step_counters(start_server, smollm2_path):
    s = shape(smollm2_path)
    L, H, hd = s["L"], s["H"], s["hd"]
    qd, kvd = s["heads"] * hd, s["kv"] * hd
    matmul = L * (H * qd + 2 * H * kvd + qd * H + 3 * H * s["F"])
    lm_head = s["V"] * H
    other = L * 2 * H + H
    weights_per_step = s["bytes_per_param"] * (matmul + lm_head) + 4 * other
    kv_bytes_per_token = 2 * L * kvd * 4

    srv = start_server("--no-gpu-telemetry")
    url = srv.base_url
    model = requests.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    before = scrape(url)
    r = requests.post(url + "/v1/completions", timeout=300, json=dict(
        model=model, prompt="The quick brown fox jumps over the lazy dog because", max_tokens=N, temperature=0,
        ignore_eos=True))
    assert r.status_code == 200, r.text
    P = r.json()["usage"]["prompt_tokens"]
    assert r.json()["usage"]["completion_tokens"] == N
    # The response can reach the client before the engine records its last step: wait for the count.
    for _ in range(600):
        after = scrape(url)
        steps = value(after, "stoke:step_duration_seconds_count") - value(before, "stoke:step_duration_seconds_count")
        if steps >= N:
            break
        time.sleep(0.05)
    assert steps == N

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    decode_ctx = sum(P + i for i in range(1, N))
    assert delta("stoke:step_read_bytes_total", kind="kv") == pytest.approx(kv_bytes_per_token * (P + decode_ctx),
                                                                            rel=1e-9)
    pairs = P * (P + 1) // 2 + decode_ctx
    assert delta("stoke:step_flops_total", kind="attention") == pytest.approx(4 * L * qd * pairs, rel=1e-9)
    assert delta("stoke:step_flops_total", kind="matmul") == pytest.approx(
        2 * matmul * (P + N - 1) + 2 * lm_head * N, rel=1e-9)
    assert delta("stoke:step_read_bytes_total", kind="weights") == pytest.approx(N * weights_per_step, rel=1e-6)
    model_s = delta("stoke:step_seconds_total", part="model")
    host_s = delta("stoke:step_seconds_total", part="host")
    assert model_s > 0 and host_s >= 0
    assert model_s + host_s == pytest.approx(delta("stoke:step_duration_seconds_sum"), rel=1e-6, abs=1e-6)
