"""One `stoke serve` process holding a decoder (SmolLM2) and an encoder (all-MiniLM-L6-v2) side by side: chat over
the `openai` client while embeddings go over `openai`, tritonclient HTTP and tritonclient gRPC at the same time;
the encoder unloaded and loaded again through KServe's repository API while chat requests keep running (none
fails); the repository index and /v1/models list both; a --model-repository folder with stoke.toml files serves
the same."""
import concurrent.futures
import threading
import time

import numpy as np
import pytest

from classic_server import ClassicServer, stoke_embed

openai = pytest.importorskip("openai")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")

TEXTS = ["A man is eating food.", "The weather is lovely today.", "Two models, one process."]
CHAT = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def reference(stoke_bin, minilm_path):
    return np.array(stoke_embed(stoke_bin, minilm_path, TEXTS), dtype=np.float32)


@pytest.fixture(scope="module")
def server(stoke_bin, smollm2_path, minilm_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("multi_model")
    s = ClassicServer(stoke_bin, None, "--model", f"chat={smollm2_path}", "--model", f"minilm={minilm_path}",
                      "--threads", "2", "--drain-seconds", "30", log_dir=d)
    yield s
    assert s.stop() == 0, s.log()


def oai(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


def text_input(module, texts):
    arr = np.array([[t.encode()] for t in texts], dtype=np.object_)
    inp = module.InferInput("text", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr)
    return inp


def embed_openai(server):
    r = oai(server).embeddings.create(model="minilm", input=TEXTS)
    return np.array([d.embedding for d in r.data], dtype=np.float32)


def embed_http(server):
    c = httpclient.InferenceServerClient(url=server.http_url)
    return c.infer("minilm", [text_input(httpclient, TEXTS)]).as_numpy("embedding")


def embed_grpc(server):
    c = grpcclient.InferenceServerClient(url=server.grpc_url)
    return c.infer("minilm", [text_input(grpcclient, TEXTS)]).as_numpy("embedding")


def chat(server, stream=False):
    c = oai(server)
    if stream:
        text = ""
        for chunk in c.chat.completions.create(model="chat", messages=CHAT, max_tokens=8, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        return text
    r = c.chat.completions.create(model="chat", messages=CHAT, max_tokens=8)
    assert r.model == "chat" and r.choices[0].finish_reason in ("stop", "length")
    return r.choices[0].message.content


def index(server):
    return {m["name"]: m for m in server.post("/v2/repository/index").json()}


def test_models_and_index_list_both(server):
    ids = [m["id"] for m in server.get("/v1/models").json()["data"]]
    assert ids == ["chat", "minilm", "minilm-ids"]
    idx = index(server)
    assert set(idx) == {"chat", "minilm", "minilm-ids"}
    assert all(m["state"] == "READY" and m["version"] == "1" for m in idx.values()), idx
    g = grpcclient.InferenceServerClient(url=server.grpc_url)
    assert {m.name for m in g.get_model_repository_index().models} == {"chat", "minilm", "minilm-ids"}
    assert server.get("/health/ready").status_code == 200
    assert server.get("/v2/models/minilm/ready").status_code == 200


def test_each_route_finds_its_model(server):
    r = server.post("/v1/chat/completions", json={"model": "minilm", "messages": CHAT})
    assert r.status_code == 400 and "encoder" in r.json()["error"]["message"], r.text
    r = server.post("/v1/embeddings", json={"model": "chat", "input": "x"})
    assert r.status_code == 400 and "decoder" in r.json()["error"]["message"], r.text
    r = server.post("/v1/completions", json={"model": "gpt-4o", "prompt": "x"})
    assert r.status_code == 404, r.text
    assert "`chat`, `minilm`" in r.json()["error"]["message"]
    # The decoder is not a KServe model.
    assert server.post("/v2/models/chat/infer", json={"inputs": []}).status_code == 404


def test_chat_and_embeddings_over_three_protocols_at_once(server, reference):
    jobs = [chat, lambda s: chat(s, stream=True), embed_openai, embed_http, embed_grpc] * 3
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(lambda f: f(server), jobs))
    for f, res in zip(jobs, results):
        if isinstance(res, str):
            assert res, "an empty chat completion"
        else:
            np.testing.assert_allclose(res, reference, rtol=0, atol=2e-6)
    # One /metrics for both, each model's series under its own label.
    m = server.metrics()
    names = {dict(labels).get("model_name") for (_, labels) in m}
    assert {"chat", "minilm"} <= names


def test_unload_and_load_encoder_while_chat_runs(server, reference):
    stop = threading.Event()
    done, failures = [], []

    def chat_loop(stream):
        while not stop.is_set():
            try:
                done.append(chat(server, stream))
            except Exception as e:  # noqa: BLE001 - every failure is the test's business
                failures.append(repr(e))

    threads = [threading.Thread(target=chat_loop, args=(s,)) for s in (False, True)]
    for t in threads:
        t.start()
    try:
        while len(done) < 2 and not failures:
            time.sleep(0.05)
        r = server.post("/v2/repository/models/minilm/unload")
        assert r.status_code == 200, r.text
        idx = index(server)
        assert idx["minilm"]["state"] == "UNAVAILABLE" and idx["minilm-ids"]["state"] == "UNAVAILABLE"
        assert idx["chat"]["state"] == "READY"
        assert server.get("/v2/models/minilm/ready").status_code == 400
        assert server.get("/health/ready").status_code == 200  # nothing that should be loaded is missing
        r = server.post("/v1/embeddings", json={"model": "minilm", "input": "x"})
        assert r.status_code == 503, r.text
        with pytest.raises(Exception):
            embed_http(server)
        with pytest.raises(Exception):
            embed_grpc(server)
        before = len(done)
        while len(done) < before + 2 and not failures:  # chat carries on while the encoder is away
            time.sleep(0.05)
        r = server.post("/v2/repository/models/minilm/load")
        assert r.status_code == 200, r.text
        assert index(server)["minilm"]["state"] == "READY"
        np.testing.assert_allclose(embed_openai(server), reference, rtol=0, atol=2e-6)
        np.testing.assert_allclose(embed_grpc(server), reference, rtol=0, atol=2e-6)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
    assert not failures, failures
    assert len(done) >= 4 and all(done)


def test_repository_api_errors(server):
    assert server.post("/v2/repository/models/nope/load").status_code == 404
    # Loading what is loaded is fine and changes nothing.
    assert server.post("/v2/repository/models/chat/load").status_code == 200
    assert index(server)["chat"]["state"] == "READY"


def test_model_repository_folder(stoke_bin, smollm2_path, minilm_path, tmp_path, reference):
    repo = tmp_path / "models"
    (repo / "chat").mkdir(parents=True)
    (repo / "chat" / "stoke.toml").write_text(f'source = "{smollm2_path}"\nkind = "decoder"\n')
    (repo / "minilm").mkdir()
    (repo / "minilm" / "stoke.toml").write_text(
        f'source = "{minilm_path}"\nmax_batch_size = 8\ninstances = 2\nmax-queue-delay-us = 1000\n')
    (repo / "spare").mkdir()
    (repo / "spare" / "stoke.toml").write_text(f'source = "{minilm_path}"\nload = false\n')
    s = ClassicServer(stoke_bin, None, "--model-repository", repo, "--threads", "2", log_dir=tmp_path)
    try:
        assert [m["id"] for m in s.get("/v1/models").json()["data"]] == [
            "chat", "minilm", "minilm-ids", "spare", "spare-ids"]
        idx = index(s)
        assert idx["chat"]["state"] == "READY" and idx["minilm"]["state"] == "READY"
        assert idx["spare"]["state"] == "UNAVAILABLE"
        cfg = httpclient.InferenceServerClient(url=s.http_url).get_model_config("minilm")
        assert cfg["max_batch_size"] == 8 and cfg["instance_group"][0]["count"] == 2
        assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
        assert chat(s)
        np.testing.assert_allclose(embed_http(s), reference, rtol=0, atol=2e-6)
        # The one not loaded at start: 503 until loaded through the API.
        assert s.post("/v1/embeddings", json={"model": "spare", "input": "x"}).status_code == 503
        assert s.post("/v2/repository/models/spare/load").status_code == 200
        r = s.post("/v1/embeddings", json={"model": "spare", "input": TEXTS})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, reference, rtol=0, atol=2e-6)
        # The same over gRPC (RepositoryModelUnload / RepositoryModelLoad).
        g = grpcclient.InferenceServerClient(url=s.grpc_url)
        g.unload_model("spare")
        assert index(s)["spare"]["state"] == "UNAVAILABLE" and not g.is_model_ready("spare")
        g.load_model("spare")
        assert g.is_model_ready("spare") and index(s)["spare"]["state"] == "READY"
        assert chat(s)  # the decoder never noticed
    finally:
        assert s.stop() == 0, s.log()


def test_bad_repository_folder_is_a_clear_error(stoke_bin, tmp_path):
    import subprocess

    repo = tmp_path / "models"
    (repo / "x").mkdir(parents=True)
    (repo / "x" / "stoke.toml").write_text('source = "all-minilm-l6-v2"\nbatch = 3\n')
    p = subprocess.run([str(stoke_bin), "serve", "--model-repository", str(repo), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "unknown key 'batch'" in p.stderr and "stoke.toml" in p.stderr, p.stderr
