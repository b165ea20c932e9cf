"""--api-key / --api-key-file for every model kind (a decoder, a synthetic model, and a decoder beside an encoder in
one process): every route but /health* (and /metrics unless --metrics-require-key) needs
'Authorization: Bearer KEY' (401 JSON otherwise); KServe gRPC needs the metadata 'authorization: Bearer KEY'
(UNAUTHENTICATED otherwise). Checked with the `openai` client and tritonclient. The two-model server also holds
the other limits of the one lifecycle: --max-connections, --max-header-bytes, and the gRPC message cap."""
import time

import numpy as np
import openai
import pytest
import requests

from classic_server import ClassicServer, write_model_file
from hostile import Reader, connect, exchange, is_json_error

KEY = "sk-test-0123456789abcdef"


def test_decoder_with_api_key(start_server):
    srv = start_server("--api-key", KEY)
    url = srv.base_url
    # Open routes.
    assert requests.get(url + "/health/live", timeout=30).status_code == 200
    assert requests.get(url + "/health/ready", timeout=30).status_code == 200
    assert requests.get(url + "/metrics", timeout=30).status_code == 200
    # Everything else needs the key.
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                         ("GET", "/v1/debug/requests"), ("GET", "/v1/gpu"), ("GET", "/no/such/route")):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                        {"Authorization": "Bearer " + KEY[:-1]}, {"Authorization": "Basic " + KEY}):
            r = requests.request(method, url + path, json={}, headers=headers, timeout=30)
            assert r.status_code == 401, (path, headers, r.text)
            assert r.headers["WWW-Authenticate"] == "Bearer"
            err = r.json()["error"]
            assert "API key" in err["message"] and err["code"] == "invalid_api_key"
    # The openai client: a wrong key is an AuthenticationError, the right one works.
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0, timeout=120)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    name = good.models.list().data[0].id
    r = good.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                     extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3


