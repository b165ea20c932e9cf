"""Precision (docs/precision.md): `stoke model check` passes SmolLM2 with an 8-bit KV cache, writes its report and
refuses bad input with exit 2; `stoke serve --kv-cache-dtype int8` runs the gate at load (result on /v1/models and
/metrics), fits more KV blocks into the same --kv-cache-bytes and still serves text; a --model-repository folder
sets the dtype per decoder (stoke.toml kv_cache_dtype); fp8 weights (--quantization fp8) go through the same gate,
in model check and at load; so do fp8 encoder weights (model check, serve with its /v1/models entry, KServe
metadata and gauges, a stoke.toml per encoder). (A failing precision refused at load:
tools/precision/serve_gate_test.cc and encoder_gate_test.cc, through the test-only broken quantisers no flag
reaches.)"""
import json
import math
import subprocess

import pytest
import requests

# SmolLM2-135M: 30 layers, 3 KV heads of 64. Bytes per token = 2 (K, V) x 30 x 3 x row, row = 64 x 2 in bf16 and
# 64 + 4 (the fp32 scale of the (token, head) row) in int8 / fp8.
KV_ROWS = 2 * 30 * 3
BYTES_PER_TOKEN = {"bf16": KV_ROWS * 128, "int8": KV_ROWS * 68, "fp8": KV_ROWS * 68}


