"""The short soak (bench/soak.py) in CI: 50 connections for 20 s against one process serving a tiny `stoke model
synth` decoder (chat, streaming and not) and all-MiniLM-L6-v2 (KServe REST and gRPC, /v1/embeddings). Nothing may be
lost or malformed, no 5xx but 503 back-pressure, and the server stays up. The long run is recorded
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


def test_short_soak(stoke_bin, minilm_path, tiny_decoder, tmp_path):
    # One process serving both models, as issue 18's soak asks (the long run in bench/results/ used two).
    srv = ClassicServer(stoke_bin, None, "--model", f"tiny={tiny_decoder}", "--model", f"minilm={minilm_path}",
                        "--max-num-seqs", "32", "--threads", "1", log_dir=tmp_path)
    try:
        out = tmp_path / "soak.json"
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--openai", srv.base_url,
                            "--kserve", srv.base_url, "--grpc", srv.grpc_url, "--chat-model", "tiny",
                            "--kserve-model", "minilm", "--connections", "50", "--seconds", "20", "--window", "10",
                            "--sample-seconds", "2", "--max-tokens", "4", "--out", str(out)],
                           capture_output=True, text=True, timeout=600)
        result = json.loads(out.read_text())
        assert p.returncode == 0, (p.stdout, p.stderr, result["examples"])
        t = result["totals"]
        assert t["lost"] == 0 and t["malformed"] == 0 and t["5xx"] == 0, result["examples"]
        assert t["ok"] > 0 and t["ok"] + t["backpressure"] == t["requests"]
        assert set(result["config"]["ops"]) == {"chat", "chat_stream", "kserve_rest", "embeddings", "kserve_grpc"}
        assert [s["pid"] for s in result["servers"].values()] == [srv.proc.pid]
        assert len(result["servers"][srv.base_url]["samples"]) >= 3
        assert srv.proc.poll() is None
    finally:
        assert srv.stop() == 0, srv.log()
