"""Serving behaviour of a real `stoke serve` under load: batching never changes greedy outputs, the prefix
cache reuses a shared system prompt without changing outputs, a client that goes away frees its KV blocks,
a full queue answers 503, and every bad input gets its own status and message while good requests go on."""
import concurrent.futures
import json
import socket
import threading
import time

import openai
import pytest
import requests

LONG_SYSTEM = (
    "You are a meticulous assistant for a hardware store. You answer questions about tools, fasteners, paint, "
    "garden supplies and plumbing parts. Always be concise, name the aisle when you know it, and never invent "
    "prices. Aisle 1 holds hand tools such as hammers, screwdrivers and wrenches. Aisle 2 holds power tools and "
    "their batteries. Aisle 3 holds screws, nails, bolts, washers and wall anchors. Aisle 4 holds paint, "
    "brushes, rollers and tape. Aisle 5 holds garden hoses, seeds, soil and planters. Aisle 6 holds pipes, "
    "valves, fittings and sealant. When a customer asks for something the store does not carry, say so "
    "politely and suggest the closest item the store does carry. ") * 2
QUESTIONS = ["Where are the hammers?", "Do you sell paint rollers?", "I need wall anchors.", "Where is soil?"]


def client_for(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


def greedy_completion(client, model, prompt, max_tokens=12):
    r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                  extra_body={"ignore_eos": True})
    return r.choices[0].text


