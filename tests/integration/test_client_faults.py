"""Client faults against real servers: a client that goes away mid-stream or mid-body, a slow reader, half-open
connections (silent, half a request, half-closed), and floods past the queue limits. Each fault must free what it
held (KV blocks back in the pool per /metrics, the server's descriptors back to where they were per /proc/PID/fd)
while other clients' requests finish unharmed. Waits are bounded by a number of polls, never timed."""
import concurrent.futures
import json
import os
import socket
import time

import pytest
import requests

from classic_server import ClassicServer, write_model_file
from hostile import GoodTraffic, closed_by_peer, connect, idle_engine, is_json_error, poll

def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture(scope="module")
def srv(start_server):
    return start_server("--idle-timeout-seconds", "3", "--request-timeout-seconds", "3", "--max-num-seqs", "8")


@pytest.fixture(scope="module")
def good(srv):
    name = srv.model_name()
    session = requests.Session()

    def one():
        r = session.post(srv.base_url + "/v1/chat/completions", timeout=120,
                         json={"model": name, "messages": [{"role": "user", "content": "Count to three."}],
                               "max_tokens": 4, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4

    with GoodTraffic(one, "good chat") as g:
        yield g
    assert not g.failures, g.failures


def stream_request(name, max_tokens=2000):
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": "Tell me a long story."}],
                       "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_disconnect_mid_stream_frees_kv(srv, good):
    name = srv.model_name()
    aborted = srv.metric("stoke:request_success_total", finished_reason="abort")
    for _ in range(3):
        before = good.ok
        s = connect(srv.port)
        s.sendall(stream_request(name))
        got = b""
        while got.count(b"data: ") < 4:
            got += s.recv(4096)
        assert srv.metric("stoke:kv_cache_blocks_used") > 0
        s.close()
        good.wait_past(before)
    poll(lambda: srv.metric("stoke:request_success_total", finished_reason="abort") >= aborted + 3, "3 aborts")
    poll(lambda: idle_engine(srv, waiting_too=False), "KV blocks back in the pool")


def test_disconnect_mid_body(srv, good):
    base = open_fds(srv.proc.pid)
    for _ in range(10):
        before = good.ok
        s = connect(srv.port)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n{\"messages\": [{\"role\": \"user\", \"content\": \"" + b"a" * 5000)
        s.close()
        good.wait_past(before)
    poll(lambda: open_fds(srv.proc.pid) <= base, "the server's descriptors back to the baseline")
    assert idle_engine(srv, waiting_too=False) or srv.metric("stoke:num_requests_running") <= 1  # only the good client's


def test_slow_reader_does_not_hold_others_up(srv, good):
    name = srv.model_name()
    s = connect(srv.port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(stream_request(name, max_tokens=400))
    got = b""
    before = good.ok
    for _ in range(5):  # one byte a second for five seconds
        got += s.recv(1)
        time.sleep(1)
    assert b"HTTP/1.1 200".startswith(got), got
    # Meanwhile the good client went on, and more requests finish while the slow one is still open.
    assert good.ok > before
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda i: requests.post(
            srv.base_url + "/v1/completions", timeout=120,
            json={"model": name, "prompt": f"Number {i}:", "max_tokens": 8, "ignore_eos": True}).status_code,
            range(8)))
    assert codes == [200] * 8
    s.close()
    poll(lambda: idle_engine(srv, waiting_too=False), "the slow reader's KV blocks back in the pool")


def test_half_open_connections_are_reaped(srv, good):
    base = open_fds(srv.proc.pid)
    silent = [connect(srv.port) for _ in range(50)]  # connect, send nothing
    half_request = []
    for _ in range(20):  # half a header, then silence
        s = connect(srv.port)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        half_request.append(s)
    # (No count of them held: with the 3 s timeouts, a loaded machine may reap the first before the last opens.)
    before = good.ok
    good.wait_past(before)  # others are served meanwhile
    # The idle timeout (3 s) closes the silent ones, the request timeout (3 s) the half requests. (The 408 the
    # server means to send then rarely arrives: the timed-out stream has closed the socket already.)
    for s in silent + half_request:
        assert closed_by_peer(s, timeout=60)
        s.close()
    # A client that half-closes after its request (shutdown(SHUT_WR)) while generation runs: it is taken as gone,
    # and what it held is freed.
    name = srv.model_name()
    for _ in range(3):
        s = connect(srv.port)
        s.sendall(stream_request(name))
        s.shutdown(socket.SHUT_WR)
        assert closed_by_peer(s, timeout=120)
        s.close()
    poll(lambda: open_fds(srv.proc.pid) <= base, "the server's descriptors back to the baseline")
    poll(lambda: idle_engine(srv, waiting_too=False) or srv.metric("stoke:num_requests_running") <= 1, "KV blocks freed")
    good.wait_past(good.ok)


def test_flood_past_max_waiting_gets_503_with_retry_after(start_server):
    flood = start_server("--max-waiting", "1", "--max-num-seqs", "1")
    name = flood.model_name()

    def post(i):
        r = requests.post(flood.base_url + "/v1/chat/completions", timeout=300,
                          json={"model": name, "messages": [{"role": "user", "content": f"Hi {i}"}],
                                "max_tokens": 24, "ignore_eos": True})
        return r.status_code, r.headers.get("Retry-After"), r.content

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(post, range(16)))
    codes = [c for c, _, _ in results]
    assert codes.count(200) >= 1 and codes.count(503) >= 1, codes
    assert codes.count(200) + codes.count(503) == 16, codes
    for code, retry_after, body in results:
        if code == 503:
            assert retry_after is not None and int(retry_after) >= 1
            assert json.loads(body)["error"]["code"] == "queue_full"
    poll(lambda: idle_engine(flood, waiting_too=False), "the flood's KV blocks freed")
    # After the flood the server serves normally.
    assert post(99)[0] == 200


