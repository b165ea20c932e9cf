"""Hostile input against real servers: the SmolLM2 decoder (OpenAI API) and all-MiniLM-L6-v2 (KServe v2 REST and
gRPC, /v1/embeddings). Every case must get a 4xx (or a gRPC error status) with a JSON (or text) message naming the
problem; after each case the server still answers /health/live on a fresh connection, and a good request from
another client, running the whole time on its own connection, completes after the case started (GoodTraffic).

The counts of cases tried are printed (-s) and recorded in docs/reliability.md."""
import json
import socket

import pytest
import requests

from classic_server import ClassicServer, write_model_file
from hostile import GoodTraffic, Reader, closed_by_peer, connect, exchange, is_json_error

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "Say hi."}]


# ---------------------------------------------------------------- the decoder server

@pytest.fixture(scope="module")
def decoder(start_server):
    return start_server("--max-body-bytes", "1MiB")


@pytest.fixture(scope="module")
def good_chat(decoder):
    name = decoder.model_name()
    session = requests.Session()  # its own keep-alive connection

    def one():
        r = session.post(decoder.base_url + CHAT, timeout=120,
                         json={"model": name, "messages": MSG, "max_tokens": 1, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 1, r.text

    with GoodTraffic(one, "good chat") as good:
        yield good
    assert not good.failures, good.failures


def check_alive(server, good, before):
    r = requests.get(server.base_url + "/health/live", timeout=30)
    assert r.status_code == 200, r.text
    assert server.proc.poll() is None
    good.wait_past(before)


def expect_error(r, status, fragment=None):
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert is_json_error(r.content), r.text[:500]
    if fragment is not None:
        msg = r.json()["error"]
        msg = msg["message"] if isinstance(msg, dict) else msg
        assert fragment in msg, msg


def raw_cases(big):
    """(name, bytes to send, expected status): malformed or oversized HTTP at the protocol level."""
    post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return [
        ("header value 100 KiB", b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (100 << 10) + b"\r\n\r\n",
         431),
        ("10,000 headers", b"GET /health/live HTTP/1.1\r\nHost: x\r\n" +
         b"".join(b"X-H%d: v\r\n" % i for i in range(10000)) + b"\r\n", 431),
        ("target 100 KiB", b"GET /" + b"a" * (100 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431),
        ("Content-Length past the body limit", post + b"Content-Length: 1000000000000\r\n\r\n{", 413),
        ("Content-Length overflows 64 bits", post + b"Content-Length: 99999999999999999999999\r\n\r\n{}", 400),
        ("negative Content-Length", post + b"Content-Length: -5\r\n\r\n{}", 400),
        ("two different Content-Lengths", post + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
        ("chunk size not hex", post + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400),
        ("chunk size overflows", post + b"Transfer-Encoding: chunked\r\n\r\nfffffffffffffffffffff\r\n{}\r\n0\r\n\r\n",
         400),
        ("chunk data without its CRLF", post + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX1\r\n}\r\n0\r\n\r\n", 400),
        ("chunked body past the body limit", post + b"Transfer-Encoding: chunked\r\n\r\n" +
         (b"10000\r\n" + b" " * 0x10000 + b"\r\n") * 17 + b"0\r\n\r\n", 413),
        ("unknown transfer coding", post + b"Transfer-Encoding: gzip\r\n\r\n{}", 400),
        ("garbage request line", b"\x00\x01\x02 \xff\xfe\r\n\r\n", 400),
        ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
        ("HTTP/9.9", b"GET /health/live HTTP/9.9\r\nHost: x\r\n\r\n", 400),
        ("bare LF line ends and no version", b"GET /health/live\n\n", 400),
        ("control characters in a header", b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-A: a\x01\x02b\r\n\r\n", 400),
        ("header without a colon", b"GET /health/live HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", 400),
        ("non-UTF-8 bytes in the target", b"GET /v1/\xff\xfe\xfd HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        ("non-UTF-8 bytes in the method", b"G\xffT /health/live HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    ]


def test_malformed_http(decoder, good_chat):
    tried, bad = 0, []
    for name, data, status in raw_cases(big=True):
        before = good_chat.ok
        r = exchange(decoder.port, data)
        if r.status != status or not is_json_error(r.body):
            bad.append((name, r))
        check_alive(decoder, good_chat, before)
        tried += 1
    assert not bad, bad
    print(f"\nmalformed HTTP cases: {tried}")


def test_truncated_requests_close_quietly(decoder, good_chat):
    """A request cut off mid-headers, mid-body or mid-chunk, then a half-close: the server closes the connection
    (408/400 or nothing), frees it, and goes on."""
    post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    for data in (b"GET /health/li", post + b"Content-Length: 100\r\n\r\n{\"mess",
                 post + b"Transfer-Encoding: chunked\r\n\r\n10\r\n{\"messages\""):
        before = good_chat.ok
        s = connect(decoder.port)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        assert closed_by_peer(s)
        s.close()
        check_alive(decoder, good_chat, before)


def test_pipelining_abuse(decoder, good_chat):
    before = good_chat.ok
    # 300 requests in one write: all answered, in order, on the one connection.
    with connect(decoder.port) as s:
        s.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n" * 150 +
                  b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n" * 150)
        reader = Reader(s)
        statuses = [reader.response().status for _ in range(300)]
    assert statuses == [200] * 150 + [404] * 150
    # Chat requests pipelined behind one another, then a malformed one, then more that must not be answered.
    name = decoder.model_name()
    body = json.dumps({"model": name, "messages": MSG, "max_tokens": 2, "ignore_eos": True}).encode()
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
           + str(len(body)).encode() + b"\r\n\r\n" + body)
    with connect(decoder.port) as s:
        s.sendall(req * 5 + b"BROKEN\r\n\r\n" + req * 5)
        reader = Reader(s)
        got = [reader.response() for _ in range(6)]
        assert [r.status for r in got] == [200] * 5 + [400], got
        assert all(r.json()["usage"]["completion_tokens"] == 2 for r in got[:5])
        assert closed_by_peer(s)
    check_alive(decoder, good_chat, before)


def json_cases(name):
    base = {"model": name, "messages": MSG, "max_tokens": 1}
    raw = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    dump = lambda **kw: json.dumps({**base, **kw}).encode()  # noqa: E731
    return [
        # (case, body bytes, status, message fragment)
        ("empty body", b"", 400, "not valid JSON"),
        ("JSON null", b"null", 400, "must be a JSON object"),
        ("JSON list", b"[]", 400, "must be a JSON object"),
        ("JSON string", b'"hi"', 400, "must be a JSON object"),
        ("trailing garbage", dump() + b"}", 400, "not valid JSON"),
        ("invalid UTF-8 in a string", b'{"messages": [{"role": "user", "content": "\xff\xfe\xc3"}]}', 400,
         "not valid JSON"),
        ("overlong UTF-8", b'{"messages": [{"role": "user", "content": "\xc0\xaf"}]}', 400, "not valid JSON"),
        ("lone surrogate escape", raw('{"messages": [{"role": "user", "content": "\\ud800"}]}'), 400,
         "not valid JSON"),
        ("NUL byte in the document", b'{"messages": [{"role": "user", "content": "a\x00b"}]}', 400, "not valid JSON"),
        ("lists nested 100,000 deep", b"[" * 100000 + b"]" * 100000, 400, "deeper than"),
        ("objects nested 100,000 deep", b'{"a":' * 100000 + b"1" + b"}" * 100000, 400, "deeper than"),
        ("deep nesting inside a field", raw('{"messages": ' + "[" * 50000 + "]" * 50000 + "}"), 400, "deeper than"),
        ("unclosed nesting 100,000 deep", b"[" * 100000, 400, "deeper than"),
        ("NaN", raw('{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}'), 400, "not valid JSON"),
        ("Infinity", raw('{"messages": [{"role": "user", "content": "x"}], "temperature": Infinity}'), 400,
         "not valid JSON"),
        ("number beyond double", raw('{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e400}'), 400,
         None),
        ("temperature 1e308", dump(temperature=1e308), 400, "'temperature' must be in"),
        ("integer beyond 64 bits", raw('{"messages": [{"role": "user", "content": "x"}], '
                                       '"max_tokens": 123456789012345678901234567890}'), 400, None),
        ("seed 2**64", raw('{"messages": [{"role": "user", "content": "x"}], "seed": 18446744073709551616}'), 400,
         None),
        ("seed 2**63", raw('{"messages": [{"role": "user", "content": "x"}], "seed": 9223372036854775808}'), 400,
         "'seed' must be in"),
        ("top_k 2**63 - 1", dump(top_k=2**63 - 1), 400, "'top_k' must be in"),
        ("max_tokens -1", dump(max_tokens=-1), 400, "'max_tokens' must be in"),
        ("max_tokens 0", dump(max_tokens=0), 400, "'max_tokens' must be in"),
        ("max_tokens 10**12", dump(max_tokens=10**12), 400, "'max_tokens' must be in"),
        ("max_tokens 2**30 (past the context)", dump(max_tokens=2**30), 400, "maximum context length"),
        ("max_completion_tokens -5", dump(max_completion_tokens=-5), 400, "'max_completion_tokens' must be in"),
        ("n 0", dump(n=0), 400, "'n' must be in"),
        ("n -1", dump(n=-1), 400, "'n' must be in"),
        ("n 1000", dump(n=1000), 400, "only n=1"),
        ("n 10**9", dump(n=10**9), 400, "'n' must be in"),
        ("logit_bias non-numeric key", dump(logit_bias={"abc": 1}), 400, "logit_bias"),
        ("logit_bias token past the vocabulary", dump(logit_bias={"99999999": 100}), 400, "logit_bias"),
        ("logit_bias absurd bias", dump(logit_bias={"1": 1e9}), 400, "logit_bias"),
        ("logit_bias bias not a number", dump(logit_bias={"1": "x"}), 400, "logit_bias"),
        ("logit_bias 10,000 entries", dump(logit_bias={str(i): -100 for i in range(10000)}), 400, "logit_bias"),
        ("top_k -5", dump(top_k=-5), 400, "'top_k' must be in"),
        ("top_k 10**9", dump(top_k=10**9), 400, "'top_k' must be in"),
        ("top_p 0", dump(top_p=0), 400, "'top_p' must be in"),
        ("top_p -1", dump(top_p=-1), 400, "'top_p' must be in"),
        ("temperature -1", dump(temperature=-1), 400, "'temperature' must be in"),
        ("min_tokens -1", dump(min_tokens=-1), 400, "'min_tokens' must be in"),
        ("min_tokens > max_tokens", dump(min_tokens=5, max_tokens=2), 400, "must not exceed"),
        ("top_logprobs 21", dump(logprobs=True, top_logprobs=21), 400, "'top_logprobs' must be in"),
        ("priority 2**40", dump(priority=2**40), 400, "'priority' must be in"),
        ("stop: 17 strings", dump(stop=["a"] * 17), 400, "at most 16"),
        ("stop: empty string", dump(stop=[""]), 400, "must not be empty"),
        ("stop_token_ids negative", dump(stop_token_ids=[-1]), 400, "stop_token_ids"),
        ("stop_token_ids 2**40", dump(stop_token_ids=[2**40]), 400, "stop_token_ids"),
        ("unknown model", dump(model="no-such-model"), 404, "does not exist"),
        ("empty model", dump(model=""), 400, "must not be empty"),
        ("empty messages", dump(messages=[]), 400, "must not be empty"),
        ("unknown role", dump(messages=[{"role": "wizard", "content": "x"}]), 400, "not supported"),
        ("content part of an image", dump(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400,
         "only"),
        ("user message without content", dump(messages=[{"role": "user"}]), 400, "content is required"),
        ("tool calls", dump(tools=[{"type": "function"}]), 400, "not supported"),
        ("response_format json", dump(response_format={"type": "json_object"}), 400, "response_format"),
    ]


def test_bad_json_and_values(decoder, good_chat):
    name = decoder.model_name()
    tried = 0
    for case, body, status, fragment in json_cases(name):
        before = good_chat.ok
        r = requests.post(decoder.base_url + CHAT, data=body, headers={"Content-Type": "application/json"},
                          timeout=120)
        assert r.status_code == status, (case, r.status_code, r.text[:300])
        assert is_json_error(r.content), (case, r.text[:300])
        if fragment is not None:
            assert fragment in r.json()["error"]["message"], (case, r.json())
        check_alive(decoder, good_chat, before)
        tried += 1
    print(f"\nbad JSON / out-of-range cases: {tried}")


# Every field of a chat request, its kind, and values of every other kind.
CHAT_FIELDS = {
    "model": "string", "user": "string",
    "max_tokens": "int", "max_completion_tokens": "int", "top_k": "int", "seed": "int", "n": "int",
    "best_of": "int", "min_tokens": "int", "priority": "int", "top_logprobs": "int",
    "temperature": "number", "top_p": "number", "presence_penalty": "number", "frequency_penalty": "number",
    "repetition_penalty": "number",
    "stream": "bool", "ignore_eos": "bool", "logprobs": "bool",
    "stop": "stop", "stop_token_ids": "ids", "stream_options": "object", "logit_bias": "object",
    "tools": "list", "functions": "list", "tool_choice": "choice", "response_format": "object",
    "messages": "messages",
}
WRONG = {
    "string": [1, 1.5, [], {}, True],
    "int": ["1", 1.5, [], {}, True, [1]],
    "number": ["0.5", [], {}, True, [0.5]],
    "bool": ["true", 1, [], {}, 0.0],
    "stop": [1, {}, True, [1], [["a"]]],
    "ids": ["1", 1, {}, ["a"], [1.5]],
    "object": ["x", 1, [], True],
    "list": ["x", 1, {}, True],
    "choice": [1, {}, [], True],
    "messages": ["x", 1, {}, True, [1], [[]], [{"role": 1, "content": "x"}], [{"role": "user", "content": 1}],
                 [{"role": "user", "content": [1]}], [{"role": "user", "content": {"text": "x"}}],
                 [{"role": "user", "content": [{"type": "text", "text": 5}]}]],
}


def test_wrong_type_for_every_chat_field(decoder, good_chat):
    name = decoder.model_name()
    tried = 0
    for field, kind in CHAT_FIELDS.items():
        for value in WRONG[kind]:
            body = {"model": name, "messages": MSG, "max_tokens": 1}
            if field == "stream_options":
                body["stream"] = True
            body[field] = value
            before = good_chat.ok
            r = requests.post(decoder.base_url + CHAT, json=body, timeout=120)
            assert r.status_code == 400, (field, value, r.status_code, r.text[:300])
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and field in err["message"], (field, value, err)
            assert err["param"] == field, (field, value, err)
            check_alive(decoder, good_chat, before)
            tried += 1
    print(f"\nwrong-type cases: {tried} over {len(CHAT_FIELDS)} fields")


def test_prompt_longer_than_the_context(decoder, good_chat):
    name = decoder.model_name()
    words = " ".join(f"w{i}" for i in range(12000))  # > 8192 tokens
    for path, body in ((CHAT, {"model": name, "messages": [{"role": "user", "content": words}]}),
                       ("/v1/completions", {"model": name, "prompt": words, "max_tokens": 1}),
                       ("/v1/completions", {"model": name, "prompt": list(range(1, 9000)), "max_tokens": 1})):
        before = good_chat.ok
        r = requests.post(decoder.base_url + path, json=body, timeout=120)
        expect_error(r, 400, "maximum context length")
        check_alive(decoder, good_chat, before)
    # Just under the body limit: still a clear 400, and a body just over it a 413.
    before = good_chat.ok
    r = requests.post(decoder.base_url + CHAT, json={"messages": [{"role": "user", "content": "a " * 500000}]},
                      timeout=120)
    expect_error(r, 400, "maximum context length")
    r = requests.post(decoder.base_url + CHAT, json={"messages": [{"role": "user", "content": "a " * 600000}]},
                      timeout=120)
    expect_error(r, 413, "larger than the limit")
    check_alive(decoder, good_chat, before)


# ---------------------------------------------------------------- the encoder server (KServe REST, gRPC, embeddings)

@pytest.fixture(scope="module")
def encoder(stoke_bin, minilm_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile_kserve")
    model = write_model_file(d, type="bert", model=str(minilm_path), name="minilm", max_batch_size=4,
                             dynamic_batching={"max_queue_delay_microseconds": 1000})
    s = ClassicServer(stoke_bin, model, "--threads", "2", "--max-body-bytes", "1MiB", log_dir=d)
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def good_infer(encoder):
    session = requests.Session()
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["a good request"]}]}

    def one():
        r = session.post(encoder.base_url + "/v2/models/minilm/infer", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["shape"] == [1, 384], r.text

    with GoodTraffic(one, "good infer") as good:
        yield good
    assert not good.failures, good.failures


def kserve_cases():
    text = lambda **kw: {"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["x"], **kw}  # noqa: E731
    ids = lambda v, **kw: {"name": "input_ids", "datatype": "INT64", "shape": [1, len(v)], "data": v,  # noqa: E731
                           **kw}
    mask = lambda n: {"name": "attention_mask", "datatype": "INT64", "shape": [1, n], "data": [1] * n}  # noqa: E731
    j = lambda *inputs: json.dumps({"inputs": list(inputs)}).encode()  # noqa: E731
    return [
        # (case, model, body, extra headers, status)
        ("lists nested 100,000 deep", "minilm", b"[" * 100000 + b"]" * 100000, {}, 400),
        ("data nested 100,000 deep", "minilm",
         b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[1,1],"data":' + b"[" * 100000 + b"]" * 100000 +
         b"}]}", {}, 400),
        ("invalid UTF-8", "minilm", b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[1,1],"data":["\xff"]}]}',
         {}, 400),
        ("not JSON", "minilm", b"{inputs", {}, 400),
        ("inputs not a list", "minilm", b'{"inputs": 5}', {}, 400),
        ("no inputs", "minilm", b"{}", {}, 400),
        ("unknown datatype", "minilm", j(text(datatype="FP128")), {}, 400),
        ("datatype not a string", "minilm", j(text(datatype=7)), {}, 400),
        ("shape/data count mismatch", "minilm", j(text(shape=[2, 1])), {}, 400),
        ("negative dimension", "minilm", j(text(shape=[-1, 1])), {}, 400),
        ("dimensions that overflow", "minilm", j(text(shape=[2**62, 2**62])), {}, 400),
        ("dimension past 64 bits", "minilm",
         b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[1,99999999999999999999999],"data":["x"]}]}', {}, 400),
        ("shape of strings", "minilm", j(text(shape=["a", "b"])), {}, 400),
        ("batch past max_batch_size", "minilm", j(text(shape=[5, 1], data=["x"] * 5)), {}, 400),
        ("data of the wrong type", "minilm", j(text(data=[1])), {}, 400),
        ("token id past the vocabulary", "minilm-ids", j(ids([101, 10**9, 102]), mask(3)), {}, 400),
        ("negative token id", "minilm-ids", j(ids([101, -7, 102]), mask(3)), {}, 400),
        ("token id past 64 bits", "minilm-ids",
         b'{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,1],"data":[99999999999999999999]},'
         b'{"name":"attention_mask","datatype":"INT64","shape":[1,1],"data":[1]}]}', {}, 400),
        ("mask of another shape", "minilm-ids", j(ids([101, 102]), mask(3)), {}, 400),
        ("binary header length past the body", "minilm", j(text()), {"Inference-Header-Content-Length": "99999"},
         400),
        ("binary header length negative", "minilm", j(text()), {"Inference-Header-Content-Length": "-1"}, 400),
        ("binary header length not a number", "minilm", j(text()), {"Inference-Header-Content-Length": "12abc"}, 400),
        ("binary_data_size past the body", "minilm",
         json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1],
                                 "parameters": {"binary_data_size": 1 << 40}}]}).encode(), {"hdr": True}, 400),
        ("binary BYTES element claims more than it has", "minilm",
         (json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1],
                                  "parameters": {"binary_data_size": 8}}]}).encode(), b"\xff\xff\xff\x7fabcd"),
         {"hdr": True}, 400),
        ("unknown model", "nope", j(text()), {}, 404),
        ("sequence_id parameter", "minilm", json.dumps({"inputs": [text()], "parameters": {"sequence_id": 3}}).encode(),
         {}, 400),
        ("unsupported Content-Encoding", "minilm", j(text()), {"Content-Encoding": "br"}, 415),
    ]


