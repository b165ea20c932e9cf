"""KServe v2 gRPC (inference.GRPCInferenceService) against a real `stoke serve` of all-MiniLM-L6-v2: tritonclient.grpc
(raw_input_contents), the raw stub with typed InferTensorContents, status codes for malformed inputs, the
ModelStreamInfer bidirectional stream."""
import concurrent.futures
import queue
import time

import numpy as np
import pytest

from classic_server import ClassicServer, stoke_embed, write_model_file

grpcclient = pytest.importorskip("tritonclient.grpc")
grpc = pytest.importorskip("grpc")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

SENTENCES = ["A man is eating food.", "The weather is lovely today.", "gRPC carries raw tensors"]


@pytest.fixture(scope="module")
def server(stoke_bin, minilm_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("kserve_grpc")
    # A queue delay long enough that 8 concurrent clients batch whatever the machine's speed (1 ms could be a
    # gap between two Python client threads on a loaded machine), short enough that a lone request's wait does
    # not matter.
    model = write_model_file(d, type="bert", model=str(minilm_path), name="minilm", max_batch_size=4,
                             dynamic_batching={"max_queue_delay_microseconds": 20000}, instance_group=[{"count": 1}])
    s = ClassicServer(stoke_bin, model, "--threads", "2", log_dir=d)
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def client(server):
    return grpcclient.InferenceServerClient(url=server.grpc_url)


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def reference(stoke_bin, minilm_path):
    return np.array(stoke_embed(stoke_bin, minilm_path, SENTENCES), dtype=np.float32)


def text_input(texts):
    arr = np.array([[t.encode()] for t in texts], dtype=np.object_)
    inp = grpcclient.InferInput("text", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr)
    return inp


def test_health_metadata_config(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("minilm")
    assert client.is_model_ready("minilm-ids", "1")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "stoke" and "statistics" in meta["extensions"]
    m = client.get_model_metadata("minilm", as_json=True)
    assert m["versions"] == ["1"] and m["platform"] == "stoke_bert"
    assert m["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1", "1"]}]
    assert m["outputs"][0]["shape"] == ["-1", "384"]
    cfg = client.get_model_config("minilm", as_json=True)["config"]
    assert cfg["max_batch_size"] == 4
    assert cfg["input"][0]["data_type"] == "TYPE_STRING"
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == "20000"
    assert cfg["instance_group"][0]["count"] == 1
    index = client.get_model_repository_index(as_json=True)
    assert {x["name"] for x in index["models"]} == {"minilm", "minilm-ids"}


def test_infer_equals_stoke_embed(client, reference):
    res = client.infer("minilm", [text_input(SENTENCES[:3])], request_id="g-1",
                       outputs=[grpcclient.InferRequestedOutput("embedding")])
    emb = res.as_numpy("embedding")
    assert emb.shape == (3, 384)
    assert res.get_response().id == "g-1"
    np.testing.assert_allclose(emb, reference, rtol=0, atol=2e-6)


def test_typed_contents_through_the_raw_stub(stub, reference, minilm_path):
    from tokenizers import Tokenizer
    enc = Tokenizer.from_file(str(minilm_path / "tokenizer.json")).encode(SENTENCES[1])
    req = service_pb2.ModelInferRequest(model_name="minilm-ids", id="typed")
    for name, values in (("input_ids", enc.ids), ("attention_mask", enc.attention_mask)):
        t = req.inputs.add(name=name, datatype="INT64", shape=[1, len(values)])
        t.contents.int64_contents.extend(values)
    resp = stub.ModelInfer(req)
    assert resp.model_name == "minilm-ids" and resp.model_version == "1" and resp.id == "typed"
    assert resp.outputs[0].name == "embedding" and list(resp.outputs[0].shape) == [1, 384]
    emb = np.frombuffer(resp.raw_output_contents[0], dtype="<f4")
    np.testing.assert_allclose(emb, reference[1], atol=2e-6)
    req = service_pb2.ModelInferRequest(model_name="minilm")
    t = req.inputs.add(name="text", datatype="BYTES", shape=[1, 1])
    t.contents.bytes_contents.append(SENTENCES[2].encode())
    emb = np.frombuffer(stub.ModelInfer(req).raw_output_contents[0], dtype="<f4")
    np.testing.assert_allclose(emb, reference[2], atol=2e-6)


def invalid(stub, req, needle, code=grpc.StatusCode.INVALID_ARGUMENT):
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req)
    assert e.value.code() == code, e.value.details()
    assert needle in e.value.details(), e.value.details()


