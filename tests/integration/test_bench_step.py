"""`stoke bench step` on the CPU over a tiny synthetic model: the report's fields, sizes derived from the
config, and no roofline fields without CUDA."""
import json
import subprocess

import pytest


@pytest.fixture(scope="module")
def tiny(stoke_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("stepbench") / "smol"
    r = subprocess.run([str(stoke_bin), "model", "synth", "--shape", "smollm2-135m", "--layers", "2", "--out",
                        str(out), "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def test_cpu_report(stoke_bin, tiny, tmp_path):
    out = tmp_path / "step.json"
    r = subprocess.run([str(stoke_bin), "bench", "step", "--model", str(tiny), "--device", "cpu",
                        "--decode-batch", "2", "--context", "40", "--prefill", "64", "--chunk", "32",
                        "--iters", "4", "--warmup", "1", "--threads", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    assert json.loads(r.stdout) == j
    assert j["command"].startswith("stoke bench step --model")
    assert j["commit"] and j["date"].endswith("Z")
    assert j["machine"]["device"] == "cpu"
    m = j["model"]
    assert (m["layers"], m["hidden"], m["ffn"], m["vocab"]) == (2, 576, 1536, 49152)
    # matmul params per layer: q 576x576, k/v 192x576 each, o 576x576, gate/up/down 1536x576 each
    assert m["parameters_matmul"] == 2 * (2 * 576 * 576 + 2 * 192 * 576 + 3 * 1536 * 576)
    assert m["parameters_lm_head"] == 49152 * 576
    assert m["bytes_per_param"] == pytest.approx(2.0)  # the synth folder is bf16
    assert m["kv_bytes_per_token"] > 0
    # The CPU backend returns logits: --sampling device (the default) falls back to host sampling, and says so.
    assert j["engine"]["device_sampling"] is True and j["engine"]["cuda_graphs"] is True
    d = j["decode"]
    assert d["sampling"].startswith("host")
    assert d["batch"] == 2 and d["context"] == 40 and d["step_ms"]["n"] == 4
    assert 0 < d["step_ms"]["p10"] <= d["step_ms"]["median"] <= d["step_ms"]["p90"]
    assert d["tokens_per_s"] == pytest.approx(2 / (d["step_ms"]["median"] / 1e3))
    assert d["kv_bytes_per_step"] == pytest.approx(2 * (40 + 1 + 1.5) * m["kv_bytes_per_token"])
    assert d["bytes_per_step"] == pytest.approx(d["weight_bytes_per_step"] + d["kv_bytes_per_step"])
    p = j["prefill"]
    assert p["tokens"] == 64 and p["ms"]["n"] == 3
    assert p["attention_flops"] == pytest.approx(2 * 64 * 64 * 2 * 9 * 64)
    assert p["achieved_tflops"] > 0
    assert "device_roofline" not in j and "hbm_roofline_fraction" not in d and "gemm_fraction" not in p


def test_mixed_steps_report(stoke_bin, tiny):
    """--mixed N: the decode steps again, each with an N-token prompt behind the decodes; the excess over the decode
    step is the two medians' difference, and the mixed step's tokens are the decodes plus the prompt."""
    r = subprocess.run([str(stoke_bin), "bench", "step", "--model", str(tiny), "--device", "cpu",
                        "--decode-batch", "2", "--context", "40", "--prefill", "0", "--mixed", "24",
                        "--iters", "3", "--warmup", "1", "--threads", "2", "--mixed-attention", "prefill"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    x, d = j["mixed"], j["decode"]
    assert (x["batch"], x["prompt_tokens"], x["context"], x["step_ms"]["n"]) == (2, 24, 44, 3)
    assert x["mixed_attention"] == "prefill" == j["engine"]["mixed_attention"]
    assert x["decode_step_ms"] == d["step_ms"]["median"]
    assert x["extra_ms_over_decode"] == pytest.approx(x["step_ms"]["median"] - d["step_ms"]["median"])
    assert x["tokens_per_s"] == pytest.approx(26 / (x["step_ms"]["median"] / 1e3))
    assert "mixed" in r.stderr


def test_cuda_unavailable_is_a_clear_error(stoke_bin, tiny):
    r = subprocess.run([str(stoke_bin), "bench", "step", "--model", str(tiny), "--device", "cuda", "--iters", "1"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 0:
        pytest.skip("this machine has a GPU and a CUDA build")
    assert r.returncode == 1
    assert "--device cuda" in r.stderr


def test_sampling_flag_is_checked(stoke_bin, tiny):
    r = subprocess.run([str(stoke_bin), "bench", "step", "--model", str(tiny), "--sampling", "gpu"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--sampling" in r.stderr and "device" in r.stderr
