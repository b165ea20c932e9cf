"""KServe v2 REST against a real `stoke serve` of all-MiniLM-L6-v2, driven by tritonclient.http (JSON and binary
tensors), plus raw HTTP for every malformed input and the statistics/metrics the batcher keeps."""
import concurrent.futures
import json
import struct
import threading

import numpy as np
import pytest
import requests

from classic_server import ClassicServer, stoke_embed, write_model_file

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

SENTENCES = ["A man is eating food.", "The weather is lovely today.", "stoke serves sentence embeddings",
             "Ein Satz mit Umlauten: äöü"]


@pytest.fixture(scope="module")
def server(stoke_bin, minilm_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("kserve_http")
    # A queue delay long enough that concurrent requests batch whatever the machine's speed (16 clients leave no
    # 20 ms gap; 2 ms could be a gap between two Python client threads on a loaded machine), short enough that
    # a lone request's wait does not matter; a bounded queue so the 503 path is reachable.
    model = write_model_file(d, type="bert", model=str(minilm_path), name="minilm", max_batch_size=8,
                             dynamic_batching={"max_queue_delay_microseconds": 20000,
                                               "default_queue_policy": {"max_queue_size": 64,
                                                                        "allow_timeout_override": True}},
                             instance_group=[{"count": 2}])
    s = ClassicServer(stoke_bin, model, "--threads", "2", log_dir=d)
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def client(server):
    return httpclient.InferenceServerClient(url=server.http_url, concurrency=8)


@pytest.fixture(scope="module")
def reference(stoke_bin, minilm_path):
    return np.array(stoke_embed(stoke_bin, minilm_path, SENTENCES), dtype=np.float32)


def text_input(texts, binary=True):
    arr = np.array([[t.encode()] for t in texts], dtype=np.object_)
    inp = httpclient.InferInput("text", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr, binary_data=binary)
    return inp


def test_health_and_metadata(client, server):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("minilm")
    assert client.is_model_ready("minilm-ids")
    assert not client.is_model_ready("nope")
    meta = client.get_server_metadata()
    assert meta["name"] == "stoke"
    for ext in ("binary_tensor_data", "statistics", "model_configuration"):
        assert ext in meta["extensions"]
    m = client.get_model_metadata("minilm")
    assert m["name"] == "minilm" and m["versions"] == ["1"] and m["platform"] == "stoke_bert"
    assert m["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}]
    assert m["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    ids = client.get_model_metadata("minilm-ids", model_version="1")
    assert [i["name"] for i in ids["inputs"]] == ["input_ids", "attention_mask"]
    assert ids["inputs"][0]["shape"] == [-1, -1]
    cfg = client.get_model_config("minilm")
    assert cfg["max_batch_size"] == 8
    assert cfg["input"][0]["data_type"] == "TYPE_STRING" and cfg["input"][0]["dims"] == [1]
    assert cfg["output"][0]["dims"] == [384]
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 20000
    assert cfg["instance_group"][0]["count"] == 2
    # Triton's convention: health answers with the status code only.
    r = server.get("/v2/health/ready")
    assert r.status_code == 200 and r.text == ""
    index = server.post("/v2/repository/index").json()
    assert {m["name"] for m in index} == {"minilm", "minilm-ids"}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_equals_stoke_embed(client, reference, binary):
    out = httpclient.InferRequestedOutput("embedding", binary_data=binary)
    res = client.infer("minilm", [text_input(SENTENCES, binary)], outputs=[out], request_id="req-7")
    emb = res.as_numpy("embedding")
    assert emb.shape == (len(SENTENCES), 384) and emb.dtype == np.float32
    assert res.get_response()["id"] == "req-7"
    # The same encoder as `stoke embed`; its fp32 GEMMs may tile differently by batch size.
    np.testing.assert_allclose(emb, reference, rtol=0, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_ids_model_equals_text_model(client, reference, minilm_path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    tok.enable_padding(pad_id=0)
    enc = tok.encode_batch(SENTENCES)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    inputs = []
    for name, arr in (("input_ids", ids), ("attention_mask", mask)):
        inp = httpclient.InferInput(name, list(arr.shape), "INT64")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    emb = client.infer("minilm-ids", inputs).as_numpy("embedding")
    np.testing.assert_allclose(emb, reference, rtol=0, atol=2e-6)


def test_raw_json_request_with_nested_and_flat_data(server, reference):
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": [[SENTENCES[0]], [SENTENCES[1]]]}]}
    r = server.post("/v2/models/minilm/versions/1/infer", json=body)
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["model_name"] == "minilm" and j["model_version"] == "1" and "id" not in j
    out = j["outputs"][0]
    assert out["name"] == "embedding" and out["shape"] == [2, 384] and out["datatype"] == "FP32"
    np.testing.assert_allclose(np.array(out["data"], dtype=np.float32).reshape(2, 384), reference[:2], atol=2e-6)
    flat = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": SENTENCES[:2]}]}
    assert server.post("/v2/models/minilm/infer", json=flat).json()["outputs"][0]["data"] == out["data"]


def test_binary_request_and_response_by_hand(server, reference):
    """The binary extension without tritonclient: length-prefixed BYTES after the JSON header, binary output back."""
    payload = b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in SENTENCES[:3])
    header = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3, 1],
                                     "parameters": {"binary_data_size": len(payload)}}],
                         "outputs": [{"name": "embedding", "parameters": {"binary_data": True}}]}).encode()
    r = server.post("/v2/models/minilm/infer", data=header + payload,
                    headers={"Inference-Header-Content-Length": str(len(header)),
                             "Content-Type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    hl = int(r.headers["Inference-Header-Content-Length"])
    head = json.loads(r.content[:hl])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 3 * 384 * 4
    emb = np.frombuffer(r.content[hl:], dtype="<f4").reshape(3, 384)
    np.testing.assert_allclose(emb, reference[:3], atol=2e-6)


def test_concurrent_requests_batch_and_match_alone(client, server, reference):
    before = server.get("/v2/models/minilm/stats").json()["model_stats"][0]

    local = threading.local()

    def one(i):
        # tritonclient.http runs on gevent: one client per thread.
        if not hasattr(local, "client"):
            local.client = httpclient.InferenceServerClient(url=server.http_url)
        s = SENTENCES[i % len(SENTENCES)]
        return i, local.client.infer("minilm", [text_input([s])]).as_numpy("embedding")[0]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(64)))
    for i, emb in results:
        np.testing.assert_allclose(emb, reference[i % len(SENTENCES)], atol=2e-6)
    after = server.get("/v2/models/minilm/stats").json()["model_stats"][0]
    requests_done = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests_done == 64
    assert after["inference_count"] - before["inference_count"] == 64
    assert executions < 64, "16 concurrent clients with a 20 ms queue delay should share batches"


