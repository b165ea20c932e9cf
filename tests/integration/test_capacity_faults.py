"""Capacity faults against real servers, each under concurrent traffic: the KV cache runs out (preemption and
recompute must give every request the very tokens it gets alone), a model that fails to load (the server keeps
serving the others, or exits with a message naming the problem), and requests aimed at a model of the wrong kind or
an unknown one on a server holding a decoder, an encoder and a synthetic model (each route answers with its
protocol's error shape, naming the model). Waits are bounded by a number of polls, never timed."""
import concurrent.futures
import shutil
import subprocess

import numpy as np
import pytest
import requests

from classic_server import ClassicServer, write_model_file
from hostile import GoodTraffic, idle_engine, poll

openai = pytest.importorskip("openai")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402 - after the importorskip

# --- KV cache exhausted ----------------------------------------------------------------------------------------------

KV_BLOCKS, BLOCK = 12, 16  # 192 tokens of KV: room for two of the requests below at full length, not eight
GEN_TOKENS = 64
PROMPTS = [f"Request number {i} says hello to the sea" for i in range(8)]  # ~10 tokens each, all different


@pytest.fixture(scope="module")
def kv_srv(start_server):
    # --ggml-numerics off: stoke's own kernels compute a token's row the same in a prefill as in a decode step, so a
    # sequence recomputed after preemption gets bit-identical logits. (ggml's numerics, the GGUF default, reduce a
    # batch of tokens in llamafile's order and one token in ggml_vec_dot's, as llama.cpp does: there the
    # recompute's logits differ by rounding and a greedy near-tie can flip; docs/reliability.md.)
    return start_server("--kv-blocks", KV_BLOCKS, "--block-size", BLOCK, "--max-num-seqs", 8, "--threads", 1,
                        "--ggml-numerics", "off")


def client(srv):
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