def test_kserve_rest_hostile(encoder, good_infer):
    tried = 0
    for case, model, body, headers, status in kserve_cases():
        headers = dict(headers)
        if headers.pop("hdr", False):
            head, tail = body if isinstance(body, tuple) else (body, b"")
            headers["Inference-Header-Content-Length"] = str(len(head))
            body = head + tail
        headers.setdefault("Content-Type", "application/json")
        before = good_infer.ok
        r = requests.post(f"{encoder.base_url}/v2/models/{model}/infer", data=body, headers=headers, timeout=120)
        assert r.status_code == status, (case, r.status_code, r.text[:300])
        assert is_json_error(r.content), (case, r.text[:300])
        check_alive(encoder, good_infer, before)
        tried += 1
    print(f"\nKServe REST cases: {tried}")


EMBEDDING_BODIES = [
    b"[" * 100000 + b"]" * 100000,
    b'{"input": "\xff\xfe"}',
    json.dumps({"input": 5}).encode(),
    json.dumps({"input": {}}).encode(),
    json.dumps({"input": []}).encode(),
    json.dumps({"input": [1.5]}).encode(),
    json.dumps({"input": [[1, -2]]}).encode(),
    json.dumps({"input": [[10**12]]}).encode(),
    json.dumps({"input": "x", "encoding_format": "hex"}).encode(),
    json.dumps({"input": "x", "dimensions": -1}).encode(),
    json.dumps({"input": "x", "model": 5}).encode(),
    json.dumps({"input": "x", "model": "nope"}).encode(),
    json.dumps({"input": ["x"] * 100000}).encode(),  # past the 2,048 inputs allowed
]


