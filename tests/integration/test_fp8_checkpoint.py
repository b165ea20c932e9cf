"""Pre-quantised FP8 checkpoints (docs/precision.md) with the real SmolLM2-135M-Instruct: its GGUF becomes a bf16 HF
folder (tests/fixtures/gguf_to_hf.py, checked against the GGUF by the gate), that folder becomes FP8 checkpoints in
the three released layouts (tests/fixtures/fp8_checkpoint.py, numpy only), and stoke loads them as fp8:
- the per-channel checkpoint is bit for bit what `--quantization fp8` makes of the original (mean KL 0);
- against their bf16 original (`stoke model check --reference`) the three layouts land where in-engine fp8 does,
  and a checkpoint with wrong scales fails the gate;
- `stoke serve` serves one as fp8 (no gate: the checkpoint's own precision is the reference) and says so;
- a checkpoint missing a scale is refused, naming the tensor.
Serial: the conversions and two 135M models at fp32 take ~2 GB, and beside the parallel tests' servers a CI run
was killed for memory."""
import json
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fixtures"))
import fp8_checkpoint  # noqa: E402  (its safetensors reader and writer)

TOKENS = ["--tokens", "256", "--greedy-prompts", "2", "--greedy-tokens", "16"]
FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
pytestmark = pytest.mark.serial


def fixture_script(name, *args):
    """Runs tests/fixtures/NAME.py in its own process, so its arrays are freed when it ends."""
    subprocess.run([sys.executable, str(FIXTURES / f"{name}.py"), *map(str, args)], check=True, capture_output=True,
                   timeout=600)


@pytest.fixture(scope="module")
def folders(stoke_bin, smollm2_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8ck")
    template = root / "template"
    subprocess.run([str(stoke_bin), "model", "synth", "--shape", "smollm2-135m", "--layers", "1", "--quiet",
                    "--out", str(template)], check=True, capture_output=True, timeout=120)
    bf16 = root / "smollm2-bf16"
    fixture_script("gguf_to_hf", smollm2_path, template, bf16)
    out = {"bf16": bf16}
    for scales in ("channel", "tensor", "block"):
        out[scales] = root / f"smollm2-fp8-{scales}"
        fixture_script("fp8_checkpoint", bf16, out[scales], "--scales", scales)
    out["wrong"] = root / "smollm2-fp8-wrong-scales"
    fixture_script("fp8_checkpoint", bf16, out["wrong"], "--scale-multiplier", 1.25)
    return out


def check(stoke_bin, tmp_path, *args):
    report = tmp_path / f"report{len(list(tmp_path.glob('report*')))}.json"
    p = subprocess.run([str(stoke_bin), "model", "check", "--device", "cpu", *map(str, args), *TOKENS,
                        "--json", str(report)], capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    r = json.loads(report.read_text())
    r["exit"] = p.returncode
    r["by_name"] = {m["name"]: m["value"] for m in r["metrics"]}
    return r


def test_the_bf16_folder_is_the_gguf_model(stoke_bin, smollm2_path, folders, tmp_path):
    r = check(stoke_bin, tmp_path, "--model", folders["bf16"], "--reference", smollm2_path)
    assert r["pass"], r
    assert r["by_name"]["top1_agreement"] >= 0.95, r


def test_per_channel_checkpoint_is_quantization_fp8_of_the_original_exactly(stoke_bin, folders, tmp_path):
    r = check(stoke_bin, tmp_path, "--model", folders["bf16"], "--quantization", "fp8",
              "--reference", folders["channel"])
    assert r["reference"].startswith("smollm2-fp8-channel: cpu, weights fp8"), r
    assert r["by_name"]["mean_kl"] == 0 and r["by_name"]["top1_agreement"] == 1, r


def test_checkpoints_against_their_bf16_original(stoke_bin, folders, tmp_path):
    got = {k: check(stoke_bin, tmp_path, "--model", folders[k], "--reference", folders["bf16"])
           for k in ("channel", "tensor", "block", "wrong")}
    channel = got["channel"]
    assert channel["pass"] and channel["exit"] == 0, channel
    assert channel["candidate"] == "smollm2-fp8-channel: cpu, weights fp8, kv fp32", channel
    assert channel["reference"] == "smollm2-bf16: cpu, kv fp32", channel
    kl = channel["by_name"]["mean_kl"]
    assert 0 < kl < 0.05
    # Per tensor and per 128 x 128 block: the same E4M3 rounding error (2.6 % RMS of the weights on this model),
    # so the same distance from the original; whether each passes is at the edge on a 135M model (docs/precision.md).
    for k in ("tensor", "block"):
        assert 0.5 * kl < got[k]["by_name"]["mean_kl"] < 2 * kl, (k, got[k])
        assert got[k]["by_name"]["top1_agreement"] >= 0.85, (k, got[k])
    wrong = got["wrong"]  # scales 1.25x too large
    assert not wrong["pass"] and wrong["exit"] == 1, wrong
    assert wrong["by_name"]["mean_kl"] > 10 * kl, wrong


def test_serve_an_fp8_checkpoint(start_server, folders):
    """Served as fp8, with or without --quantization fp8: no load-time gate (fp8 is the checkpoint's own
    precision; comparing it with itself would say nothing)."""
    srv = start_server("--device", "cpu", "--kv-cache-bytes", 16 << 20, "--quantization", "fp8",
                       model=folders["channel"])
    entry = srv.get("/v1/models").json()["data"][0]
    assert entry["precision"]["quantization"] == "fp8", entry
    assert entry["precision"]["consistency_gate"] is None, entry
    assert "(fp32, weights fp8)" in srv.log(), srv.log()[-3000:]  # the ready line
    body = {"model": srv.model_name(), "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    r = srv.post("/v1/completions", json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["text"].strip(), r.text
    srv.stop()


def test_model_check_without_a_reference_has_nothing_to_compare(stoke_bin, folders):
    p = subprocess.run([str(stoke_bin), "model", "check", "--device", "cpu", "--model", str(folders["channel"]),
                        "--quantization", "fp8", *TOKENS], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "is a pre-quantised FP8 checkpoint" in p.stderr and "--reference" in p.stderr, p.stderr


def test_a_missing_scale_is_named(stoke_bin, folders, tmp_path):
    broken = tmp_path / "no-scale"
    fixture_script("fp8_checkpoint", folders["bf16"], broken)
    st = broken / "model.safetensors"
    tensors = {name: (dtype, v.shape, raw) for name, (v, dtype, raw) in fp8_checkpoint.read_safetensors(st).items()
               if name != "model.layers.7.mlp.up_proj.weight_scale"}
    fp8_checkpoint.write_safetensors(st, tensors)
    p = subprocess.run([str(stoke_bin), "model", "check", "--device", "cpu", "--model", str(broken),
                        "--reference", str(folders["bf16"]), *TOKENS], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "model.layers.7.mlp.up_proj.weight is F8_E4M3 but" in p.stderr and "_scale" in p.stderr, p.stderr