def run_check(stoke_bin, *args, timeout=300):
    return subprocess.run([str(stoke_bin), "model", "check", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_int8_kv_passes_the_gate(stoke_bin, smollm2_path, tmp_path):
    out = tmp_path / "check.json"
    p = run_check(stoke_bin, "--model", smollm2_path, "--device", "cpu", "--kv-cache-dtype", "int8", "--tokens", 128,
                  "--greedy-prompts", 2, "--greedy-tokens", 16, "--json", out)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASS  top1_agreement" in p.stdout
    report = json.loads(out.read_text())
    assert report["pass"] is True
    assert report["kind"] == "decoder"
    assert report["candidate"].endswith("kv int8") and report["reference"].endswith("kv fp32")
    assert report["positions"] == 128
    names = [m["name"] for m in report["metrics"]]
    assert names == ["top1_agreement", "mean_kl", "perplexity_ratio", "greedy_agreement"]
    assert all(m["pass"] for m in report["metrics"])


def test_user_data_file(stoke_bin, smollm2_path, tmp_path):
    data = tmp_path / "text.txt"
    data.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    p = run_check(stoke_bin, "--model", smollm2_path, "--device", "cpu", "--kv-cache-dtype", "fp8", "--tokens", 64,
                  "--greedy-tokens", 0, "--data", data)
    assert p.returncode in (0, 1), p.stderr  # ran; the verdict on a repetitive text is not the point
    assert "64 positions" in p.stdout


@pytest.mark.parametrize("args,message", [
    (["--kv-cache-dtype", "int4"], "--kv-cache-dtype"),
    (["--kv-cache-dtype", "int8", "--quantization", "int8"], "--quantization int8 is for BERT-family encoders"),
    (["--kv-cache-dtype", "int8", "--quantization", "q2"], "--quantization: q2"),
    (["--kv-cache-dtype", "auto"], "nothing to compare"),
    (["--quantization", "none"], "give --quantization fp8"),
    (["--kv-cache-dtype", "int8", "--data", "/nonexistent/text"], "--data /nonexistent/text"),
])
def test_usage_errors_exit_2(stoke_bin, smollm2_path, args, message):
    p = run_check(stoke_bin, "--model", smollm2_path, "--device", "cpu", *args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in p.stderr


def test_fp8_weights_check_reports_its_verdict(stoke_bin, smollm2_path, tmp_path):
    """--quantization fp8 on the CPU: the weights are rounded at load, so the logits move (KL > 0); the exit code
    is the report's verdict (this 135M Q4_1 model sits at the thresholds: docs/precision.md)."""
    out = tmp_path / "fp8.json"
    p = run_check(stoke_bin, "--model", smollm2_path, "--device", "cpu", "--quantization", "fp8", "--tokens", 64,
                  "--greedy-prompts", 1, "--greedy-tokens", 8, "--json", out)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    report = json.loads(out.read_text())
    assert p.returncode == (0 if report["pass"] else 1), (p.returncode, report)
    assert report["candidate"] == "cpu, weights fp8, kv fp32" and report["reference"] == "cpu, kv fp32", report
    assert report["positions"] == 64
    metrics = {m["name"]: m for m in report["metrics"]}
    assert list(metrics) == ["top1_agreement", "mean_kl", "perplexity_ratio", "greedy_agreement"]
    assert all(math.isfinite(m["value"]) for m in metrics.values()), metrics
    assert report["pass"] == all(m["pass"] for m in metrics.values())
    assert metrics["mean_kl"]["value"] > 0  # another precision, not the reference again
    assert 0 < metrics["top1_agreement"]["value"] <= 1


def test_serve_int8_kv_fits_more_blocks(start_server):
    budget = 64 << 20
    blocks = {}
    for dtype in ("bf16", "int8"):
        srv = start_server("--device", "cpu", "--kv-cache-bytes", budget, "--block-size", 16, "--kv-cache-dtype", dtype)
        free = srv.metric("stoke:kv_cache_blocks_free")
        blocks[dtype] = free
        assert free == budget // (BYTES_PER_TOKEN[dtype] * 16), (dtype, free)
        body = {"model": srv.model_name(), "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
        r = requests.post(srv.base_url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"]
        # The gate ran at load (fp32 is the CPU's reference): its result on /v1/models and /metrics.
        entry = srv.get("/v1/models").json()["data"][0]
        assert entry["precision"]["kv_cache_dtype"] == dtype
        assert entry["device"] == "cpu", entry  # where it runs: stoke doctor reads it
        gate = entry["precision"]["consistency_gate"]
        assert gate["pass"] is True and gate["candidate"].endswith("kv " + dtype), gate
        assert srv.metric("stoke:precision_gate_pass", kv_cache_dtype=dtype) == 1
        assert 0.9 <= srv.metric("stoke:precision_gate_metric", metric="top1_agreement") <= 1
        srv.stop()
    assert blocks["int8"] >= 1.8 * blocks["bf16"]


def test_serve_fp8_weights_runs_the_gate_at_load(stoke_bin, smollm2_path, start_server, tmp_path):
    """stoke serve --quantization fp8: the gate runs at load; /v1/models, the gauges and the summary line name the
    weight precision. Served with --allow-inconsistent (the gate may reject fp8 on this tiny Q4_1 model); when it
    did, the same server without the flag refuses to start."""
    srv = start_server("--device", "cpu", "--kv-cache-bytes", 16 << 20, "--quantization", "fp8",
                       "--allow-inconsistent")
    entry = srv.get("/v1/models").json()["data"][0]
    assert entry["precision"]["quantization"] == "fp8"
    assert entry["precision"]["kv_cache_dtype"] == "fp32"
    gate = entry["precision"]["consistency_gate"]
    assert gate["candidate"] == "cpu, weights fp8, kv fp32" and gate["reference"] == "cpu, kv fp32", gate
    assert all(math.isfinite(m["value"]) for m in gate["metrics"]), gate
    assert srv.metric("stoke:precision_gate_pass", quantization="fp8") == (1 if gate["pass"] else 0)
    assert "(fp32, weights fp8, consistency gate " in srv.log()
    body = {"model": srv.model_name(), "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    r = srv.post("/v1/completions", json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
    srv.stop()
    if gate["pass"]:
        assert "consistency gate rejects" not in srv.log()
        return
    assert "serving a precision the consistency gate rejects (--allow-inconsistent)" in srv.log()
    p = subprocess.run([str(stoke_bin), "serve", "--model", str(smollm2_path), "--device", "cpu", "--port", "0",
                        "--kv-cache-bytes", str(16 << 20), "--quantization", "fp8"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "the consistency gate rejects this precision" in p.stderr, p.stderr[-2000:]


def test_serve_reference_precision_runs_no_gate(server):
    entry = server.get("/v1/models").json()["data"][0]
    assert entry["precision"]["consistency_gate"] is None
    assert entry["precision"]["kv_cache_dtype"] in ("fp32", "bf16")
    assert entry["precision"]["quantization"] == "none"
    assert "precision_gate_pass" not in server.metrics_text()


def test_encoder_gate_compares_embeddings(stoke_bin, minilm_path, tmp_path):
    out = tmp_path / "enc.json"
    p = run_check(stoke_bin, "--model", minilm_path, "--device", "cpu", "--sentences", 8, "--json", out)
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads(out.read_text())
    assert report["kind"] == "encoder" and report["positions"] == 8
    assert [m["name"] for m in report["metrics"]] == ["mean_cosine", "min_cosine"]
    # On the CPU there is one encoder precision: fp32 against itself.
    assert report["metrics"][0]["value"] == pytest.approx(1.0, abs=1e-6)
    p = run_check(stoke_bin, "--model", minilm_path, "--kv-cache-dtype", "int8")
    assert p.returncode == 2 and "no KV cache" in p.stderr


def test_fp8_encoder_check_reports_its_verdict(stoke_bin, minilm_path, tmp_path):
    """--quantization fp8 on an encoder: the CPU encoder with its Linear weights' fp8 round trip against the fp32
    one. The embeddings move (cosine < 1) but stay close; the exit code is the report's verdict (on the CPU the
    gate rejects MiniLM's fp8 weights narrowly: mean cosine 0.9985 against 0.999, docs/precision.md)."""
    out = tmp_path / "enc_fp8.json"
    p = run_check(stoke_bin, "--model", minilm_path, "--device", "cpu", "--quantization", "fp8", "--sentences", 16,
                  "--json", out)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    report = json.loads(out.read_text())
    assert p.returncode == (0 if report["pass"] else 1), (p.returncode, report)
    assert report["kind"] == "encoder" and report["positions"] == 16
    assert report["reference"] == "cpu fp32" and report["candidate"] == "cpu, weights fp8", report
    metrics = {m["name"]: m for m in report["metrics"]}
    assert list(metrics) == ["mean_cosine", "min_cosine"]
    assert all(math.isfinite(m["value"]) for m in metrics.values()), metrics
    assert report["pass"] == all(m["pass"] for m in metrics.values())
    assert 0.99 < metrics["mean_cosine"]["value"] < 1  # another precision, not the reference again
    assert metrics["min_cosine"]["value"] <= metrics["mean_cosine"]["value"]
    assert ("PASS" if report["pass"] else "FAIL") + ": " in p.stdout


def _cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embed_with_fp8_weights(stoke_bin, minilm_path):
    """stoke embed --quantization fp8 (no gate: a tool): the CPU encoder's weights rounded at load; the vectors
    stay unit-length and close to the fp32 ones without being them."""
    texts = ["The quick brown fox jumps over the lazy dog.", "Free software is a matter of liberty."]

    def run(*q):
        return json.loads(subprocess.run([str(stoke_bin), "embed", "--model", str(minilm_path), "--device", "cpu", *q,
                                          *texts], capture_output=True, text=True, check=True, timeout=300).stdout)

    fp32, fp8 = run(), run("--quantization", "fp8")
    for a, b in zip(fp32, fp8):
        assert len(b) == 384 and math.sqrt(sum(x * x for x in b)) == pytest.approx(1.0, abs=1e-4)
        assert 0.98 < _cosine(a, b) < 1 - 1e-7
    p = subprocess.run([str(stoke_bin), "embed", "--model", str(minilm_path), "--quantization", "int8", "x"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--quantization int8 needs --calibration-data FILE" in p.stderr, p.stderr


def test_serve_fp8_encoder_runs_the_gate_at_load(stoke_bin, minilm_path, tmp_path):
    """stoke serve --quantization fp8 with an encoder: the encoder gate runs at load (served here with
    --allow-inconsistent: it may reject fp8 on MiniLM); /v1/models, the KServe model metadata and config, the
    gauges and the ready line name the weight precision; embeddings still answer over the openai client and
    tritonclient (HTTP and gRPC), close to the fp32 ones. When the gate failed, the same server without the flag
    refuses to start."""
    import numpy as np
    import openai
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from classic_server import ClassicServer, stoke_embed

    s = ClassicServer(stoke_bin, f"minilm={minilm_path}", "--device", "cpu", "--quantization", "fp8",
                      "--allow-inconsistent", "--threads", "2", log_dir=tmp_path)
    try:
        entries = {m["id"]: m for m in s.get("/v1/models").json()["data"]}
        assert set(entries) == {"minilm", "minilm-ids"}
        for e in entries.values():
            assert e["precision"]["quantization"] == "fp8"
            assert "kv_cache_dtype" not in e["precision"]  # an encoder has no KV cache
        gate = entries["minilm"]["precision"]["consistency_gate"]
        assert gate["kind"] == "encoder" and gate["positions"] == 64
        assert gate["reference"] == "cpu fp32" and gate["candidate"] == "cpu, weights fp8", gate
        assert [m["name"] for m in gate["metrics"]] == ["mean_cosine", "min_cosine"]
        assert all(math.isfinite(m["value"]) for m in gate["metrics"]), gate
        verdict = "pass" if gate["pass"] else "fail"
        assert s.metric("stoke:precision_gate_pass", model_name="minilm", quantization="fp8",
                        kv_cache_dtype="none") == (1 if gate["pass"] else 0)
        assert s.metric("stoke:precision_gate_metric", model_name="minilm", metric="mean_cosine") == \
            pytest.approx(gate["metrics"][0]["value"])
        assert "on cpu, weights fp8, consistency gate " in s.log()

        http = httpclient.InferenceServerClient(url=s.http_url)
        meta = http.get_model_metadata("minilm")
        assert meta["parameters"] == {"quantization": "fp8", "consistency_gate": verdict}, meta
        cfg = http.get_model_config("minilm-ids")
        assert cfg["parameters"]["quantization"] == {"string_value": "fp8"}, cfg
        texts = ["The quick brown fox jumps over the lazy dog.", "Free software is a matter of liberty."]
        arr = np.array([[t.encode()] for t in texts], dtype=np.object_)
        inp = httpclient.InferInput("text", list(arr.shape), "BYTES")
        inp.set_data_from_numpy(arr)
        via_http = http.infer("minilm", [inp]).as_numpy("embedding")
        grpc = grpcclient.InferenceServerClient(url=s.grpc_url)
        ginp = grpcclient.InferInput("text", list(arr.shape), "BYTES")
        ginp.set_data_from_numpy(arr)
        via_grpc = grpc.infer("minilm", [ginp]).as_numpy("embedding")
        client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        via_openai = [d.embedding for d in client.embeddings.create(model="minilm", input=texts).data]
        fp32 = stoke_embed(stoke_bin, minilm_path, texts)
        for i in range(len(texts)):
            assert len(via_openai[i]) == 384
            assert math.sqrt(sum(x * x for x in via_openai[i])) == pytest.approx(1.0, abs=1e-4)
            assert np.allclose(via_http[i], via_openai[i], atol=1e-5)
            assert np.allclose(via_grpc[i], via_openai[i], atol=1e-5)
            # fp8 weights: close to the fp32 embedding, not the same.
            assert 0.98 < _cosine(via_openai[i], fp32[i]) < 1 - 1e-7
    finally:
        assert s.stop() == 0, s.log()
    if gate["pass"]:
        assert "consistency gate rejects" not in s.log()
        return
    assert "serving a precision the consistency gate rejects (--allow-inconsistent)" in s.log()
    p = subprocess.run([str(stoke_bin), "serve", "--model", str(minilm_path), "--device", "cpu", "--port", "0",
                        "--grpc-port", "-1", "--quantization", "fp8"], capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "the consistency gate rejects this precision" in p.stderr, p.stderr[-2000:]
    assert "FAIL  mean_cosine" in p.stderr or "FAIL  min_cosine" in p.stderr, p.stderr[-2000:]


def test_repository_folder_sets_an_encoders_quantization(stoke_bin, minilm_path, tmp_path):
    """stoke.toml `quantization = "fp8"` on an encoder folder: that encoder is gated and names its precision, the
    other keeps the checkpoint's weights (no precision entry, no gauge); on a synthetic model it is refused."""
    from classic_server import ClassicServer

    repo = tmp_path / "models"
    for name, toml in {"q": f'source = "{minilm_path}"\nquantization = "fp8"\n',
                       "ref": f'source = "{minilm_path}"\n'}.items():
        (repo / name).mkdir(parents=True)
        (repo / name / "stoke.toml").write_text(toml)
    s = ClassicServer(stoke_bin, None, "--model-repository", repo, "--device", "cpu", "--allow-inconsistent",
                      "--threads", "2", log_dir=tmp_path)
    try:
        entries = {m["id"]: m for m in s.get("/v1/models").json()["data"]}
        assert entries["q"]["precision"]["quantization"] == "fp8"
        assert entries["q"]["precision"]["consistency_gate"]["candidate"] == "cpu, weights fp8"
        assert "precision" not in entries["ref"]
        assert "parameters" not in s.get("/v2/models/ref").json()
        assert not any(n.startswith("stoke:precision_gate") and ("model_name", "ref") in ls
                       for n, ls in s.metrics())
    finally:
        assert s.stop() == 0, s.log()
    synth = tmp_path / "synth"
    (synth / "s").mkdir(parents=True)
    (synth / "s" / "model.json").write_text(json.dumps({"type": "synthetic", "name": "s", "input_bytes": 4,
                                                        "output_bytes": 4, "max_batch_size": 1}))
    (synth / "s" / "stoke.toml").write_text('quantization = "fp8"\n')
    p = subprocess.run([str(stoke_bin), "serve", "--model-repository", str(synth), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "quantization 'fp8' applies to decoders and encoders" in p.stderr, p.stderr


def test_repository_folder_sets_the_kv_dtype_per_model(stoke_bin, smollm2_path, minilm_path, tmp_path):
    """stoke.toml `kv_cache_dtype` per decoder: the gate runs for that one only; each decoder's /v1/models entry
    and gauges say its own precision; a reload through the repository API runs the gate again."""
    from classic_server import ClassicServer

    repo = tmp_path / "models"
    for name, toml in {"q8": f'source = "{smollm2_path}"\nkv_cache_dtype = "int8"\n',
                       "ref": f'source = "{smollm2_path}"\n',
                       "minilm": f'source = "{minilm_path}"\n'}.items():
        (repo / name).mkdir(parents=True)
        (repo / name / "stoke.toml").write_text(toml)
    s = ClassicServer(stoke_bin, None, "--model-repository", repo, "--device", "cpu", "--kv-cache-bytes", "64MiB",
                      "--threads", "2", log_dir=tmp_path)
    try:
        entries = {m["id"]: m for m in s.get("/v1/models").json()["data"]}
        assert entries["q8"]["precision"]["kv_cache_dtype"] == "int8"
        assert entries["q8"]["precision"]["consistency_gate"]["pass"] is True
        assert entries["ref"]["precision"] == {"kv_cache_dtype": "fp32", "quantization": "none",
                                               "consistency_gate": None}
        assert "precision" not in entries["minilm"]
        assert s.metric("stoke:precision_gate_pass", model_name="q8", kv_cache_dtype="int8") == 1
        assert not any(n.startswith("stoke:precision_gate") and ("model_name", "ref") in ls
                       for n, ls in s.metrics())
        assert "(int8, consistency gate passed)" in s.log()
        body = {"model": "q8", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
        r = s.post("/v1/completions", json=body)
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
        assert s.post("/v2/repository/models/q8/unload").status_code == 200
        assert s.post("/v2/repository/models/q8/load").status_code == 200
        entry = next(m for m in s.get("/v1/models").json()["data"] if m["id"] == "q8")
        assert entry["precision"]["consistency_gate"]["pass"] is True
        assert s.metric("stoke:precision_gate_pass", model_name="q8") == 1
    finally:
        assert s.stop() == 0, s.log()


@pytest.mark.parametrize("key,value", [("kv-cache-dtype", "int4"), ("kv_cache_dtype", "int4"),
                                       ("quantization", "int4"),
                                       ("quantization", "int8")])  # int8: encoders only
def test_repository_folder_rejects_an_unknown_precision(stoke_bin, smollm2_path, tmp_path, key, value):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "stoke.toml").write_text(f'source = "{smollm2_path}"\n{key} = "{value}"\n')
    p = subprocess.run([str(stoke_bin), "serve", "--model-repository", str(tmp_path), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    name = key.replace("-", "_")
    assert p.returncode == 2 and f"{name} '{value}'" in p.stderr and "stoke.toml" in p.stderr, p.stderr
