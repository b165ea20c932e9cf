"""Shutdown of a decoder and of a synthetic model: SIGTERM or SIGINT lets an in-flight request finish (the drain),
new connections are refused once the listener has closed (connection refused: stoke closes the listener first, so
there is no window answering 503; HTTP and gRPC drain at once, so an open gRPC stream does not keep HTTP
accepting), and the process exits 0; a second signal during the drain exits at once with 128 + signo."""
import json
import signal
import socket
import threading
import time

import numpy as np
import pytest
import requests

from classic_server import ClassicServer, write_model_file


def wait_for(pred, what, polls=1200):
    for _ in range(polls):
        if pred():
            return
        time.sleep(0.05)
    pytest.fail(f"still waiting for {what}")


def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return False
    except OSError:
        return True


def stream_in_background(srv, max_tokens):
    name = srv.model_name()
    result = {"lines": []}

    def run():
        body = {"model": name, "prompt": "Tell me a story.", "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}
        try:
            with requests.post(srv.base_url + "/v1/completions", json=body, stream=True, timeout=300) as r:
                for line in r.iter_lines():
                    if line:
                        result["lines"].append(line)
        except requests.RequestException as e:
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    wait_for(lambda: srv.metric("stoke:num_requests_running") >= 1 and len(result["lines"]) >= 2,
             "the generation to stream")
    return t, result


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGINT])
def test_drain_finishes_in_flight_and_refuses_new(start_server, signo):
    srv = start_server("--drain-seconds", "120")
    t, result = stream_in_background(srv, max_tokens=120)
    srv.proc.send_signal(signo)
    wait_for(lambda: "draining" in srv.log(), "the drain to start")
    # While the generation drains, new clients are refused at the TCP level.
    assert refused(srv.port)
    t.join(timeout=300)
    assert srv.proc.wait(timeout=120) == 0
    assert "error" not in result, result
    assert result["lines"][-1] == b"data: [DONE]"
    assert json.loads(result["lines"][-2][len(b"data: "):])["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGINT])
def test_second_signal_exits_at_once(start_server, signo):
    srv = start_server("--drain-seconds", "600")
    t, result = stream_in_background(srv, max_tokens=4000)  # would take minutes to drain
    srv.proc.send_signal(signo)
    wait_for(lambda: "draining" in srv.log(), "the drain to start")
    srv.proc.send_signal(signo)
    assert srv.proc.wait(timeout=60) == 128 + signo
    assert "second signal" in srv.log()
    t.join(timeout=60)
    assert not t.is_alive()
    assert b"data: [DONE]" not in result["lines"]  # cut short, as asked


def open_grpc_stream(srv):
    """A KServe gRPC stream that has answered once and stays open (a client that never hangs up)."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    import queue
    results = queue.Queue()
    client = grpcclient.InferenceServerClient(url=srv.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inp = grpcclient.InferInput("INPUT0", [1, 8], "UINT8")
    inp.set_data_from_numpy(np.arange(8, dtype=np.uint8).reshape(1, 8))
    client.async_stream_infer("slow", [inp])
    result, error = results.get(timeout=60)
    assert error is None, error
    return client


def test_classic_drain_and_second_signal(stoke_bin, tmp_path):
    # Each request holds its instance for 1.5 s: one is in flight when SIGTERM arrives and must still answer.
    model = write_model_file(tmp_path, type="synthetic", name="slow", input_bytes=8, output_bytes=8,
                             max_batch_size=1, sleep_us=1500000)
    body = {"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [1, 8], "data": list(range(8))}]}
    for second in (False, True):
        log_dir = tmp_path / f"run{int(second)}"
        log_dir.mkdir()
        srv = ClassicServer(stoke_bin, model, "--drain-seconds", "120", log_dir=log_dir)
        out = []

        def post():
            try:
                out.append(requests.post(srv.base_url + "/v2/models/slow/infer", json=body, timeout=120).status_code)
            except requests.RequestException as e:
                out.append(repr(e))

        stream = None if second else open_grpc_stream(srv)
        dispatched = srv.metric("stoke:batch_close_total")
        threads = [threading.Thread(target=post) for _ in range(2)]
        for t in threads:
            t.start()
        # One request executes (its batch dispatched) and the other waits in the queue: both are inside the
        # server. (A queued request alone is not enough: the second client may not have arrived yet.)
        wait_for(lambda: srv.metric("stoke:batch_close_total") >= dispatched + 1
                 and srv.metric("stoke:inference_pending_request_count") >= 1, "one request running, one queued")
        srv.proc.send_signal(signal.SIGTERM)
        if second:
            wait_for(lambda: "draining" in srv.log(), "the drain to start")
            srv.proc.send_signal(signal.SIGTERM)
            assert srv.proc.wait(timeout=60) == 128 + signal.SIGTERM
        else:
            # gRPC and HTTP drain at once: the open gRPC stream does not keep the HTTP listener accepting.
            wait_for(lambda: refused(srv.port), "the HTTP listener to close while a gRPC stream is open")
            stream.stop_stream()
            assert srv.proc.wait(timeout=120) == 0
            assert refused(srv.port)
        for t in threads:
            t.join(timeout=120)
        if not second:
            assert out == [200, 200], out
        srv._log.close()