def test_statistics_shape_for_perf_analyzer(server, client):
    client.infer("minilm", [text_input(["stats"])])
    stats = server.get("/v2/models/stats").json()["model_stats"]
    assert {s["name"] for s in stats} == {"minilm", "minilm-ids"}
    s = server.get("/v2/models/minilm/versions/1/stats").json()["model_stats"][0]
    assert s["version"] == "1"
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
                "cache_miss"):
        d = s["inference_stats"][key]
        assert isinstance(d["count"], int) and isinstance(d["ns"], int) and d["count"] >= 0
    assert s["inference_stats"]["queue"]["count"] >= s["inference_stats"]["success"]["count"]
    assert s["inference_stats"]["compute_infer"]["ns"] > 0
    assert s["batch_stats"] and all(b["batch_size"] >= 1 for b in s["batch_stats"])
    assert s["last_inference"] > 1_600_000_000_000
    # tritonclient reads the same document.
    assert client.get_inference_statistics("minilm")["model_stats"][0]["name"] == "minilm"


def test_metrics_ledger_and_batches(server, client):
    client.infer("minilm", [text_input(["metrics"])])
    m = server.metrics()
    for stage in ("recv", "queue", "preprocess", "h2d", "compute", "d2h", "postprocess", "send"):
        assert server.metric("stoke:request_stage_seconds_count", model_name="minilm", stage=stage) > 0, stage
    assert server.metric("stoke:inference_request_success_total", model_name="minilm") > 0
    assert server.metric("stoke:batch_size_count", model_name="minilm") > 0
    assert server.metric("stoke:inference_exec_count_total", model_name="minilm") > 0
    closed = sum(v for (n, ls), v in m.items() if n == "stoke:batch_close_total" and ("model_name", "minilm") in ls)
    assert closed == server.metric("stoke:inference_exec_count_total", model_name="minilm")
    assert server.metric("stoke:instance_busy_seconds_total", model_name="minilm") > 0
    assert server.metric("stoke:batch_queue_depth_count", model_name="minilm") > 0


def ids_body(ids_shape=(1, 3), mask_shape=(1, 3), ids_type="INT64", ids_data=None, mask_data=None):
    n = int(np.prod(ids_shape))
    return {"inputs": [
        {"name": "input_ids", "datatype": ids_type, "shape": list(ids_shape), "data": ids_data or [101] * n},
        {"name": "attention_mask", "datatype": "INT64", "shape": list(mask_shape),
         "data": mask_data or [1] * int(np.prod(mask_shape))}]}


