"""The per-request time ledger (issue 12 §1) against real `stoke serve` processes, driven by real clients: the
`openai` Python client (chat and completions, streaming and not, embeddings) and `tritonclient` (HTTP and gRPC).

What is asserted (never a wall-clock bound; CI runs on 2 shared cores):
  - the ledger is in the response only when asked for (X-Stoke-Ledger: 1 / gRPC metadata x-stoke-ledger: 1);
  - its stage names are the vocabulary (telemetry/ledger.h) and they sum to the server's e2e within rounding;
  - the sum is at most the latency the client measured, and for generation requests long enough that the
    client's own overhead is small, at least 98 % of it for >= 99 % of the requests;
  - GET /v1/debug/requests returns the requests with their ledgers; its filters work.
"""
import json
import time

import numpy as np
import pytest
import requests

from classic_server import ClassicServer, write_model_file

openai = pytest.importorskip("openai")

GENERATION_STAGES = ["recv", "queue", "preprocess", "prefill", "decode", "schedule", "interleave", "postprocess",
                     "send", "other"]
CLASSIC_STAGES = ["recv", "queue", "preprocess", "h2d", "compute", "d2h", "postprocess", "send", "other"]
LEDGER = {"X-Stoke-Ledger": "1"}
# Each stage is printed to 3 decimals of a millisecond: the sum may differ from e2e by half a unit per stage.
ROUNDING_MS = 0.0005 * 14
# Generation requests this long take hundreds of ms on a CPU (more on a loaded one: the server slows with the
# client), against a few ms of client overhead.
LONG_TOKENS = 128
CLIENT_LAG_MS = 50


def check_ledger(ledger, stages):
    assert list(ledger["stages_ms"]) == stages
    assert all(v >= -ROUNDING_MS for k, v in ledger["stages_ms"].items() if k != "other"), ledger
    assert abs(sum(ledger["stages_ms"].values()) - ledger["e2e_ms"]) <= ROUNDING_MS, ledger
    return ledger


def header_ledger(value):
    """'recv=0.012;...;e2e=5.000' -> ({stage: ms}, e2e_ms)."""
    parts = dict(p.split("=") for p in value.split(";"))
    e2e = float(parts.pop("e2e"))
    return {k: float(v) for k, v in parts.items()}, e2e


def long_request():
    return dict(max_tokens=LONG_TOKENS, temperature=0, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def llm(start_server):
    return start_server("--debug-requests", "500")


@pytest.fixture(scope="module")
def client(llm):
    return openai.OpenAI(base_url=llm.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(llm):
    return llm.model_name()


def chat(client, model, content, **kw):
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": content}], **kw)


def test_chat_ledger_only_when_asked(client, model):
    plain = chat(client, model, "Say hi", max_tokens=4, temperature=0)
    assert "x-stoke-ledger" not in plain.headers
    assert "ledger" not in json.loads(plain.text)

    raw = chat(client, model, "Say hi", max_tokens=4, temperature=0, extra_headers=LEDGER)
    body = json.loads(raw.text)
    ledger = check_ledger(body["ledger"], GENERATION_STAGES)
    stages, e2e = header_ledger(raw.headers["x-stoke-ledger"])
    assert stages == ledger["stages_ms"] and e2e == ledger["e2e_ms"]
    # The rest of the body is what it is without the header.
    assert set(body) - {"ledger"} == set(json.loads(plain.text))
    assert raw.parse().choices[0].message.content is not None
    assert ledger["stages_ms"]["prefill"] > 0 and ledger["stages_ms"]["decode"] > 0


def test_completions_ledger(client, model):
    raw = client.completions.with_raw_response.create(model=model, prompt="Once upon a time", max_tokens=8,
                                                      temperature=0, extra_headers=LEDGER)
    check_ledger(json.loads(raw.text)["ledger"], GENERATION_STAGES)
    assert "x-stoke-ledger" in raw.headers


def test_streaming_ledger_in_the_last_chunk(client, model):
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count"}],
                                                 max_tokens=6, temperature=0, stream=True))
    assert all("ledger" not in (c.model_extra or {}) for c in chunks)

    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count"}],
                                                 max_tokens=6, temperature=0, stream=True, extra_headers=LEDGER,
                                                 stream_options={"include_usage": True}))
    with_ledger = [c for c in chunks if "ledger" in (c.model_extra or {})]
    assert len(with_ledger) == 1 and with_ledger[0] is chunks[-1]
    assert chunks[-1].usage is not None
    check_ledger(chunks[-1].model_extra["ledger"], GENERATION_STAGES)