def complete(srv, prompt):
    r = client(srv).completions.create(model=srv.model_name(), prompt=prompt, max_tokens=GEN_TOKENS, temperature=0,
                                       logprobs=1, extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert c.finish_reason == "length" and r.usage.completion_tokens == GEN_TOKENS, r
    return c.text, c.logprobs.tokens, c.logprobs.token_logprobs


def complete_streamed(srv, prompt):
    text, finish = "", None
    for chunk in client(srv).completions.create(model=srv.model_name(), prompt=prompt, max_tokens=GEN_TOKENS,
                                                temperature=0, stream=True, extra_body={"ignore_eos": True}):
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "length", (text, finish)
    return text


def test_kv_exhausted_preempts_and_resumes_with_the_same_tokens(kv_srv):
    alone = [complete(kv_srv, p) for p in PROMPTS]  # one at a time: never short of blocks
    preempted_before = kv_srv.metric("stoke:num_preemptions_total")
    # Eight at once need ~8 x 5 blocks of 12: sequences are preempted (their KV dropped) and recomputed later.
    # Even ones stream: what was sent before a preemption must not be sent again after the resume.
    jobs = [(complete_streamed if i % 2 else complete, p) for i, p in enumerate(PROMPTS)]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        together = list(pool.map(lambda j: j[0](kv_srv, j[1]), jobs))
    assert kv_srv.metric("stoke:num_preemptions_total") > preempted_before, "the KV cache never ran out"
    assert kv_srv.metric("stoke:step_admission_stop_total", reason="no_blocks") > 0
    for i, (ref, got) in enumerate(zip(alone, together)):
        if i % 2:
            assert got == ref[0], (PROMPTS[i], ref[0], got)
        else:  # the same tokens, and the same log-probabilities to the bit
            assert got[1] == ref[1], (PROMPTS[i], ref[1], got[1])
            assert got[2] == ref[2], (PROMPTS[i], ref[2], got[2])
    poll(lambda: idle_engine(kv_srv), "KV blocks back in the pool")
    assert kv_srv.proc.poll() is None


def test_requests_larger_than_the_kv_cache(kv_srv):
    name = kv_srv.model_name()
    # More than the whole cache can ever hold: 400 naming the cache, at once (it would never be scheduled).
    r = kv_srv.post("/v1/completions", json={"model": name, "prompt": "Hi", "max_tokens": KV_BLOCKS * BLOCK})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "exceeds the KV cache (192 tokens)" in err["message"] and err["type"] == "invalid_request_error", err
    # A chat without max_tokens asks for "the rest of the context": with a cache smaller than the context that is
    # the rest of the cache (it was refused as past the cache before). Several at once, each needing all of it.
    def chat(_):
        r = client(kv_srv).chat.completions.create(model=name, messages=[{"role": "user", "content": "Say hi."}],
                                                   temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length"), r
        assert r.usage.prompt_tokens + r.usage.completion_tokens <= KV_BLOCKS * BLOCK, r.usage
        return r.choices[0].message.content

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(chat, range(3)))
    assert answers[0] and answers.count(answers[0]) == 3, answers
    poll(lambda: idle_engine(kv_srv), "KV blocks back in the pool")


# --- A model that fails to load ---------------------------------------------------------------------------------------

TEXTS = ["A man is eating food.", "The weather is lovely today."]


def text_input(module, texts):
    arr = np.array([[t.encode()] for t in texts], dtype=np.object_)
    inp = module.InferInput("text", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr)
    return inp


@pytest.fixture(scope="module")
def broken(smollm2_path, minilm_path, tmp_path_factory):
    """Broken models, each named by what is wrong with it: a GGUF cut at 1 MiB, a safetensors file cut in its data
    (in an HF folder otherwise whole), and a stoke.toml naming a file that is not there."""
    d = tmp_path_factory.mktemp("broken")
    gguf = d / "truncated.gguf"
    with open(smollm2_path, "rb") as f:
        gguf.write_bytes(f.read(1 << 20))
    st = d / "truncated-minilm"
    st.mkdir()
    for f in minilm_path.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, st / f.name)
    data = (minilm_path / "model.safetensors").read_bytes()
    (st / "model.safetensors").write_bytes(data[:len(data) // 2])
    return {"gguf": gguf, "safetensors": st, "missing": d / "nowhere.gguf"}


def repository(root, minilm_path, broken, load_broken):
    """A --model-repository folder: the good encoder `minilm` and the three broken models."""
    root.mkdir()
    (root / "minilm").mkdir()
    (root / "minilm" / "stoke.toml").write_text(f'source = "{minilm_path}"\n')
    load = "" if load_broken else "load = false\n"
    for name, kind, source in (("bad-gguf", "decoder", broken["gguf"]),
                               ("bad-safetensors", "encoder", broken["safetensors"]),
                               ("bad-missing", "decoder", broken["missing"])):
        (root / name).mkdir()
        (root / name / "stoke.toml").write_text(f'source = "{source}"\nkind = "{kind}"\n{load}')
    return root


# What each broken model's error must say (the loader names the problem, the repository the model).
PROBLEM = {"bad-gguf": "truncated.gguf", "bad-safetensors": "model.safetensors", "bad-missing": "nowhere.gguf"}


def index(srv):
    return {m["name"]: m for m in srv.post("/v2/repository/index").json()}


def test_a_model_that_fails_to_load_leaves_the_others_serving(stoke_bin, minilm_path, broken, tmp_path):
    repo = repository(tmp_path / "models", minilm_path, broken, load_broken=False)
    srv = ClassicServer(stoke_bin, None, "--model-repository", repo, "--threads", 1, log_dir=tmp_path)
    try:
        idx = index(srv)
        assert idx["minilm"]["state"] == "READY"
        assert all(idx[n]["state"] == "UNAVAILABLE" and idx[n]["reason"] == "" for n in PROBLEM), idx  # not tried
        g = grpcclient.InferenceServerClient(url=srv.grpc_url)
        h = httpclient.InferenceServerClient(url=srv.http_url)
        session = requests.Session()

        def good_grpc():
            out = g.infer("minilm", [text_input(grpcclient, TEXTS)]).as_numpy("embedding")
            assert out.shape[0] == 2

        def good_openai():
            r = session.post(srv.base_url + "/v1/embeddings", json={"model": "minilm", "input": TEXTS}, timeout=120)
            assert r.status_code == 200 and len(r.json()["data"]) == 2, r.text

        with GoodTraffic(good_grpc, "gRPC infer") as a, GoodTraffic(good_openai, "embeddings") as b, \
                GoodTraffic(good_openai, "embeddings 2") as c:
            # REST loads, all three at once (they queue on the repository's worker), and again one by one.
            def load(name):
                return srv.post(f"/v2/repository/models/{name}/load")

            for _ in range(2):
                before = [t.ok for t in (a, b, c)]
                with concurrent.futures.ThreadPoolExecutor(len(PROBLEM)) as pool:
                    answers = dict(zip(PROBLEM, pool.map(load, PROBLEM)))
                for name, r in answers.items():
                    assert r.status_code == 400, (name, r.status_code, r.text)
                    err = r.json()["error"]
                    assert isinstance(err, str) and f"model '{name}'" in err and PROBLEM[name] in err, (name, err)
                for t, n in zip((a, b, c), before):
                    t.wait_past(n)
            idx = index(srv)
            for name in PROBLEM:  # the reason is the load's error, for the index to show
                assert idx[name]["state"] == "UNAVAILABLE" and PROBLEM[name] in idx[name]["reason"], idx[name]
                assert not h.is_model_ready(name)
            # The same over gRPC (RepositoryModelLoad): an error status with the message.
            for name in PROBLEM:
                before = a.ok
                with pytest.raises(InferenceServerException) as e:
                    g.load_model(name)
                # DATA_LOSS for a file cut short, NOT_FOUND for one not there (it was UNKNOWN)
                assert e.value.status() == ("StatusCode.NOT_FOUND" if name == "bad-missing" else "StatusCode.DATA_LOSS")
                assert PROBLEM[name] in e.value.message(), (name, e.value)
                a.wait_past(before)
            # A request to a model that is not loaded: 503 (with Retry-After) naming it, not a 5xx of another kind.
            r = srv.post("/v1/embeddings", json={"model": "bad-safetensors", "input": "x"})
            assert r.status_code == 503 and r.headers.get("Retry-After") == "1", r.text
            assert "bad-safetensors" in r.json()["error"]["message"], r.text
        for t in (a, b, c):
            assert not t.failures and t.ok > 0, t.failures
        assert srv.get("/health/ready").status_code == 200  # a failed load does not hold readiness
        assert index(srv)["minilm"]["state"] == "READY"
        assert srv.proc.poll() is None
    finally:
        assert srv.stop() == 0, srv.log()


def test_a_model_that_fails_to_load_at_start_ends_the_server_with_a_message(stoke_bin, minilm_path, broken, tmp_path):
    repo = repository(tmp_path / "models", minilm_path, broken, load_broken=True)
    p = subprocess.run([str(stoke_bin), "serve", "--model-repository", str(repo), "--port", "0", "--grpc-port", "0",
                        "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and p.returncode < 128, (p.returncode, p.stderr)  # an exit, not a signal
    assert "cannot load" in p.stderr and any(s in p.stderr for s in PROBLEM.values()), p.stderr


@pytest.mark.parametrize("which, words", [("gguf", ("truncated.gguf", "exceeds remaining")),
                                          ("safetensors", ("model.safetensors", "run past")),
                                          ("missing", ("nowhere.gguf", "no such file"))])
def test_serving_a_broken_model_alone_exits_with_a_message(stoke_bin, broken, which, words):
    p = subprocess.run([str(stoke_bin), "serve", "--model", str(broken[which]), "--port", "0", "--grpc-port", "0",
                        "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, (p.returncode, p.stderr)  # an exit with a message, not a signal
    assert "cannot load model" in p.stderr and all(w in p.stderr for w in words), p.stderr


# --- Error shapes by route on a server holding every kind ----------------------------------------------------

@pytest.fixture(scope="module")
def mixed(stoke_bin, minilm_path, tmp_path_factory):
    """One process: a 1-layer `stoke model synth` decoder `chat`, the encoder `minilm` and a synthetic model."""
    d = tmp_path_factory.mktemp("mixed")
    r = subprocess.run([str(stoke_bin), "model", "synth", "--shape", "smollm2-135m", "--layers", "1", "--out",
                        str(d / "tiny"), "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    synth = write_model_file(d, type="synthetic", name="synth", input_bytes=8, output_bytes=8, max_batch_size=4)
    s = ClassicServer(stoke_bin, None, "--model", f"chat={d / 'tiny'}", "--model", f"minilm={minilm_path}",
                      "--model", synth, "--threads", 1, log_dir=d)
    yield s
    assert s.stop() == 0, s.log()


def openai_error(r, status, code, *words):
    """OpenAI's shape: {"error": {"message", "type", "param", "code"}}, the message holding `words`."""
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == "invalid_request_error" and err["code"] == code and err["param"] == "model", err
    assert all(w in err["message"] for w in words), err


def kserve_error(r, status, *words):
    """KServe's shape: {"error": "message"}, the message holding `words`."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    assert all(w in body["error"] for w in words), body


def test_wrong_kind_or_unknown_model_gets_each_routes_error_shape(mixed):
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    session = requests.Session()

    def good_chat():
        r = session.post(mixed.base_url + "/v1/chat/completions", json={**chat, "model": "chat"}, timeout=120)
        assert r.status_code == 200, r.text

    with GoodTraffic(good_chat, "good chat") as good:
        # OpenAI routes: a model of another kind is 400 model_not_supported, an unknown one 404 model_not_found.
        for route, body in (("/v1/chat/completions", chat), ("/v1/completions", {"prompt": "x", "max_tokens": 2})):
            for model, kind in (("minilm", "encoder"), ("synth", "synthetic")):
                openai_error(mixed.post(route, json={**body, "model": model}), 400, "model_not_supported", model, kind)
            openai_error(mixed.post(route, json={**body, "model": "nope"}), 404, "model_not_found", "nope", "`chat`")
        for model, kind in (("chat", "decoder"), ("synth", "synthetic")):
            openai_error(mixed.post("/v1/embeddings", json={"model": model, "input": "x"}), 400, "model_not_supported",
                         model, kind)
        openai_error(mixed.post("/v1/embeddings", json={"model": "nope", "input": "x"}), 404, "model_not_found", "nope")
        # The openai client sees the same as exceptions with the status.
        c = openai.OpenAI(base_url=mixed.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError) as e:
            c.embeddings.create(model="chat", input="x")
        assert e.value.code == "model_not_supported"
        with pytest.raises(openai.NotFoundError) as e:
            c.chat.completions.create(model="nope", **chat)
        assert e.value.code == "model_not_found"
        # KServe REST: the decoder is not a KServe model, an unknown one is unknown; 404 in KServe's shape either way
        # (not the OpenAI shape the server's other unknown routes use).
        infer = {"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [1, 8], "data": list(range(8))}]}
        for model, words in (("chat", ("'chat'", "decoder", "OpenAI")), ("nope", ("unknown model 'nope'",))):
            kserve_error(mixed.post(f"/v2/models/{model}/infer", json=infer), 404, *words)
            kserve_error(mixed.get(f"/v2/models/{model}"), 404, *words)
            kserve_error(mixed.get(f"/v2/models/{model}/ready"), 404, *words)
            kserve_error(mixed.get(f"/v2/models/{model}/config"), 404, *words)
        kserve_error(mixed.post("/v2/repository/models/nope/load"), 404, "unknown model 'nope'")
        kserve_error(mixed.post("/v2/models/minilm/nothing-here"), 404, "no route for POST /v2/models/minilm/nothing")
        # tritonclient HTTP raises with the message.
        h = httpclient.InferenceServerClient(url=mixed.http_url)
        with pytest.raises(InferenceServerException) as e:
            h.get_model_metadata("chat")
        assert "decoder" in e.value.message()
        # KServe gRPC: NOT_FOUND naming the model, for ModelInfer and ModelMetadata.
        g = grpcclient.InferenceServerClient(url=mixed.grpc_url)
        inp = grpcclient.InferInput("INPUT0", [1, 8], "UINT8")
        inp.set_data_from_numpy(np.arange(8, dtype=np.uint8).reshape(1, 8))
        for model, word in (("chat", "decoder"), ("nope", "unknown model 'nope'")):
            for call in (lambda: g.infer(model, [inp]), lambda: g.get_model_metadata(model)):
                with pytest.raises(InferenceServerException) as e:
                    call()
                assert e.value.status() == "StatusCode.NOT_FOUND" and word in e.value.message(), e.value
        good.wait_past(good.ok)
    assert not good.failures
    # The right kinds, for contrast: each answers.
    assert mixed.post("/v2/models/synth/infer", json=infer).status_code == 200
    assert mixed.post("/v1/embeddings", json={"model": "minilm", "input": "x"}).status_code == 200