def test_kserve_queue_full_gets_503_with_retry_after(stoke_bin, tmp_path):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException
    import numpy as np
    # One instance, batches of one, each taking 100 ms, and room for one waiting request.
    model = write_model_file(tmp_path, type="synthetic", name="slow", input_bytes=8, output_bytes=8, max_batch_size=1,
                             sleep_us=100000, dynamic_batching={"default_queue_policy": {"max_queue_size": 1}})
    srv = ClassicServer(stoke_bin, model, log_dir=tmp_path)
    try:
        body = {"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [1, 8], "data": list(range(8))}]}

        def post(_):
            r = requests.post(srv.base_url + "/v2/models/slow/infer", json=body, timeout=120)
            return r.status_code, r.headers.get("Retry-After"), r.content

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            results = list(pool.map(post, range(12)))
        codes = [c for c, _, _ in results]
        assert codes.count(200) >= 1 and codes.count(503) >= 1, codes
        assert codes.count(200) + codes.count(503) == 12, codes
        for code, retry_after, content in results:
            if code == 503:
                assert retry_after == "1" and is_json_error(content), content
        # gRPC: UNAVAILABLE for the overflow, OK for the rest.
        client = grpcclient.InferenceServerClient(url=srv.grpc_url)
        inp = grpcclient.InferInput("INPUT0", [1, 8], "UINT8")
        inp.set_data_from_numpy(np.arange(8, dtype=np.uint8).reshape(1, 8))

        def infer(_):
            try:
                client.infer("slow", [inp])
                return "OK"
            except InferenceServerException as e:
                return e.status()

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            statuses = list(pool.map(infer, range(12)))
        assert statuses.count("OK") >= 1 and statuses.count("StatusCode.UNAVAILABLE") >= 1, statuses
        assert statuses.count("OK") + statuses.count("StatusCode.UNAVAILABLE") == 12, statuses
        assert post(0)[0] == 200
    finally:
        assert srv.stop() == 0, srv.log()


def test_connection_flood_past_max_connections(start_server):
    capped = start_server("--max-connections", "20")
    # The server must have accepted all 20 before the 21st arrives, or the 21st takes a free slot and waits for a
    # request. A descriptor count cannot tell (the server's own descriptors come and go): each held connection
    # gets one keep-alive answer first, which proves it was accepted and counted, and then stays open. A slot is
    # freed when the server reads the client's close, so a connection closed just before (the readiness probe's)
    # may still hold one for a moment on a busy machine: a 503 then is tried again, until 20 are held.
    def hold_one():
        for _ in range(600):
            s = connect(capped.port)
            s.settimeout(60)
            s.sendall(b"GET /health/live HTTP/1.1\r\nHost: stoke\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(4096)
                assert chunk, data
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            if head.startswith(b"HTTP/1.1 503"):
                s.close()
                time.sleep(0.05)
                continue
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(body) < length:
                body += s.recv(4096)
            return s
        raise AssertionError("a held connection never got a slot (600 tries)")

    held = [hold_one() for _ in range(20)]
    refused = 0
    for _ in range(30):  # more clients than the cap: 503 + Retry-After, then closed
        s = connect(capped.port)
        s.settimeout(30)
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        s.close()
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head, data
        assert is_json_error(body), body
        refused += 1
    assert refused == 30
    for s in held:
        s.close()
    # Room again once the held ones are gone.
    poll(lambda: requests.get(capped.base_url + "/health/live", timeout=30).status_code == 200, "a free slot")