def test_decoder_key_file_and_metrics_require_key(start_server, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    srv = start_server("--api-key-file", key_file, "--metrics-require-key")
    assert requests.get(srv.base_url + "/health/live", timeout=30).status_code == 200
    assert requests.get(srv.base_url + "/metrics", timeout=30).status_code == 401
    r = requests.get(srv.base_url + "/metrics", headers={"Authorization": "Bearer " + KEY}, timeout=30)
    assert r.status_code == 200 and "stoke:" in r.text
    # The key never reaches the log.
    assert KEY not in srv.log()


def test_both_key_flags_is_a_usage_error(stoke_bin, smollm2_path, tmp_path):
    import subprocess
    (tmp_path / "k").write_text("x")
    p = subprocess.run([str(stoke_bin), "serve", "--model", str(smollm2_path), "--api-key", "a", "--api-key-file",
                        str(tmp_path / "k")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "not both" in p.stderr
    (tmp_path / "empty").write_text("\n")
    p = subprocess.run([str(stoke_bin), "serve", "--model", str(smollm2_path), "--api-key-file",
                        str(tmp_path / "empty")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "holds no key" in p.stderr


@pytest.fixture(scope="module")
def classic(stoke_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("access")
    model = write_model_file(d, type="synthetic", name="synth", input_bytes=16, output_bytes=16, max_batch_size=4)
    s = ClassicServer(stoke_bin, model, "--api-key", KEY, log_dir=d)
    yield s
    assert s.stop() == 0, s.log()


def test_kserve_rest_with_api_key(classic):
    httpclient = pytest.importorskip("tritonclient.http")
    from tritonclient.utils import InferenceServerException
    url = classic.base_url
    assert requests.get(url + "/v2/health/live", timeout=30).status_code == 200
    assert requests.get(url + "/v2/health/ready", timeout=30).status_code == 200
    assert requests.get(url + "/metrics", timeout=30).status_code == 200
    r = requests.get(url + "/v2/models/synth", timeout=30)
    assert r.status_code == 401 and "API key" in r.json()["error"]
    data = np.arange(16, dtype=np.uint8).reshape(1, 16)
    inp = httpclient.InferInput("INPUT0", [1, 16], "UINT8")
    inp.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException):
        httpclient.InferenceServerClient(url=classic.http_url).infer("synth", [inp])
    client = httpclient.InferenceServerClient(url=classic.http_url)
    res = client.infer("synth", [inp], headers={"Authorization": "Bearer " + KEY})
    assert res.as_numpy("OUTPUT0").shape == (1, 16)
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("synth", headers={"Authorization": "Bearer nope"})


def test_kserve_grpc_with_api_key(classic):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException
    client = grpcclient.InferenceServerClient(url=classic.grpc_url)
    assert client.is_server_live() and client.is_server_ready()  # health: open
    data = np.arange(16, dtype=np.uint8).reshape(1, 16)
    inp = grpcclient.InferInput("INPUT0", [1, 16], "UINT8")
    inp.set_data_from_numpy(data)
    for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": KEY}):
        with pytest.raises(InferenceServerException) as e:
            client.infer("synth", [inp], headers=headers)
        assert e.value.status() == "StatusCode.UNAUTHENTICATED", e.value
        assert "API key" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("synth")
    assert e.value.status() == "StatusCode.UNAUTHENTICATED"
    ok = {"authorization": "Bearer " + KEY}
    assert client.get_model_metadata("synth", headers=ok).name == "synth"
    assert client.infer("synth", [inp], headers=ok).as_numpy("OUTPUT0").shape == (1, 16)
    # The bidirectional stream too.
    import queue
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("synth", [inp])
    except InferenceServerException:
        pass  # the server may have ended the stream already
    result, error = results.get(timeout=60)
    client.stop_stream()
    assert result is None and error.status() == "StatusCode.UNAUTHENTICATED", error
    client.start_stream(callback=lambda result, error: results.put((result, error)), headers=ok)
    client.async_stream_infer("synth", [inp])
    result, error = results.get(timeout=60)
    client.stop_stream()
    assert error is None and result.as_numpy("OUTPUT0").shape == (1, 16)


def held_connection(port, polls=600):
    """A connection the server keeps (it answered /health/live 200 on it); retried while a 503 says the cap is
    still full of connections the server has not yet seen close."""
    for _ in range(polls):
        s = connect(port)
        s.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        r = Reader(s).response()
        if r.status == 200:
            return s
        assert r.status == 503, r.status
        s.close()
        time.sleep(0.05)
    pytest.fail(f"no connection held after {polls} tries")


def test_two_models_one_process_share_the_limits(stoke_bin, smollm2_path, minilm_path, tmp_path):
    """A decoder and an encoder in one process: the key guards both models on every front end (OpenAI, KServe
    REST incl. the repository API, KServe gRPC incl. load/unload), and the connection, header and gRPC message
    limits hold for the process as a whole."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException
    srv = ClassicServer(stoke_bin, None, "--model", f"chat={smollm2_path}", "--model", f"minilm={minilm_path}",
                        "--threads", "1", "--api-key", KEY, "--max-connections", "4", "--max-header-bytes", "8KiB",
                        "--max-body-bytes", "64KiB", log_dir=tmp_path)
    try:
        url, ok = srv.base_url, {"Authorization": "Bearer " + KEY}
        for path in ("/health/live", "/v2/health/ready", "/metrics"):
            assert requests.get(url + path, timeout=30).status_code == 200, path
        chat = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        embed = {"model": "minilm", "input": ["a cat"]}
        infer = {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["a cat"]}]}
        guarded = (("POST", "/v1/chat/completions", chat), ("POST", "/v1/embeddings", embed),
                   ("GET", "/v1/models", None), ("GET", "/v2/models/minilm", None),
                   ("POST", "/v2/models/minilm/infer", infer), ("POST", "/v2/repository/index", None),
                   ("POST", "/v2/repository/models/minilm/unload", None))
        for method, path, body in guarded:
            r = requests.request(method, url + path, json=body, timeout=60)
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", (path, r.text)
            assert "API key" in r.text, path
        # With the key, both models answer.
        for method, path, body in guarded[:5]:
            r = requests.request(method, url + path, json=body, headers=ok, timeout=300)
            assert r.status_code == 200, (path, r.text)
        assert requests.get(url + "/v2/models/minilm/ready", headers=ok, timeout=30).status_code == 200

        # gRPC: the key on inference and on the repository API; the message cap is --max-body-bytes.
        client = grpcclient.InferenceServerClient(url=srv.grpc_url)
        text = np.array([[b"a cat"]], dtype=np.object_)
        inp = grpcclient.InferInput("text", [1, 1], "BYTES")
        inp.set_data_from_numpy(text)
        for call in (lambda: client.infer("minilm", [inp]), lambda: client.unload_model("minilm"),
                     lambda: client.load_model("minilm")):
            with pytest.raises(InferenceServerException) as e:
                call()
            assert e.value.status() == "StatusCode.UNAUTHENTICATED", e.value
        assert client.infer("minilm", [inp], headers={"authorization": "Bearer " + KEY}).as_numpy("embedding") \
            .shape[0] == 1
        big = grpcclient.InferInput("text", [1, 1], "BYTES")
        big.set_data_from_numpy(np.array([[b"x" * (80 << 10)]], dtype=np.object_))
        with pytest.raises(InferenceServerException) as e:
            client.infer("minilm", [big], headers={"authorization": "Bearer " + KEY})
        assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED", e.value

        # Headers past --max-header-bytes: 431, whichever model the request is for.
        r = exchange(srv.port, b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (16 << 10) +
                     b"\r\nContent-Length: 2\r\n\r\n{}")
        assert r.status == 431 and is_json_error(r.body), r.status

        # --max-connections 4: with 4 held, a fifth gets 503 + Retry-After and is closed; room once one goes.
        held = [held_connection(srv.port) for _ in range(4)]
        with connect(srv.port) as s:
            r = Reader(s).response()
            assert r.status == 503 and r.headers.get("retry-after") == "1" and is_json_error(r.body), r.status
        held.pop().close()
        held.append(held_connection(srv.port))
        for s in held:
            s.close()
    finally:
        assert srv.stop() == 0, srv.log()
    assert KEY not in srv.log()
