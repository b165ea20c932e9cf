"""The synthetic model through `stoke serve` (KServe v2 REST): outputs are a function of each row alone whatever
the batch, instances share the work, batching off runs each request alone, and the ledger shows the configured
CPU time where it was spent."""
import concurrent.futures
import re
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

from classic_server import ClassicServer, write_model_file

httpclient = pytest.importorskip("tritonclient.http")

IN, OUT = 64, 40


def expected(rows):
    """Byte j of a row's output = input byte (j mod IN) XOR 0x5A (synthetic.h)."""
    return rows[:, np.arange(OUT) % IN] ^ 0x5A


@pytest.fixture(scope="module")
def servers(stoke_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic")
    common = dict(type="synthetic", input_bytes=IN, output_bytes=OUT, preprocess_us_per_item=300,
                  kernels=[{"count": 3, "flops_per_item": 1e5, "bytes": 65536}], postprocess_us=100,
                  max_batch_size=8)
    # Each batched execution holds its instance for at least 20 ms (a busy wait after the work), far longer than
    # the 3 ms the batcher holds a request: with 8 clients, later requests queue behind a running batch and the
    # next batch goes to the other instance, whatever the machine's speed (with executions of ~1 ms, that depended
    # on whether the Python clients outpaced one instance).
    batched = write_model_file(d, name="synth", dynamic_batching={"max_queue_delay_microseconds": 3000},
                               instance_group=[{"count": 2}], **{**common, "postprocess_us": 20000})
    unbatched = write_model_file(d, name="synth_unbatched", **common)
    s = {"batched": ClassicServer(stoke_bin, batched, log_dir=d),
         "unbatched": ClassicServer(stoke_bin, unbatched, log_dir=tmp_path_factory.mktemp("synthetic_u"))}
    yield s
    for v in s.values():
        assert v.stop() == 0, v.log()


def test_metadata(servers):
    client = httpclient.InferenceServerClient(url=servers["batched"].http_url)
    m = client.get_model_metadata("synth")
    assert m["platform"] == "stoke_synthetic"
    assert m["inputs"] == [{"name": "INPUT0", "datatype": "UINT8", "shape": [-1, IN]}]
    assert m["outputs"] == [{"name": "OUTPUT0", "datatype": "UINT8", "shape": [-1, OUT]}]
    assert client.get_model_config("synth")["instance_group"][0]["count"] == 2
    assert "dynamic_batching" not in httpclient.InferenceServerClient(
        url=servers["unbatched"].http_url).get_model_config("synth_unbatched")


@pytest.mark.parametrize("which", ["batched", "unbatched"])
def test_concurrent_rows_equal_alone(servers, which):
    server = servers[which]
    model = "synth" if which == "batched" else "synth_unbatched"
    local = threading.local()

    def one(i):
        if not hasattr(local, "client"):
            local.client = httpclient.InferenceServerClient(url=server.http_url)
        rows = np.random.default_rng(i).integers(0, 256, size=(1 + i % 3, IN), dtype=np.uint8)
        inp = httpclient.InferInput("INPUT0", list(rows.shape), "UINT8")
        inp.set_data_from_numpy(rows)
        return rows, local.client.infer(model, [inp]).as_numpy("OUTPUT0")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for rows, out in pool.map(one, range(40)):
            np.testing.assert_array_equal(out, expected(rows))
    closes = {dict(ls)["reason"]: v for (n, ls), v in server.metrics().items()
              if n == "stoke:batch_close_total" and dict(ls).get("model_name") == model and v > 0}
    if which == "unbatched":
        assert set(closes) == {"unbatched"}
        assert server.metric("stoke:batch_size_sum", model_name=model) == \
            server.metric("stoke:inference_count_total", model_name=model)
    else:
        assert "unbatched" not in closes
        assert server.metric("stoke:inference_exec_count_total", model_name=model) < 40
        for i in ("0", "1"):  # both instances got work
            assert server.metric("stoke:instance_executions_total", model_name=model, instance=i) > 0


def test_ledger_shows_the_configured_cpu_time(servers):
    server = servers["batched"]
    before = server.metric("stoke:request_stage_seconds_sum", model_name="synth", stage="preprocess")
    # One kept-alive client: a client that closes its connection the moment it has the bytes can make the server
    # see the close before its write completes, and then the request counts as abandoned (no ledger).
    client = httpclient.InferenceServerClient(url=server.http_url)
    inp = httpclient.InferInput("INPUT0", [4, IN], "UINT8")
    inp.set_data_from_numpy(np.zeros((4, IN), dtype=np.uint8))
    client.infer("synth", [inp])
    # The ledger is recorded once the last byte is written, which may be just after the client has it.
    deadline = time.time() + 5
    while True:
        after = server.metric("stoke:request_stage_seconds_sum", model_name="synth", stage="preprocess")
        if after > before or time.time() > deadline:
            break
        time.sleep(0.02)
    assert after - before >= 4 * 300e-6  # 4 rows x 300 us of preprocessing, counted for the request
    assert server.metric("stoke:request_stage_seconds_count", model_name="synth", stage="h2d") > 0
    s = server.get("/v2/models/synth/stats").json()["model_stats"][0]["inference_stats"]
    assert s["compute_input"]["ns"] > 0 and s["compute_output"]["ns"] > 0


def test_wrong_row_size_is_400(servers):
    r = servers["batched"].post("/v2/models/synth/infer", json={
        "inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [1, IN + 1], "data": [0] * (IN + 1)}]})
    assert r.status_code == 400 and f"input 'INPUT0': dim 1 is {IN + 1} but the model needs {IN}" in r.json()["error"]


def _gpu_visible():
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


@pytest.mark.skipif(_gpu_visible(), reason="a GPU is visible: tests/gpu/synthetic_serve_check.py covers device cuda")
def test_device_cuda_without_a_gpu_fails_at_start_saying_why(stoke_bin, tmp_path):
    f = write_model_file(tmp_path, type="synthetic", name="gpu_synth", device="cuda", input_bytes=4, output_bytes=4)
    out = subprocess.run([str(stoke_bin), "serve", "--model", str(f), "--port", "0", "--grpc-port", "-1"],
                         capture_output=True, timeout=60)
    err = out.stderr.decode(errors="replace")
    assert out.returncode == 1, err
    assert re.search(r'"device": "cuda" but (this stoke was built without CUDA|no CUDA GPU is visible)', err), err