def test_embeddings_hostile(encoder, good_infer):
    for body in EMBEDDING_BODIES:
        before = good_infer.ok
        r = requests.post(encoder.base_url + "/v1/embeddings", data=body,
                          headers={"Content-Type": "application/json"}, timeout=120)
        assert 400 <= r.status_code < 500, (body[:80], r.status_code, r.text[:300])
        assert is_json_error(r.content), (body[:80], r.text[:300])
        check_alive(encoder, good_infer, before)
    print(f"\nembeddings cases: {len(EMBEDDING_BODIES)}")


def test_grpc_hostile(encoder, good_infer):
    grpc = pytest.importorskip("grpc")
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    # A client allowing large messages both ways, so the server's own limit is what is tested.
    channel = grpc.insecure_channel(encoder.grpc_url, options=[("grpc.max_send_message_length", 1 << 30),
                                                               ("grpc.max_receive_message_length", 1 << 30)])
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    def req(model="minilm-ids", inputs=(), raw=()):
        r = service_pb2.ModelInferRequest(model_name=model)
        for name, datatype, shape, values in inputs:
            t = r.inputs.add(name=name, datatype=datatype, shape=list(shape))
            if values is not None:
                t.contents.int64_contents.extend(values)
        r.raw_input_contents.extend(raw)
        return r

    def ids_mask(ids, shape=None, mask_shape=None):
        n = len(ids)
        return [("input_ids", "INT64", shape or [1, n], ids), ("attention_mask", "INT64", mask_shape or [1, n],
                                                               [1] * n)]

    cases = [
        ("oversized message (> --max-body-bytes)", req(raw=[b"\0" * (2 << 20), b"\0" * 8],
                                                        inputs=[("input_ids", "INT64", [1, 1], None),
                                                                ("attention_mask", "INT64", [1, 1], None)]),
         grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("raw bytes fewer than the shape", req(raw=[b"\0" * 24, b"\0" * 32],
                                               inputs=[("input_ids", "INT64", [1, 4], None),
                                                       ("attention_mask", "INT64", [1, 4], None)]),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("raw bytes more than the shape", req(raw=[b"\0" * 40, b"\0" * 32],
                                              inputs=[("input_ids", "INT64", [1, 4], None),
                                                      ("attention_mask", "INT64", [1, 4], None)]),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("contents count mismatch", req(inputs=ids_mask([101, 102], shape=[1, 3])), grpc.StatusCode.INVALID_ARGUMENT),
        ("dimensions that overflow", req(inputs=ids_mask([101], shape=[2**62, 2**62])),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("negative dimension", req(inputs=ids_mask([101], shape=[-1, 1])), grpc.StatusCode.INVALID_ARGUMENT),
        ("unknown datatype", req(inputs=[("input_ids", "FOO", [1, 1], [1]), ("attention_mask", "INT64", [1, 1], [1])]),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("empty datatype", req(inputs=[("input_ids", "", [1, 1], [1]), ("attention_mask", "INT64", [1, 1], [1])]),
         grpc.StatusCode.INVALID_ARGUMENT),
        ("token id past the vocabulary", req(inputs=ids_mask([101, 10**9, 102])), grpc.StatusCode.INVALID_ARGUMENT),
        ("negative token id", req(inputs=ids_mask([101, -3, 102])), grpc.StatusCode.INVALID_ARGUMENT),
        ("no inputs", req(), grpc.StatusCode.INVALID_ARGUMENT),
        ("unknown model", req(model="nope", inputs=ids_mask([101])), grpc.StatusCode.NOT_FOUND),
        ("empty model name", req(model="", inputs=ids_mask([101])), grpc.StatusCode.NOT_FOUND),
    ]
    for case, request, code in cases:
        before = good_infer.ok
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(request, timeout=120)
        assert e.value.code() == code, (case, e.value.code(), e.value.details())
        assert e.value.details(), case
        check_alive(encoder, good_infer, before)
        # and the gRPC side still serves
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=30).live
    # Garbage that is not a protobuf at all, sent as a ModelInfer message.
    garbage = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                  request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as e:
        garbage(b"\xff" * 64, timeout=60)
    assert e.value.code() != grpc.StatusCode.OK
    channel.close()
    print(f"\ngRPC cases: {len(cases) + 1}")
