"""INT8 encoders (docs/precision.md, "INT8 encoders with calibration"): `--quantization int8` with
`--calibration-data FILE` on all-MiniLM-L6-v2 — calibrated on one real text (GPL-2, one sample per line) and
gated on another (GPL-3's sentences) — in `stoke model check`, `stoke embed` and `stoke serve` (and a repository
folder's stoke.toml); refused without calibration data with a message that says why; refused on a decoder with
a message naming what decoders support. On the CPU the gate passes MiniLM's int8 with per-token activation scales
(the default; mean cosine 0.99928 against 0.999) and rejects it narrowly with --int8-activations static (0.9973:
docs/precision.md), which serve then refuses unless --allow-inconsistent; a saturating static calibration
(--calibration-percentile 50: every activation clipped at its median) is far worse."""
import json
import math
import pathlib
import subprocess

import pytest

CALIBRATION = pathlib.Path("/usr/share/common-licenses/GPL-2")  # Debian's base-files: on every Debian machine
NEEDS_CALIBRATION = "int8 activations are smoothed per channel"


@pytest.fixture(scope="module")
def calibration():
    if not CALIBRATION.exists():
        pytest.skip(f"{CALIBRATION} missing")
    return CALIBRATION


def run(stoke_bin, *args, timeout=600):
    return subprocess.run([str(stoke_bin), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def check_int8(stoke_bin, minilm_path, calibration, out, *extra):
    p = run(stoke_bin, "model", "check", "--model", minilm_path, "--device", "cpu", "--quantization", "int8",
            "--calibration-data", calibration, "--json", out, *extra)
    print(p.stdout)  # the gate's figures (docs/precision.md quotes them)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    report = json.loads(out.read_text())
    assert p.returncode == (0 if report["pass"] else 1), (p.returncode, report)
    assert ("PASS: " if report["pass"] else "FAIL: ") in p.stdout
    return report, {m["name"]: m["value"] for m in report["metrics"]}


def test_check_int8_encoder_reports_its_verdict(stoke_bin, minilm_path, calibration, tmp_path):
    report, metrics = check_int8(stoke_bin, minilm_path, calibration, tmp_path / "int8.json")
    assert report["kind"] == "encoder" and report["positions"] == 64, report
    assert report["reference"] == "cpu fp32" and report["candidate"] == "cpu, weights int8", report
    assert [m["threshold"] for m in report["metrics"]] == [0.999, 0.99]  # the fp8 encoder gate's bars
    assert 0.999 <= metrics["mean_cosine"] < 1  # int8 GEMMs ran (not the reference again), and pass
    assert metrics["min_cosine"] >= 0.99
    assert report["pass"], report  # the default, --int8-activations per-token


def test_check_static_int8_activations_fail_narrowly(stoke_bin, minilm_path, calibration, tmp_path):
    report, metrics = check_int8(stoke_bin, minilm_path, calibration, tmp_path / "static.json",
                                 "--int8-activations", "static")
    assert 0.996 < metrics["mean_cosine"] < 0.999 and metrics["min_cosine"] >= 0.99, report
    assert not report["pass"], report


def test_check_rejects_a_saturating_calibration(stoke_bin, minilm_path, calibration, tmp_path):
    report, metrics = check_int8(stoke_bin, minilm_path, calibration, tmp_path / "bad.json",
                                 "--int8-activations", "static", "--calibration-percentile", 50,
                                 "--sentences", 16)
    assert not report["pass"] and metrics["mean_cosine"] < 0.99, report


@pytest.mark.parametrize("command,args", [
    (["model", "check"], ["--device", "cpu", "--quantization", "int8"]),
    (["embed"], ["--device", "cpu", "--quantization", "int8", "some text"]),
    (["serve"], ["--device", "cpu", "--quantization", "int8", "--port", "0", "--grpc-port", "-1"]),
])
def test_int8_without_calibration_is_refused_and_says_why(stoke_bin, minilm_path, command, args):
    p = run(stoke_bin, *command, "--model", minilm_path, *args, timeout=120)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "--calibration-data FILE" in p.stderr and NEEDS_CALIBRATION in p.stderr, p.stderr[-2000:]
    if command[0] == "model":
        assert p.returncode == 2  # usage


def test_int8_decoder_is_refused(stoke_bin, smollm2_path, calibration):
    p = run(stoke_bin, "model", "check", "--model", smollm2_path, "--device", "cpu", "--quantization", "int8")
    assert p.returncode == 2, p.stderr
    assert "--quantization int8 is for BERT-family encoders" in p.stderr and "fp8" in p.stderr, p.stderr
    p = run(stoke_bin, "model", "check", "--model", smollm2_path, "--device", "cpu", "--kv-cache-dtype", "int8",
            "--calibration-data", calibration)
    assert p.returncode == 2 and "calibration is for encoders" in p.stderr, p.stderr


def test_calibration_data_needs_int8_and_a_readable_file(stoke_bin, minilm_path, calibration, tmp_path):
    p = run(stoke_bin, "model", "check", "--model", minilm_path, "--quantization", "fp8",
            "--calibration-data", calibration)
    assert p.returncode == 2 and "--calibration-data applies to --quantization int8" in p.stderr, p.stderr
    p = run(stoke_bin, "model", "check", "--model", minilm_path, "--quantization", "int8",
            "--calibration-data", calibration, "--int8-activations", "dynamic")
    assert p.returncode != 0 and "--int8-activations" in p.stderr, p.stderr
    p = run(stoke_bin, "embed", "--model", minilm_path, "--device", "cpu", "--quantization", "int8",
            "--calibration-data", tmp_path / "absent.txt", "x")
    assert p.returncode != 0 and "absent.txt" in p.stderr, p.stderr
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n")
    p = run(stoke_bin, "embed", "--model", minilm_path, "--device", "cpu", "--quantization", "int8",
            "--calibration-data", blank, "x")
    assert p.returncode != 0 and "no samples" in p.stderr, p.stderr


def test_embed_int8(stoke_bin, minilm_path, calibration):
    texts = ["The quick brown fox jumps over the lazy dog.", "Free software is a matter of liberty."]

    def embed(*q):
        p = run(stoke_bin, "embed", "--model", minilm_path, "--device", "cpu", *q, *texts)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    fp32, int8 = embed(), embed("--quantization", "int8", "--calibration-data", calibration)
    for a, b in zip(fp32, int8):
        assert len(b) == 384 and math.sqrt(sum(x * x for x in b)) == pytest.approx(1.0, abs=1e-4)
        assert 0.99 < _cosine(a, b) < 1 - 1e-7


def test_serve_int8_encoder_runs_the_gate(stoke_bin, minilm_path, calibration, tmp_path):
    """stoke serve --quantization int8 --calibration-data: gated at load, named on /v1/models, the gauges and the
    ready line; its embeddings are close to the fp32 ones. Served with --allow-inconsistent (the gate passes
    per-token int8 on MiniLM; were it to fail, the same server without the flag must refuse to start)."""
    import openai
    from classic_server import ClassicServer, stoke_embed

    s = ClassicServer(stoke_bin, f"minilm={minilm_path}", "--device", "cpu", "--quantization", "int8",
                      "--calibration-data", calibration, "--allow-inconsistent", "--threads", "2", log_dir=tmp_path)
    try:
        entries = {m["id"]: m for m in s.get("/v1/models").json()["data"]}
        prec = entries["minilm"]["precision"]
        gate = prec["consistency_gate"]
        assert prec["quantization"] == "int8" and gate["candidate"] == "cpu, weights int8", prec
        assert s.metric("stoke:precision_gate_pass", model_name="minilm", quantization="int8",
                        kv_cache_dtype="none") == (1 if gate["pass"] else 0)
        assert "on cpu, weights int8, consistency gate " in s.log()
        texts = ["The quick brown fox jumps over the lazy dog.", "Free software is a matter of liberty."]
        client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        got = [d.embedding for d in client.embeddings.create(model="minilm", input=texts).data]
        for a, b in zip(stoke_embed(stoke_bin, minilm_path, texts), got):
            assert 0.99 < _cosine(a, b) < 1 - 1e-7
    finally:
        assert s.stop() == 0, s.log()
    if gate["pass"]:
        return
    assert "serving a precision the consistency gate rejects (--allow-inconsistent)" in s.log()
    p = run(stoke_bin, "serve", "--model", minilm_path, "--device", "cpu", "--port", "0", "--grpc-port", "-1",
            "--quantization", "int8", "--calibration-data", calibration, timeout=300)
    assert p.returncode != 0 and "the consistency gate rejects this precision" in p.stderr, p.stderr[-2000:]
    assert "FAIL  mean_cosine" in p.stderr, p.stderr[-2000:]


def test_repository_folder_calibration_data(stoke_bin, minilm_path, calibration, tmp_path):
    """stoke.toml `quantization = "int8"` with `calibration_data` (relative to the folder: a copy of the GPL-2
    text); without it the load is refused with the reason."""
    from classic_server import ClassicServer

    repo = tmp_path / "models"
    (repo / "q").mkdir(parents=True)
    (repo / "q" / "calib.txt").write_text(calibration.read_text())
    (repo / "q" / "stoke.toml").write_text(f'source = "{minilm_path}"\nquantization = "int8"\n'
                                           'calibration_data = "calib.txt"\n')
    s = ClassicServer(stoke_bin, None, "--model-repository", repo, "--device", "cpu", "--allow-inconsistent",
                      "--threads", "2", log_dir=tmp_path)
    try:
        entry = {m["id"]: m for m in s.get("/v1/models").json()["data"]}["q"]
        assert entry["precision"]["quantization"] == "int8", entry
        assert entry["precision"]["consistency_gate"]["candidate"] == "cpu, weights int8", entry
    finally:
        assert s.stop() == 0, s.log()
    (repo / "q" / "stoke.toml").write_text(f'source = "{minilm_path}"\nquantization = "int8"\n')
    p = run(stoke_bin, "serve", "--model-repository", repo, "--device", "cpu", "--port", "0", "--grpc-port", "-1",
            timeout=120)
    assert p.returncode != 0 and NEEDS_CALIBRATION in p.stderr, p.stderr[-2000:]
