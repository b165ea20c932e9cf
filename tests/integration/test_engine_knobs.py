"""The engine knobs (docs/api.md "Engine knobs") are flags and --config keys of stoke serve: a bad value is a usage
error (exit 2) naming the flag, and the CPU knob --ggml-numerics changes the numerics without breaking serving."""
import json
import subprocess

import openai
import pytest
import requests


@pytest.mark.parametrize("flag,value,message", [
    ("--gemv-split", "3", b"--gemv-split 3"),
    ("--gemv-max-rows", "9", b"--gemv-max-rows 9"),
    ("--fp8-gemv-max-rows", "-1", b"--fp8-gemv-max-rows -1"),
    ("--decode-min-partition", "0", b"--decode-min-partition 0"),
    ("--decode-partition", "8", b"--decode-partition 8"),  # below --decode-min-partition (16)
    ("--prefill-attention", "tiled", b"--prefill-attention"),
    ("--decode-pipeline", "maybe", b"--decode-pipeline"),
    ("--decode-attention", "fast", b"--decode-attention"),
    ("--decode-stages", "5", b"--decode-stages 5"),
    ("--kquant-gemv", "int4", b"--kquant-gemv"),
    ("--mixed-attention", "decode", b"--mixed-attention"),
    ("--event-batching", "maybe", b"--event-batching"),
    ("--async-output", "yes", b"--async-output"),
    ("--vector-elementwise", "1", b"--vector-elementwise"),
    ("--encoder-attention", "fast", b"--encoder-attention"),
    ("--quantization", "int4", b"--quantization"),
    ("--target-step-ms", "-1", b"--target-step-ms must be >= 0"),  # int8 parses (encoders); a decoder refuses it at load
])
def test_bad_engine_knob_is_a_usage_error(stoke_bin, smollm2_path, flag, value, message):
    p = subprocess.run([str(stoke_bin), "serve", "--model", str(smollm2_path), "--port", "0", flag, value],
                       capture_output=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr


def test_bad_engine_knob_in_config_is_a_usage_error(stoke_bin, smollm2_path, tmp_path):
    cfg = tmp_path / "knobs.json"
    cfg.write_text(json.dumps({"decode_min_partition": 0}))
    p = subprocess.run([str(stoke_bin), "serve", "--model", str(smollm2_path), "--port", "0", "--config", str(cfg)],
                       capture_output=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert b"--decode-min-partition 0" in p.stderr


def test_event_batching_streams_what_the_whole_response_says(start_server):
    """--event-batching on: streamed greedy texts (tokens handed over in batches, 8 streams at once, so one
    drain carries several connections' tokens) equal the non-streamed texts."""
    from concurrent.futures import ThreadPoolExecutor
    srv = start_server("--event-batching", "on", "--device", "cpu")
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x")
    prompts = [f"Count from {i} upward:" for i in range(8)]

    def whole(p):
        return client.completions.create(model=srv.model_name(), prompt=p, max_tokens=12, temperature=0).choices[0].text

    def streamed(p):
        chunks = client.completions.create(model=srv.model_name(), prompt=p, max_tokens=12, temperature=0, stream=True)
        return "".join(c.choices[0].text for c in chunks if c.choices)

    want = [whole(p) for p in prompts]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(streamed, prompts))
    assert all(want) and got == want


def test_bench_step_rejects_a_bad_knob(stoke_bin, smollm2_path):
    p = subprocess.run([str(stoke_bin), "bench", "step", "--model", str(smollm2_path), "--device", "cpu",
                        "--gemv-split", "5"], capture_output=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert b"--gemv-split 5" in p.stderr


def test_ggml_numerics_off_serves_greedy_text(start_server):
    srv = start_server("--ggml-numerics", "off", "--device", "cpu")
    body = {"model": srv.model_name(), "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    r = requests.post(srv.base_url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"]


@pytest.mark.parametrize("decode_attention", ["warp", "tiled-smem"])
def test_bench_step_records_the_knobs(stoke_bin, tmp_path, decode_attention):
    model = tmp_path / "smol"
    r = subprocess.run([str(stoke_bin), "model", "synth", "--shape", "smollm2-135m", "--layers", "1", "--out",
                        str(model), "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(stoke_bin), "bench", "step", "--model", str(model), "--device", "cpu", "--decode-batch", "1",
                        "--context", "8", "--prefill", "0", "--iters", "1", "--warmup", "0", "--threads", "2",
                        "--gemv-max-rows", "0", "--decode-pipeline", "off", "--prefill-attention", "warp",
                        "--decode-attention", decode_attention],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    e = json.loads(r.stdout)["engine"]
    assert (e["gemv_max_rows"], e["decode_pipeline"], e["prefill_attention"], e["decode_attention"]) == \
        (0, False, "warp", decode_attention)
    # the others at their defaults
    assert (e["gemv_split"], e["pdl"], e["decode_min_partition"], e["decode_partition"], e["ggml_numerics"],
            e["kquant_gemv"], e["mixed_attention"], e["vector_elementwise"], e["decode_stages"],
            e["fp8_gemv_max_rows"]) == (0, "auto", 16, 2048, True, "auto", "split", True, 2, 8)
    assert e["cuda_knobs_apply"] is False  # a CPU run: recorded as given, read by no kernel


def test_bench_step_records_fp8_weights(stoke_bin, tmp_path):
    """--quantization fp8 reaches bench step: the CPU engine it loads names fp8 weights."""
    model = tmp_path / "smol"
    r = subprocess.run([str(stoke_bin), "model", "synth", "--shape", "smollm2-135m", "--layers", "1", "--out",
                        str(model), "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(stoke_bin), "bench", "step", "--model", str(model), "--device", "cpu", "--decode-batch", "1",
                        "--context", "8", "--prefill", "0", "--iters", "1", "--warmup", "0", "--threads", "2",
                        "--quantization", "fp8"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["engine"]["quantization"] == "fp8"


def test_async_output_answers_what_the_server_without_it_answers(start_server):
    """--async-output on: the tokens' text goes out on the output thread while the next step runs. Greedy texts
    (whole and streamed, 6 requests at once), with a stop string taken from each reference text (seen one step
    late there), and finish reasons equal those of a server with it off."""
    from concurrent.futures import ThreadPoolExecutor
    prompts = [f"List {i} colours of the rainbow:" for i in range(6)]

    def run(srv, stops):
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x")

        def whole(i):
            c = client.completions.create(model=srv.model_name(), prompt=prompts[i], max_tokens=16, temperature=0,
                                          stop=stops[i])
            return c.choices[0].text, c.choices[0].finish_reason, c.usage.completion_tokens

        def streamed(i):
            chunks = client.completions.create(model=srv.model_name(), prompt=prompts[i], max_tokens=16,
                                               temperature=0, stop=stops[i], stream=True)
            return "".join(c.choices[0].text for c in chunks if c.choices)

        with ThreadPoolExecutor(6) as pool:
            return list(pool.map(whole, range(6))), list(pool.map(streamed, range(6)))

    sync = start_server("--device", "cpu")  # --async-output auto: off on the CPU
    plain, _ = run(sync, [None] * 6)
    assert all(len(t) >= 12 for t, _, _ in plain), plain
    stops = [t[6:9] if i % 2 == 0 else None for i, (t, _, _) in enumerate(plain)]
    want, want_streamed = run(sync, stops)
    # Exported and 0 with async output off (metric() would also say 0 for a missing series).
    assert any(name == "stoke:step_output_seconds_total" for name, _ in sync.metrics())
    assert sync.metric("stoke:step_output_seconds_total") == 0
    sync.stop()
    srv = start_server("--device", "cpu", "--async-output", "on")
    got, got_streamed = run(srv, stops)
    assert srv.metric("stoke:step_output_seconds_total") > 0  # the output thread's time, beside the steps
    assert got == want
    assert got_streamed == want_streamed == [t for t, _, _ in want]
    assert [f for _, f, _ in want] == ["stop", "length"] * 3