def test_streaming_ledger_trailer(llm, model):
    body = {"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": True}
    r = requests.post(llm.base_url + "/v1/completions", json=body, headers=LEDGER, stream=True, timeout=120)
    assert r.headers.get("Trailer") == "X-Stoke-Ledger"
    events = [line for line in r.iter_lines() if line]
    assert events[-1] == b"data: [DONE]"
    last = json.loads(events[-2][len(b"data: "):])
    check_ledger(last["ledger"], GENERATION_STAGES)


def client_vs_server(client, model, n, stream):
    """(client-measured seconds, server ledger) for n long generation requests."""
    out = []
    # Warm-up, untimed: the client's first parse of each response type builds its models (tens of ms).
    chat(client, model, "warm up", max_tokens=2, temperature=0, extra_headers=LEDGER)
    list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "warm up"}],
                                        max_tokens=2, stream=True, extra_headers=LEDGER))
    for i in range(n):
        messages = [{"role": "user", "content": f"Write a long story about the number {i}."}]
        t0 = time.perf_counter()
        if stream:
            ledger = None
            for c in client.chat.completions.create(model=model, messages=messages, stream=True,
                                                    extra_headers=LEDGER, **long_request()):
                ledger = (c.model_extra or {}).get("ledger", ledger)
            t1 = time.perf_counter()
        else:
            raw = chat(client, model, messages[0]["content"], extra_headers=LEDGER, **long_request())
            text = raw.text
            t1 = time.perf_counter()
            body = json.loads(text)
            assert body["usage"]["completion_tokens"] == LONG_TOKENS
            ledger = body["ledger"]
        out.append(((t1 - t0) * 1e3, check_ledger(ledger, GENERATION_STAGES)))
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_ledger_accounts_for_the_client_latency(client, model, stream):
    results = client_vs_server(client, model, 12, stream)
    for client_ms, ledger in results:
        total = sum(ledger["stages_ms"].values())
        assert total <= client_ms + ROUNDING_MS, (client_ms, ledger)
    # Within 2 % of what the client measured, plus CLIENT_LAG_MS: on CI's 2 shared cores the Python client can
    # be descheduled and read (and parse) the last chunks tens of ms after the server wrote them, time no server
    # ledger can see (seen once in ~5 runs at load 11-12 for SSE). On an idle machine all are within 2 %.
    close = [total for client_ms, ledger in results
             if (total := sum(ledger["stages_ms"].values())) >= 0.98 * client_ms - CLIENT_LAG_MS]
    # >= 99 % of the requests (all of them at this count).
    assert len(close) >= 0.99 * len(results), [(c, l["e2e_ms"]) for c, l in results]
    for _, ledger in results:
        s = ledger["stages_ms"]
        assert s["decode"] > 0 and s["schedule"] > 0 and s["postprocess"] > 0
        assert abs(s["other"]) < 0.01 * ledger["e2e_ms"] + 1, ledger


def test_debug_requests(llm, client, model):
    ids = []
    for i in range(3):
        raw = chat(client, model, f"Hello {i}", max_tokens=3 + i, temperature=0)
        ids.append(json.loads(raw.text)["id"])
    r = llm.get("/v1/debug/requests")
    assert r.status_code == 200
    log = r.json()
    assert log["capacity"] == 500 and log["recorded"] >= 3
    by_id = {e["id"]: e for e in log["requests"]}
    assert [e["id"] for e in log["requests"][:3]] == ids[::-1]  # newest first
    for i, rid in enumerate(ids):
        e = by_id[rid]
        assert e["model"] == model and e["api"] == "chat" and e["status"] == 200
        assert e["tokens_out"] == 3 + i and e["tokens_in"] > 0
        assert e["finish_reason"] == "length"
        assert e["ttft_ms"] > 0 and e["tpot_ms"] > 0
        assert e["start_unix_ms"] > 1.6e12
        assert list(e["stages_ms"]) == GENERATION_STAGES
        assert abs(sum(e["stages_ms"].values()) - e["e2e_ms"]) <= ROUNDING_MS

    slowest = llm.get("/v1/debug/requests", params={"slowest": 4}).json()["requests"]
    assert len(slowest) == min(4, len(log["requests"]))
    e2e = [e["e2e_ms"] for e in slowest]
    assert e2e == sorted(e2e, reverse=True)
    assert e2e[0] == max(e["e2e_ms"] for e in log["requests"])
    assert len(llm.get("/v1/debug/requests", params={"limit": 2}).json()["requests"]) == 2
    assert llm.get("/v1/debug/requests", params={"model": "nope"}).json()["requests"] == []
    assert len(llm.get("/v1/debug/requests", params={"model": model}).json()["requests"]) == len(log["requests"])
    assert llm.get("/v1/debug/requests", params={"slowest": "x"}).status_code == 400