MALFORMED = [
    ("minilm", {"inputs": []}, 400, "input 'text' is missing"),
    ("minilm", {"inputs": [{"name": "text", "datatype": "INT64", "shape": [1, 1], "data": [1]}]}, 400,
     "input 'text': datatype INT64 does not match the model's BYTES"),
    ("minilm", {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]}, 400,
     "input 'text': shape [2] does not match the model's [-1, 1]"),
    ("minilm", {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]}]}, 400,
     "input 'text': dim 1 is 2 but the model needs 1"),
    ("minilm", {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": ["a"]}]}, 400,
     "input 'text': 'data' has 1 elements but shape [2, 1] needs 2"),
    ("minilm", {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [9, 1], "data": ["a"] * 9}]}, 400,
     "input 'text': batch size 9 exceeds the model's max_batch_size 8"),
    ("minilm", {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["a"]},
                           {"name": "extra", "datatype": "BYTES", "shape": [1, 1], "data": ["b"]}]}, 400,
     "unexpected input 'extra'"),
    ("minilm", {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["a"]}],
                "outputs": [{"name": "logits"}]}, 400, "unexpected inference output 'logits'"),
    ("minilm-ids", ids_body(mask_shape=(2, 3)), 400, "input 'attention_mask': batch size 2 differs"),
    ("minilm-ids", ids_body(ids_type="INT32"), 400, "input 'input_ids': datatype INT32"),
    ("minilm-ids", ids_body(ids_data=[101, 999999, 102]), 400, "input 'input_ids': element [0, 1] = 999999"),
    ("minilm-ids", ids_body(mask_data=[0, 0, 0]), 400, "input 'attention_mask': row 0 has no real tokens"),
    ("minilm-ids", ids_body(mask_data=[1, 2, 1]), 400, "input 'attention_mask': element [0, 1] is 2"),
]


@pytest.mark.parametrize("model,body,status,message", MALFORMED, ids=[m[3][:40] for m in MALFORMED])
def test_malformed_inputs_are_400_naming_the_input(server, model, body, status, message):
    r = server.post(f"/v2/models/{model}/infer", json=body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"], r.json()


def test_malformed_binary_and_protocol_errors(server):
    header = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1],
                                     "parameters": {"binary_data_size": 10}}]}).encode()
    bad_prefix = struct.pack("<I", 50) + b"abcdef"  # claims 50 bytes, has 6
    r = server.post("/v2/models/minilm/infer", data=header + bad_prefix,
                    headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 400 and "input 'text': BYTES element 0 claims 50 bytes" in r.json()["error"]
    r = server.post("/v2/models/minilm/infer", data=header + b"x" * 4,
                    headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 400 and "binary_data_size 10 but only 4 bytes" in r.json()["error"]
    r = server.post("/v2/models/minilm/infer", data=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = server.post("/v2/models/minilm/infer", data=header, headers={"Inference-Header-Content-Length": "abc"})
    assert r.status_code == 400
    assert server.post("/v2/models/nope/infer", json={"inputs": []}).status_code == 404
    r = server.get("/v2/models/minilm/versions/2")
    assert r.status_code == 404 and "error" in r.json()
    assert server.get("/v2/models/nope/ready").status_code == 404


def test_errors_through_tritonclient(client):
    with pytest.raises(InferenceServerException) as e:
        client.infer("minilm", [text_input(["a"] * 9)])
    assert "max_batch_size 8" in str(e.value)
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("nope")


def test_queue_timeout_parameter_rejects_with_503(server):
    """priority/timeout parameters are accepted; a 1 us timeout behind a busy batch is rejected with 503."""
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [8, 1], "data": ["long " * 200] * 8}]}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        busy = [pool.submit(server.post, "/v2/models/minilm/infer", json=body) for _ in range(6)]
        quick = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}],
                 "parameters": {"timeout": 1, "priority": 0}}
        codes = [pool.submit(server.post, "/v2/models/minilm/infer", json=quick) for _ in range(4)]
        statuses = [f.result().status_code for f in codes]
        assert all(f.result().status_code == 200 for f in busy)
    assert set(statuses) <= {200, 503}
    assert 503 in statuses, "a request with a 1 us queue timeout behind busy instances should time out"
    assert server.metric("stoke:inference_request_failure_total", model_name="minilm", reason="REJECTED") >= 1
