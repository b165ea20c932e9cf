"""perf_analyzer (Triton's load generator) against stoke over HTTP and gRPC, concurrency 1-16: it must reach its
stability criterion (last 3 windows within the allowed spread) and read stoke's server-side statistics (queue and
compute columns), which only happens when the statistics extension is complete and well-typed.

perf_analyzer comes from the tritonclient wheel. The newest wheels need glibc 2.38, so tests/perf_analyzer.txt
pins an older one installed on its own (`pip install --no-deps --target .venv/perf_analyzer -r
tests/perf_analyzer.txt`); its binary also needs libcudart.so.12 (nvidia-cuda-runtime-cu12 in requirements.txt)
although it never touches a GPU here. STOKE_PERF_ANALYZER overrides the path.
"""
import csv
import os
import pathlib
import shutil
import subprocess

import pytest

from classic_server import ClassicServer, write_model_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
WINDOW_MS = int(os.environ.get("STOKE_PA_WINDOW_MS", "2000"))
# CI machines are shared: a looser spread than perf_analyzer's 10% default, still its 3-window rule.
STABILITY = os.environ.get("STOKE_PA_STABILITY", "50")


def _cuda_runtime_lib():
    try:
        import nvidia.cuda_runtime
        return str(pathlib.Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib")
    except ImportError:
        return None


@pytest.fixture(scope="module")
def perf_analyzer():
    candidates = [os.environ.get("STOKE_PERF_ANALYZER"), ROOT / ".venv/perf_analyzer/bin/perf_analyzer",
                  shutil.which("perf_analyzer")]
    env = dict(os.environ)
    lib = _cuda_runtime_lib()
    if lib:
        env["LD_LIBRARY_PATH"] = lib + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    for c in candidates:
        if not c or not pathlib.Path(c).exists():
            continue
        probe = subprocess.run([str(c), "--help"], capture_output=True, text=True, env=env, timeout=60)
        if "error while loading shared libraries" in probe.stderr or "GLIBC" in probe.stderr:
            continue
        return str(c), env
    pytest.skip("no runnable perf_analyzer: pip install --no-deps --target .venv/perf_analyzer -r "
                "tests/perf_analyzer.txt (and nvidia-cuda-runtime-cu12), or set STOKE_PERF_ANALYZER")


def run_pa(perf_analyzer, tmp_path, model, url, protocol, extra=()):
    exe, env = perf_analyzer
    out = tmp_path / f"{model}-{protocol}.csv"
    args = [exe, "-m", model, "-u", url, "-i", protocol, "--concurrency-range", "1:16:5",
            "--measurement-interval", str(WINDOW_MS), "--stability-percentage", STABILITY, "--max-trials", "10",
            "-f", str(out), *extra]
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, f"perf_analyzer failed ({p.returncode})\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    assert "Failed to obtain stable measurement" not in p.stdout, p.stdout[-3000:]
    assert "Server:" in p.stdout, "server-side statistics were not collected:\n" + p.stdout[-3000:]
    # perf_analyzer orders its CSV by throughput, not by concurrency: sort before comparing points.
    rows = sorted(csv.DictReader(out.open()), key=lambda r: int(r["Concurrency"]))
    assert [int(r["Concurrency"]) for r in rows] == [1, 6, 11, 16], rows
    for r in rows:
        assert float(r["Inferences/Second"]) > 0
        assert int(r["Server Compute Infer"]) > 0, r  # from the statistics extension, in microseconds
        assert "Server Queue" in r
    return rows, p.stdout


@pytest.fixture(scope="module")
def minilm_server(stoke_bin, minilm_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("pa_minilm")
    model = write_model_file(d, type="bert", model=str(minilm_path), name="minilm", max_batch_size=16,
                             dynamic_batching={"max_queue_delay_microseconds": 500})
    s = ClassicServer(stoke_bin, model, "--threads", "2", log_dir=d)
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def synthetic_server(stoke_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("pa_synth")
    model = write_model_file(d, type="synthetic", name="synth", input_bytes=256, output_bytes=64,
                             preprocess_us_per_item=50, launch_us=5,
                             kernels=[{"name": "gemm", "count": 4, "flops_per_item": 2e5, "bytes": 1 << 20}],
                             postprocess_us_per_item=20, max_batch_size=8,
                             dynamic_batching={"max_queue_delay_microseconds": 200}, instance_group=[{"count": 2}])
    s = ClassicServer(stoke_bin, model, log_dir=d)
    yield s
    assert s.stop() == 0, s.log()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_minilm_text(perf_analyzer, minilm_server, tmp_path, protocol):
    url = minilm_server.http_url if protocol == "http" else minilm_server.grpc_url
    rows, _ = run_pa(perf_analyzer, tmp_path, "minilm", url, protocol, ["--string-length", "32"])
    # Dynamic batching shows up as fewer executions than requests at concurrency 16.
    stats = minilm_server.get("/v2/models/minilm/stats").json()["model_stats"][0]
    assert stats["inference_count"] > stats["execution_count"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_synthetic(perf_analyzer, synthetic_server, tmp_path, protocol):
    url = synthetic_server.http_url if protocol == "http" else synthetic_server.grpc_url
    before = synthetic_server.get("/v2/models/synth/stats").json()["model_stats"][0]
    rows, _ = run_pa(perf_analyzer, tmp_path, "synth", url, protocol)
    # More load is served in fewer executions than requests: the batcher shared them out (a count; comparing the
    # throughputs of two points measured seconds apart compared the machine's load at those moments too).
    after = synthetic_server.get("/v2/models/synth/stats").json()["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] > after["execution_count"] - before["execution_count"]