def wait_until(pred, timeout=20.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def test_32_concurrent_greedy_requests_equal_each_alone(server, openai_client, model_name):
    prompts = [f"Write the number {i} in words, then a fact about it:" for i in range(32)]
    alone = [greedy_completion(openai_client, model_name, p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        together = list(pool.map(lambda p: greedy_completion(openai_client, model_name, p), prompts))
    assert together == alone
    assert server.metric("stoke:step_decode_tokens_sum") > 0


def test_prefix_cache_on_off_same_outputs_and_hits_rise(start_server):
    on = start_server()
    off = start_server("--no-prefix-cache")

    def ask(server):
        client = client_for(server)
        name = server.model_name()
        out = []
        for q in QUESTIONS:
            r = client.chat.completions.create(
                model=name, max_tokens=16, temperature=0,
                messages=[{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": q}])
            out.append((r.choices[0].message.content, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens))
        return out

    hits_before = on.metric("stoke:prefix_cache_hits_total")
    with_cache, without_cache = ask(on), ask(off)
    assert [t for t, _, _ in with_cache] == [t for t, _, _ in without_cache]
    assert [p for _, p, _ in with_cache] == [p for _, p, _ in without_cache]
    system_tokens = with_cache[0][1] - 20  # the system prompt is most of each prompt
    # requests 2..4 reuse the system prompt's full blocks
    assert all(cached >= system_tokens - 32 for _, _, cached in with_cache[1:]), with_cache
    assert all(cached == 0 for _, _, cached in without_cache)
    assert on.metric("stoke:prefix_cache_hits_total") - hits_before >= 3 * (system_tokens - 32)
    assert off.metric("stoke:prefix_cache_hits_total") == 0


def test_disconnect_mid_stream_frees_blocks(server, model_name):
    aborted = server.metric("stoke:request_success_total", finished_reason="abort")
    body = {"model": model_name, "prompt": "Tell me a very long story about dragons.", "max_tokens": 4000,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with requests.post(server.base_url + "/v1/completions", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith(b"data: "):
                got += 1
                if got == 3:
                    break
        wait_until(lambda: server.metric("stoke:kv_cache_blocks_used") > 0, what="blocks in use while streaming")
    # the response is closed: the socket is gone
    wait_until(lambda: server.metric("stoke:request_success_total", finished_reason="abort") == aborted + 1,
               what="the request to be aborted")
    wait_until(lambda: server.metric("stoke:kv_cache_blocks_used") == 0 and
               server.metric("stoke:num_requests_running") == 0, what="blocks to be freed")


def test_disconnect_while_waiting_non_streaming_frees_blocks(server, model_name):
    aborted = server.metric("stoke:request_success_total", finished_reason="abort")
    body = json.dumps({"model": model_name, "prompt": "Tell me a long story.", "max_tokens": 4000,
                       "temperature": 0, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    wait_until(lambda: server.metric("stoke:num_requests_running") == 1, what="the request to run")
    s.close()
    wait_until(lambda: server.metric("stoke:request_success_total", finished_reason="abort") == aborted + 1,
               what="the request to be aborted")
    wait_until(lambda: server.metric("stoke:kv_cache_blocks_used") == 0, what="blocks to be freed")


def test_full_queue_answers_503(start_server):
    srv = start_server("--max-waiting", "1", "--max-num-seqs", "1")
    name = srv.model_name()
    body = {"model": name, "prompt": "Tell me a story.", "max_tokens": 64, "temperature": 0, "ignore_eos": True}

    def post(_):
        r = requests.post(srv.base_url + "/v1/completions", json=body, timeout=300)
        return r.status_code, r.headers.get("Retry-After"), r.json()

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(post, range(8)))
    codes = [c for c, _, _ in results]
    # at most one runs and one waits at a time: some get through, the flood gets 503
    assert codes.count(200) >= 1, codes
    assert codes.count(503) >= 1, codes
    assert codes.count(200) + codes.count(503) == len(codes), codes
    for code, retry_after, j in results:
        if code == 503:
            assert retry_after is not None
            assert j["error"]["code"] == "queue_full"
            assert j["error"]["type"] == "server_error"
        else:
            assert code == 200, j
    # the openai client surfaces it as a 503 too
    with pytest.raises(openai.APIStatusError) as e:
        with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
            futures = [pool.submit(client_for(srv).completions.create, model=name, prompt="Hi", max_tokens=64,
                                   temperature=0, extra_body={"ignore_eos": True}) for _ in range(6)]
            for f in futures:
                f.result()
    assert e.value.status_code == 503


BAD = [
    # (path, raw body or json, expected status, message fragment, param)
    ("/v1/chat/completions", b"{not json", 400, "not valid JSON", None),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "'messages' must be a list", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400,
     "'temperature' must be a number", "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400,
     "'max_tokens' must be in", "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "only n=1", "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "model": "gpt-4o"}, 404,
     "The model `gpt-4o` does not exist", "model"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream_options": {}}, 400,
     "only allowed when 'stream' is true", "stream_options"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "a batch of 2 prompts is not supported", "prompt"),
    ("/v1/completions", {"prompt": "hello", "max_tokens": 9000}, 400,
     "maximum context length is 8192 tokens. However, you requested 9001 tokens (1 in the prompt, 9000 in the "
     "completion)", "prompt"),
    ("/v1/completions", {"prompt": [1, 99999999]}, 400, "outside the vocabulary", "prompt"),
    ("/v1/completions", {"prompt": "x", "logprobs": 50}, 400, "'logprobs' must be in [0, 20]", "logprobs"),
    ("/v1/completions", {"prompt": "x", "stop": 3}, 400, "'stop' must be a string or a list", "stop"),
    ("/v1/completions", {"prompt": "x", "echo": True}, 400, "'echo' is not supported", "echo"),
]


def test_bad_inputs_get_their_errors_while_a_good_request_succeeds(server, model_name):
    good = {}

    def run_good():
        body = {"model": model_name, "prompt": "List ten fruits:", "max_tokens": 48, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with requests.post(server.base_url + "/v1/completions", json=body, stream=True, timeout=300) as r:
            good["status"] = r.status_code
            good["lines"] = [l for l in r.iter_lines() if l]

    t = threading.Thread(target=run_good)
    t.start()
    for path, body, status, fragment, param in BAD:
        kw = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) else {
            "json": body}
        r = requests.post(server.base_url + path, timeout=60, **kw)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert fragment in err["message"], (body, err)
        assert err["param"] == param, (body, err)
        assert err["type"] == "invalid_request_error"
    # the server's own errors: too large, unknown route, wrong method
    r = requests.post(server.base_url + "/v1/completions", data=b"x" * (9 << 20), timeout=60,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "larger than the limit" in r.json()["error"]["message"]
    r = requests.get(server.base_url + "/v1/nothing-here", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["message"] == "no route for GET /v1/nothing-here"
    r = requests.get(server.base_url + "/v1/completions", timeout=10)
    assert r.status_code == 405 and r.headers["Allow"] == "POST"
    t.join(timeout=300)
    assert good["status"] == 200
    assert good["lines"][-1] == b"data: [DONE]"
    finish = json.loads(good["lines"][-2][len(b"data: "):])
    assert finish["choices"][0]["finish_reason"] == "length"


def test_step_time_target_keeps_greedy_outputs_and_caps_prefill(start_server):
    """--target-step-ms: a 5 ms target is below what even a decode step costs on this CPU, so once the fit has
    its first steps (a warm-up request), each step takes only its minimum prefill chunk (64 tokens). A ~300-token
    prompt, one step uncapped, is then cut into 5+ chunks, and 8 concurrent prompts share steps beside the
    decodes. Every greedy output is exactly what the same prompt gets alone on a server without the target."""
    import openai
    plain = start_server()
    capped = start_server("--target-step-ms", 5)
    model = plain.model_name()
    long_prompt = " ".join(f"Item {i} of the list is the word number {i}." for i in range(30))
    prompts = [f"Describe colour number {i} of the rainbow, where it sits in the arc, and why light bends there:"
               for i in range(8)]

    def client(srv):
        return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=300)

    def prefill_steps():
        return (capped.metric("stoke:step_prefill_tokens_count"),
                capped.metric("stoke:step_prefill_tokens_bucket", le="100"))

    alone = [greedy_completion(client(plain), model, p) for p in [long_prompt] + prompts]
    greedy_completion(client(capped), model, "Warm up the step fit.")  # 12+ steps: the fit is on
    count0, le0 = prefill_steps()
    r = client(capped).completions.create(model=model, prompt=long_prompt, max_tokens=12, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens > 250
    assert r.choices[0].text == alone[0]
    count1, le1 = prefill_steps()
    assert count1 - count0 >= 4  # > 250 tokens at 64 a step
    assert le1 - le0 == count1 - count0  # no step over 100 prompt tokens
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(lambda p: greedy_completion(client(capped), model, p), prompts))
    assert together == alone[1:]
    count2, le2 = prefill_steps()
    assert le2 - le1 == count2 - count1