def test_metrics_have_the_new_stages(llm, client, model):
    chat(client, model, "Hi", max_tokens=3, temperature=0)
    for stage in GENERATION_STAGES + ["compute"]:
        assert llm.metric("stoke:request_stage_seconds_count", stage=stage) >= 1, stage


def test_debug_requests_off(start_server):
    s = start_server("--debug-requests", "0")
    assert s.get("/v1/debug/requests").status_code == 404


def test_no_ledger_records_nothing_but_answers_when_asked(start_server):
    """--no-ledger (what bench/ledger_overhead.py compares against): finished requests' ledgers go nowhere."""
    s = start_server("--no-ledger")
    c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    model = s.model_name()
    chat(c, model, "Hi", max_tokens=3, temperature=0)
    raw = chat(c, model, "Hi", max_tokens=3, temperature=0, extra_headers=LEDGER)
    check_ledger(json.loads(raw.text)["ledger"], GENERATION_STAGES)  # asked for: still answered
    assert s.metric("stoke:e2e_request_latency_seconds_count") == 2  # the request metrics stay
    assert s.metric("stoke:request_stage_seconds_count") == 0
    assert s.get("/v1/debug/requests").json()["requests"] == []


def test_no_ledger_classic(stoke_bin, tmp_path):
    model = write_model_file(tmp_path, type="synthetic", name="syn", input_bytes=16, output_bytes=16,
                             max_batch_size=4, instance_group=[{"count": 1}])
    s = ClassicServer(stoke_bin, model, "--no-ledger", "--no-gpu-telemetry", log_dir=tmp_path)
    try:
        body = {"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [1, 16], "data": [0] * 16}]}
        for _ in range(3):
            r = s.post("/v2/models/syn/infer", json=body)
            assert r.status_code == 200, r.text
        assert s.metric("stoke:inference_count_total") == 3
        assert s.metric("stoke:request_stage_seconds_count") == 0
        assert s.get("/v1/debug/requests").json()["requests"] == []
    finally:
        assert s.stop() == 0, s.log()


# --- the classic path: /v1/embeddings, KServe REST and gRPC -------------------------------------------------


@pytest.fixture(scope="module")
def classic(stoke_bin, minilm_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("ledger_classic")
    model = write_model_file(d, type="bert", model=str(minilm_path), name="minilm", max_batch_size=4,
                             dynamic_batching={"max_queue_delay_microseconds": 500}, instance_group=[{"count": 1}])
    s = ClassicServer(stoke_bin, model, "--threads", "2", log_dir=d)
    yield s
    assert s.stop() == 0, s.log()


def test_embeddings_ledger(classic):
    client = openai.OpenAI(base_url=classic.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    plain = client.embeddings.with_raw_response.create(model="minilm", input=["a sentence", "another"])
    assert "x-stoke-ledger" not in plain.headers and "ledger" not in json.loads(plain.text)
    t0 = time.perf_counter()
    raw = client.embeddings.with_raw_response.create(model="minilm", input=["a sentence", "another"],
                                                     extra_headers=LEDGER)
    text = raw.text
    client_ms = (time.perf_counter() - t0) * 1e3
    ledger = check_ledger(json.loads(text)["ledger"], CLASSIC_STAGES)
    assert ledger["e2e_ms"] <= client_ms
    assert ledger["stages_ms"]["compute"] > 0
    assert header_ledger(raw.headers["x-stoke-ledger"]) == (ledger["stages_ms"], ledger["e2e_ms"])
    assert len(raw.parse().data) == 2


def text_input(module, texts, binary=True):
    arr = np.array([[t.encode()] for t in texts], dtype=np.object_)
    inp = module.InferInput("text", list(arr.shape), "BYTES")
    if module.__name__.endswith("http"):
        inp.set_data_from_numpy(arr, binary_data=binary)
    else:
        inp.set_data_from_numpy(arr)
    return inp


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_kserve_http_ledger(classic, binary):
    httpclient = pytest.importorskip("tritonclient.http")
    client = httpclient.InferenceServerClient(url=classic.http_url)
    outputs = [httpclient.InferRequestedOutput("embedding", binary_data=binary)]
    plain = client.infer("minilm", [text_input(httpclient, ["hello world"], binary)], outputs=outputs)
    assert "ledger" not in plain.get_response()
    t0 = time.perf_counter()
    # A fresh dict: tritonclient writes Inference-Header-Content-Length into the one it is given.
    res = client.infer("minilm", [text_input(httpclient, ["hello world"], binary)], outputs=outputs,
                       headers=dict(LEDGER))
    client_ms = (time.perf_counter() - t0) * 1e3
    ledger = check_ledger(res.get_response()["ledger"], CLASSIC_STAGES)
    assert ledger["e2e_ms"] <= client_ms
    np.testing.assert_allclose(res.as_numpy("embedding"), plain.as_numpy("embedding"), rtol=1e-5, atol=1e-6)


def test_kserve_grpc_ledger(classic):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    grpc = pytest.importorskip("grpc")
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    client = grpcclient.InferenceServerClient(url=classic.grpc_url)
    plain = client.infer("minilm", [text_input(grpcclient, ["hello grpc"])])
    assert "ledger" not in plain.get_response().parameters
    t0 = time.perf_counter()
    res = client.infer("minilm", [text_input(grpcclient, ["hello grpc"])], headers={"x-stoke-ledger": "1"})
    client_ms = (time.perf_counter() - t0) * 1e3
    ledger = check_ledger(json.loads(res.get_response().parameters["ledger"].string_param), CLASSIC_STAGES)
    assert ledger["e2e_ms"] <= client_ms

    # The same ledger rides in the trailing metadata (the header form).
    channel = grpc.insecure_channel(classic.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    req = service_pb2.ModelInferRequest(model_name="minilm", id="g1")
    t = req.inputs.add(name="text", datatype="BYTES", shape=[1, 1])
    t.contents.bytes_contents.append(b"hello stub")
    _, call = stub.ModelInfer.with_call(req, metadata=[("x-stoke-ledger", "1")])
    trailing = dict(call.trailing_metadata())
    stages, e2e = header_ledger(trailing["x-stoke-ledger"])
    assert list(stages) == CLASSIC_STAGES
    assert abs(sum(stages.values()) - e2e) <= ROUNDING_MS
    _, call = stub.ModelInfer.with_call(req)
    assert "x-stoke-ledger" not in dict(call.trailing_metadata())

    # ModelStreamInfer: each response carries its own ledger when the call asked for it.
    for metadata, expect in [([("x-stoke-ledger", "1")], True), ([], False)]:
        responses = list(stub.ModelStreamInfer(iter([req, req]), metadata=metadata))
        assert len(responses) == 2
        for r in responses:
            assert not r.error_message
            assert ("ledger" in r.infer_response.parameters) == expect
            if expect:
                check_ledger(json.loads(r.infer_response.parameters["ledger"].string_param), CLASSIC_STAGES)
    channel.close()


def test_classic_debug_requests(classic):
    grpc = pytest.importorskip("grpc")
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["over rest"]}]}
    assert classic.post("/v2/models/minilm/infer", json=body).status_code == 200
    with grpc.insecure_channel(classic.grpc_url) as channel:
        req = service_pb2.ModelInferRequest(model_name="minilm", id="g1")
        t = req.inputs.add(name="text", datatype="BYTES", shape=[1, 1])
        t.contents.bytes_contents.append(b"over grpc")
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(req)
    client = openai.OpenAI(base_url=classic.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    client.embeddings.create(model="minilm", input="one more")
    requests_ = classic.get("/v1/debug/requests").json()["requests"]
    apis = {e["api"] for e in requests_}
    assert {"embeddings", "kserve_http", "kserve_grpc"} <= apis, apis
    for e in requests_:
        assert e["model"] == "minilm" and e["status"] == 200
        assert list(e["stages_ms"]) == CLASSIC_STAGES
        assert abs(sum(e["stages_ms"].values()) - e["e2e_ms"]) <= ROUNDING_MS
        assert "ttft_ms" not in e
    assert requests_[0]["api"] == "embeddings" and requests_[0]["tokens_in"] > 0
    grpc_ids = [e["id"] for e in requests_ if e["api"] == "kserve_grpc"]
    assert "g1" in grpc_ids
    slowest = classic.get("/v1/debug/requests", params={"slowest": 2, "model": "minilm"}).json()["requests"]
    assert len(slowest) == 2 and slowest[0]["e2e_ms"] >= slowest[1]["e2e_ms"]
    assert classic.get("/v1/debug/requests", params={"model": "minilm-ids"}).json()["requests"] == []
    assert classic.metric("stoke:request_stage_seconds_count", model_name="minilm", stage="other") >= 1
