"""The short soak (bench/soak.py) in CI: 50 connections for 20 s against a tiny `stoke model synth` decoder (chat,
streaming and not) and all-MiniLM-L6-v2 (KServe REST and gRPC, /v1/embeddings). Nothing may be lost or malformed,
no 5xx but 503 back-pressure, and each server's descriptors end where the load left them. The long run is recorded
in bench/results/ (docs/reliability.md)."""
import json
import pathlib
import subprocess
import sys

import pytest

from classic_server import ClassicServer

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_decoder(stoke_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("soak") / "tiny"
    r = subprocess.run([str(stoke_bin), "model", "synth", "--shape", "smollm2-135m", "--layers", "1", "--out", str(out),
                        "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def test_short_soak(start_server, stoke_bin, minilm_path, tiny_decoder, tmp_path):
    decoder = start_server("--max-num-seqs", "32", "--threads", "1", model=tiny_decoder)
    encoder = ClassicServer(stoke_bin, minilm_path, "--threads", "1", log_dir=tmp_path)
    try:
        out = tmp_path / "soak.json"
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--openai", decoder.base_url,
                            "--kserve", encoder.base_url, "--grpc", encoder.grpc_url, "--connections", "50",
                            "--seconds", "20", "--window", "10", "--sample-seconds", "2", "--max-tokens", "4",
                            "--out", str(out)], capture_output=True, text=True, timeout=600)
        result = json.loads(out.read_text())
        assert p.returncode == 0, (p.stdout, p.stderr, result["examples"])
        t = result["totals"]
        assert t["lost"] == 0 and t["malformed"] == 0 and t["5xx"] == 0, result["examples"]
        assert t["ok"] > 0 and t["ok"] + t["backpressure"] == t["requests"]
        assert set(result["config"]["ops"]) == {"chat", "chat_stream", "kserve_rest", "embeddings", "kserve_grpc"}
        for url, s in result["servers"].items():
            assert s["pid"] in (decoder.proc.pid, encoder.proc.pid), (url, s["pid"])
            assert len(s["samples"]) >= 3
        assert decoder.proc.poll() is None and encoder.proc.poll() is None
    finally:
        assert encoder.stop() == 0, encoder.log()