def test_malformed_inputs_are_invalid_argument(stub):
    def text_req(shape=(1, 1), datatype="BYTES", values=(b"a",), raw=None, name="text", model="minilm"):
        req = service_pb2.ModelInferRequest(model_name=model)
        t = req.inputs.add(name=name, datatype=datatype, shape=list(shape))
        if raw is None:
            t.contents.bytes_contents.extend(values)
        else:
            req.raw_input_contents.append(raw)
        return req

    invalid(stub, text_req(values=(b"a", b"b")), "input 'text': contents has 2 BYTES elements but shape [1, 1]")
    invalid(stub, text_req(shape=(5, 1), values=[b"a"] * 5), "input 'text': batch size 5 exceeds")
    invalid(stub, text_req(shape=(1,)), "input 'text': shape [1] does not match the model's [-1, 1]")
    invalid(stub, text_req(name="words"), "unexpected input 'words'")
    req = service_pb2.ModelInferRequest(model_name="minilm")
    req.inputs.add(name="text", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(1.0)
    invalid(stub, req, "input 'text': datatype FP32 does not match the model's BYTES")
    invalid(stub, text_req(raw=b"\x05\x00\x00\x00ab"), "input 'text': BYTES element 0 claims 5 bytes")
    req = text_req(raw=b"\x01\x00\x00\x00a")
    req.inputs.add(name="other", datatype="BYTES", shape=[1, 1])  # raw for one input but not the other
    invalid(stub, req, "raw_input_contents has 1 entries but there are 2 inputs")
    req = service_pb2.ModelInferRequest(model_name="minilm")
    invalid(stub, req, "input 'text' is missing")
    invalid(stub, text_req(model="nope"), "unknown model 'nope'", grpc.StatusCode.NOT_FOUND)
    req = text_req()
    req.outputs.add(name="logits")
    invalid(stub, req, "unexpected inference output 'logits'")
    req = text_req()
    req.parameters["sequence_id"].int64_param = 7
    invalid(stub, req, "sequence batching", grpc.StatusCode.UNIMPLEMENTED)


def test_errors_through_tritonclient(client):
    with pytest.raises(InferenceServerException) as e:
        client.infer("minilm", [text_input(["a"] * 5)])
    assert "max_batch_size 4" in e.value.message()
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_concurrent_calls_and_statistics(client, reference):
    before = client.get_inference_statistics("minilm", as_json=True)["model_stats"][0]

    def one(i):
        return i, client.infer("minilm", [text_input([SENTENCES[i % 3]])]).as_numpy("embedding")[0]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for i, emb in pool.map(one, range(32)):
            np.testing.assert_allclose(emb, reference[i % 3], atol=2e-6)
    after = client.get_inference_statistics("minilm", as_json=True)["model_stats"][0]
    # proto3 JSON writes uint64 as strings.
    done = int(after["inference_stats"]["success"]["count"]) - int(before["inference_stats"]["success"].get("count", 0))
    assert done == 32
    assert int(after["inference_stats"]["queue"]["count"]) >= int(after["inference_stats"]["success"]["count"])
    assert int(after["execution_count"]) - int(before.get("execution_count", 0)) < 32
    assert after["batch_stats"]
    all_stats = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {s["name"] for s in all_stats} == {"minilm", "minilm-ids"}


def stage_count(server, model, stage):
    return server.metric("stoke:request_stage_seconds_count", model_name=model, stage=stage)


def wait_for_metric(fn, want, timeout=5):
    """The ledger closes after the last byte is written, which may be just after the client has it."""
    deadline = time.time() + timeout
    while fn() < want and time.time() < deadline:
        time.sleep(0.02)
    return fn()


def test_model_stream_infer_through_tritonclient(server, client, reference):
    before = stage_count(server, "minilm", "send")
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i in range(6):
            client.async_stream_infer("minilm", [text_input([SENTENCES[i % 3]])], request_id=f"s-{i}")
        # A malformed request gets an error response; the stream stays open for the next one.
        client.async_stream_infer("minilm", [text_input(["a"] * 5)], request_id="bad")
        client.async_stream_infer("minilm", [text_input(SENTENCES[:2])], request_id="after")
        got, errors = {}, []
        for _ in range(8):
            result, error = results.get(timeout=120)
            if error is not None:
                errors.append(error.message())
            else:
                got[result.get_response().id] = result.as_numpy("embedding")
    finally:
        client.stop_stream()
    assert len(errors) == 1 and "max_batch_size 4" in errors[0], errors
    assert set(got) == {f"s-{i}" for i in range(6)} | {"after"}
    for i in range(6):
        np.testing.assert_allclose(got[f"s-{i}"][0], reference[i % 3], atol=2e-6)
    np.testing.assert_allclose(got["after"], reference[:2], atol=2e-6)
    # Every answered request closed its ledger, like a unary call; the refused one did not.
    assert wait_for_metric(lambda: stage_count(server, "minilm", "send"), before + 7) == before + 7
    for stage in ("recv", "queue", "preprocess", "compute", "postprocess"):
        assert stage_count(server, "minilm", stage) >= before + 7, stage


def test_model_stream_infer_raw_stub_ends_when_the_client_half_closes(stub, reference):
    def requests():
        for i in range(5):
            req = service_pb2.ModelInferRequest(model_name="minilm", id=f"raw-{i}")
            t = req.inputs.add(name="text", datatype="BYTES", shape=[1, 1])
            t.contents.bytes_contents.append(SENTENCES[i % 3].encode())
            yield req
        yield service_pb2.ModelInferRequest(model_name="nope", id="unknown-model")

    # list() returns only once the server has finished the call after our half-close.
    responses = list(stub.ModelStreamInfer(requests(), timeout=120))
    assert len(responses) == 6
    by_id = {r.infer_response.id: r for r in responses}
    assert set(by_id) == {f"raw-{i}" for i in range(5)} | {"unknown-model"}
    assert "unknown model 'nope'" in by_id["unknown-model"].error_message
    for i in range(5):
        r = by_id[f"raw-{i}"]
        assert r.error_message == ""
        assert r.infer_response.model_name == "minilm" and r.infer_response.model_version == "1"
        emb = np.frombuffer(r.infer_response.raw_output_contents[0], dtype="<f4")
        np.testing.assert_allclose(emb, reference[i % 3], atol=2e-6)
    # An empty stream is fine too.
    assert list(stub.ModelStreamInfer(iter([]), timeout=30)) == []
