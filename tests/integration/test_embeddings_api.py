"""OpenAI POST /v1/embeddings against a real `stoke serve --model all-minilm-l6-v2` (an HF folder: classic mode with
the default batcher), driven by the `openai` client; results equal `stoke embed`'s."""
import base64
import concurrent.futures
import time

import numpy as np
import pytest
import requests

from classic_server import ClassicServer, stoke_embed

openai = pytest.importorskip("openai")

TEXTS = ["A man is eating food.", "A man is riding a horse.", "Das Wetter ist schön.", "embeddings for search"]


@pytest.fixture(scope="module")
def server(stoke_bin, minilm_path, tmp_path_factory):
    s = ClassicServer(stoke_bin, minilm_path, "--threads", "2", log_dir=tmp_path_factory.mktemp("embeddings"))
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(stoke_bin, minilm_path):
    return np.array(stoke_embed(stoke_bin, minilm_path, TEXTS), dtype=np.float32)


def test_models_and_health(server, client):
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == "all-minilm-l6-v2" and "all-minilm-l6-v2-ids" in ids
    assert server.get("/health/ready").status_code == 200
    assert server.get("/health/live").status_code == 200


def test_list_of_strings_float(client, reference):
    r = client.embeddings.create(model="all-minilm-l6-v2", input=TEXTS, encoding_format="float")
    assert r.object == "list" and r.model == "all-minilm-l6-v2"
    assert [d.index for d in r.data] == list(range(len(TEXTS)))
    emb = np.array([d.embedding for d in r.data], dtype=np.float32)
    np.testing.assert_allclose(emb, reference, rtol=0, atol=2e-6)
    assert r.usage.prompt_tokens == r.usage.total_tokens > len(TEXTS) * 2


def test_single_string_base64(client, reference, server):
    # The openai client asks for base64 by default and decodes it; check the raw form too.
    r = client.embeddings.create(model="all-minilm-l6-v2", input=TEXTS[2])
    np.testing.assert_allclose(np.array(r.data[0].embedding, dtype=np.float32), reference[2], atol=2e-6)
    raw = server.post("/v1/embeddings", json={"input": TEXTS[2], "encoding_format": "base64"}).json()
    emb = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(emb, reference[2], atol=2e-6)


def test_token_id_inputs(client, reference, minilm_path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    tok.no_padding()  # MiniLM's tokenizer.json pads to 128 by default
    ids = [tok.encode(t).ids for t in TEXTS[:2]]
    r = client.embeddings.create(model="all-minilm-l6-v2", input=ids, encoding_format="float")
    np.testing.assert_allclose(np.array([d.embedding for d in r.data], dtype=np.float32), reference[:2], atol=2e-6)
    assert r.usage.prompt_tokens == sum(len(i) for i in ids)
    one = client.embeddings.create(model="all-minilm-l6-v2", input=ids[0], encoding_format="float")
    np.testing.assert_allclose(np.array(one.data[0].embedding, dtype=np.float32), reference[0], atol=2e-6)


def test_more_inputs_than_max_batch_size_keep_their_order(client, reference):
    texts = [TEXTS[i % 4] for i in range(70)]  # default max_batch_size 32: three requests
    r = client.embeddings.create(model="all-minilm-l6-v2", input=texts, encoding_format="float")
    emb = np.array([d.embedding for d in r.data], dtype=np.float32)
    np.testing.assert_allclose(emb, reference[[i % 4 for i in range(70)]], atol=2e-6)


def test_concurrent_clients(client, reference):
    def one(i):
        r = client.embeddings.create(model="all-minilm-l6-v2", input=TEXTS[i % 4], encoding_format="float")
        return i, np.array(r.data[0].embedding, dtype=np.float32)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for i, emb in pool.map(one, range(24)):
            np.testing.assert_allclose(emb, reference[i % 4], atol=2e-6)


@pytest.mark.parametrize("body,param,message", [
    ({"input": []}, "input", "must not be an empty list"),
    ({}, "input", "'input' is required"),
    ({"input": {"text": "x"}}, "input", "must be a string"),
    ({"input": ["a", 3]}, "input", "input[1] must be a string"),
    ({"input": [[101, -4]]}, "input", "input[0][1] must be a token id"),
    ({"input": [[101, 99999999]]}, "input", "token id 99999999 is outside"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "must be \"float\" or \"base64\""),
    ({"input": "x", "dimensions": 128}, "dimensions", "must be 384"),
])
def test_bad_requests_are_openai_400s(server, body, param, message):
    r = server.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert message in err["message"] and err["param"] == param and err["type"] == "invalid_request_error"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="x")


def test_embeddings_share_the_batcher(server):
    before = server.metric("stoke:inference_request_success_total", model_name="all-minilm-l6-v2")
    server.post("/v1/embeddings", json={"input": ["x", "y"]})
    assert server.metric("stoke:inference_request_success_total", model_name="all-minilm-l6-v2") == before + 1


STAGES = ("recv", "queue", "preprocess", "h2d", "compute", "d2h", "postprocess", "send")


def test_embeddings_record_the_request_ledger(server):
    def counts():
        return {s: server.metric("stoke:request_stage_seconds_count", model_name="all-minilm-l6-v2", stage=s)
                for s in STAGES}

    before = counts()
    compute_before = server.metric("stoke:request_stage_seconds_sum", model_name="all-minilm-l6-v2", stage="compute")
    # A kept-alive session: a client that closes the moment it has the bytes can make the server see the close
    # before its write completes, and an abandoned response records no ledger. 40 inputs > max_batch_size 32:
    # two chunks, still one request in the ledger.
    with requests.Session() as s:
        r = s.post(server.base_url + "/v1/embeddings", json={"input": TEXTS * 10}, timeout=120)
        assert r.status_code == 200 and len(r.json()["data"]) == 40
        # Recorded once the last byte is written, which may be just after the client has it.
        deadline = time.time() + 5
        while counts()["send"] < before["send"] + 1 and time.time() < deadline:
            time.sleep(0.02)
    after = counts()
    for stage in STAGES:
        assert after[stage] == before[stage] + 1, (stage, before, after)
    assert server.metric("stoke:request_stage_seconds_sum", model_name="all-minilm-l6-v2",
                         stage="compute") > compute_before
