"""GPU telemetry through `stoke serve` (synthetic model, classic mode) and `stoke gpu`, with a fake NVML
(<build>/src/telemetry/libfake_nvml.so, src/telemetry/testing/fake_nvml.cc) loaded through STOKE_NVML_LIBRARY,
and with no NVML at all. The fake's values are listed at the top of fake_nvml.cc."""
import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import time

import pytest

from classic_server import ClassicServer, write_model_file

ROOT = pathlib.Path(__file__).resolve().parents[2]


def is_dcgm_exporter_lint(line):
    """promtool's lint against dcgm-exporter's own names (modelName label, ..._COUNTER); test_http_server.py too."""
    return line.startswith(("DCGM_FI_", "stoke_gpu_")) and (
        line.endswith("label names should be written in 'snake_case' not 'camelCase'")
        or line.endswith("metric name should not include type 'counter'"))


def fake_nvml_path():
    build = pathlib.Path(os.environ.get("STOKE_BUILD_DIR", ROOT / "build" / "release"))
    p = build / "src" / "telemetry" / "libfake_nvml.so"
    if not p.exists():
        pytest.skip(f"{p} missing: build the fake_nvml target (STOKE_BUILD_DIR={build})")
    return p


@contextlib.contextmanager
def environ(**values):
    """Sets (or, for None, removes) environment variables for what starts inside the block."""
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = str(v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def synth_model(directory):
    return write_model_file(directory, type="synthetic", name="synth", input_bytes=8, output_bytes=8, max_batch_size=4)


def series(server, name):
    """{frozenset(labels): value} for one metric name."""
    return {ls: v for (n, ls), v in server.metrics().items() if n == name}


def wait_for_metric(server, name, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = series(server, name)
        if s:
            return s
        time.sleep(0.1)
    raise AssertionError(f"{name} not on /metrics within {timeout} s:\n{server.get('/metrics').text}")


def test_serve_exports_dcgm_metrics_from_fake_nvml(stoke_bin, tmp_path):
    model = synth_model(tmp_path)
    with environ(STOKE_NVML_LIBRARY=fake_nvml_path(), FAKE_NVML_GPM=1, FAKE_NVML_DEVICES=1, FAKE_NVML_FAIL=None):
        server = ClassicServer(stoke_bin, model, "--gpu-telemetry-interval-ms", 200, log_dir=tmp_path)
    try:
        assert series(server, "stoke_gpu_telemetry_available") == {frozenset(): 1.0}
        fb = wait_for_metric(server, "DCGM_FI_DEV_FB_USED")
        assert len(fb) == 1
        labels, value = next(iter(fb.items()))
        labels = dict(labels)
        assert value == 10240
        assert labels["gpu"] == "0" and labels["UUID"] == "GPU-fake-0000"
        assert labels["modelName"] == "NVIDIA Fake H200" and labels["device"] == "nvidia0"
        assert labels["pci_bus_id"] == "00000000:19:00.0" and labels["Hostname"]
        sm = wait_for_metric(server, "DCGM_FI_PROF_SM_ACTIVE")  # needs two GPM samples
        assert list(sm.values()) == [0.6]
        assert list(series(server, "DCGM_FI_DEV_POWER_USAGE").values()) == [250]
        assert list(series(server, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE").values()) == [0.4]
        assert not series(server, "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE")  # the fake fails that one
        reasons = {dict(ls)["reason"]: v for ls, v in series(server, "stoke_gpu_clocks_event_reason").items()}
        assert reasons["sw_power_cap"] == 1 and reasons["gpu_idle"] == 0

        promtool = shutil.which("promtool")
        if promtool:  # parses; the only lints on GPU series are dcgm-exporter's own label/metric names
            text = server.get("/metrics").text
            p = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
            assert p.returncode in (0, 3), p.stderr.decode()
            problems = [l for l in p.stderr.decode().splitlines() if l.strip()]
            ours = [l for l in problems if l.startswith(("DCGM_FI_", "stoke_gpu_"))]
            assert ours and [l for l in ours if not is_dcgm_exporter_lint(l)] == []

        snap = server.get("/v1/gpu").json()
        assert snap["available"] is True
        assert snap["driver_version"] == "999.99-fake"
        assert snap["interval_ms"] == 200
        (dev,) = snap["devices"]
        assert dev["uuid"] == "GPU-fake-0000" and dev["gpm_supported"] is True
        assert dev["metrics"]["DCGM_FI_DEV_GPU_UTIL"] == 87
        assert dev["metrics"]["DCGM_FI_PROF_DRAM_ACTIVE"] == 0.55
        assert dev["clocks_event_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]
    finally:
        assert server.stop() == 0, server.log()


@pytest.mark.parametrize("flag", [None, "--no-gpu-telemetry"])
def test_serve_without_nvml_reports_unavailable(stoke_bin, tmp_path, flag):
    model = synth_model(tmp_path)
    extra = [flag] if flag else []
    with environ(STOKE_NVML_LIBRARY=tmp_path / "no" / "libnvidia-ml.so.1"):
        server = ClassicServer(stoke_bin, model, *extra, log_dir=tmp_path)
    try:
        assert series(server, "stoke_gpu_telemetry_available") == {frozenset(): 0.0}
        assert "DCGM_FI_" not in server.get("/metrics").text
        snap = server.get("/v1/gpu").json()
        assert snap["available"] is False and snap["devices"] == []
        assert ("disabled" if flag else "libnvidia-ml.so.1") in snap["reason"]
        # The server still serves.
        assert server.get("/v2/health/ready").status_code == 200
    finally:
        assert server.stop() == 0, server.log()


def run_gpu(stoke_bin, *args, **env):
    with environ(**env):
        return subprocess.run([str(stoke_bin), "gpu", *args], capture_output=True, text=True, timeout=60)


def test_stoke_gpu_json_and_table_with_fake_nvml(stoke_bin):
    env = dict(STOKE_NVML_LIBRARY=fake_nvml_path(), FAKE_NVML_GPM=1, FAKE_NVML_DEVICES=2, FAKE_NVML_FAIL=None)
    out = run_gpu(stoke_bin, "--json", "--interval-ms", "150", **env)
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    assert snap["available"] is True and snap["samples"] == 2
    assert [d["uuid"] for d in snap["devices"]] == ["GPU-fake-0000", "GPU-fake-0001"]
    assert snap["devices"][1]["metrics"]["DCGM_FI_DEV_FB_USED"] == 11264
    assert snap["devices"][0]["metrics"]["DCGM_FI_PROF_SM_ACTIVE"] == 0.6
    assert 0.1 < snap["devices"][0]["gpm_interval_s"] < 5
    table = run_gpu(stoke_bin, "--interval-ms", "150", **env)
    assert table.returncode == 0, table.stderr
    assert "GPU 1: NVIDIA Fake H200" in table.stdout and "DCGM_FI_PROF_SM_ACTIVE" in table.stdout


def test_stoke_gpu_without_nvml_says_why(stoke_bin, tmp_path):
    missing = tmp_path / "libnvidia-ml.so.1"
    out = run_gpu(stoke_bin, STOKE_NVML_LIBRARY=missing)
    assert out.returncode == 1
    assert "GPU telemetry off:" in out.stderr and str(missing) in out.stderr
    out = run_gpu(stoke_bin, "--json", STOKE_NVML_LIBRARY=missing)
    assert out.returncode == 1
    snap = json.loads(out.stdout)
    assert snap["available"] is False and str(missing) in snap["reason"]
