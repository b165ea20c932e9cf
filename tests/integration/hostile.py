"""Helpers for the hostile-input and client-fault tests: raw HTTP over sockets, and a well-behaved client that keeps
sending good requests from its own connection while the hostile cases run.

  with GoodTraffic(send_one) as good:        # send_one() -> None, raises on any failure
      before = good.ok
      ... a hostile case ...
      good.wait_past(before)                 # a good request completed after the case started
  assert not good.failures
"""
import json
import socket
import threading
import time

import pytest


class GoodTraffic:
    """Calls `send_one` in a loop on its own thread until stopped; counts successes, keeps failures."""

    def __init__(self, send_one, name="good"):
        self.send_one = send_one
        self.name = name
        self.ok = 0
        self.failures = []
        self._stop = threading.Event()
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.send_one()
                with self._cv:
                    self.ok += 1
                    self._cv.notify_all()
            except Exception as e:  # noqa: BLE001 - every failure is recorded and asserted on
                with self._cv:
                    self.failures.append(repr(e))
                    self._cv.notify_all()
                time.sleep(0.05)

    def wait_past(self, before, timeout=120):
        """Waits until a good request completed after `before` was read (fails only on a hang)."""
        deadline = time.time() + timeout
        with self._cv:
            while self.ok <= before and not self.failures:
                left = deadline - time.time()
                if left <= 0:
                    raise AssertionError(f"{self.name}: no good request completed within {timeout} s")
                self._cv.wait(left)
        assert not self.failures, f"{self.name}: a good request failed: {self.failures}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=300)


def connect(port, timeout=60):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-case names
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"Response({self.status}, {self.headers}, {self.body[:300]!r})"


class Reader:
    """Reads HTTP/1.1 responses off a socket (Content-Length or chunked bodies)."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("connection closed by the server")
        self.buf += data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self):
        while True:
            status_line = self._line()
            parts = status_line.split(b" ", 2)
            status = int(parts[1])
            headers = {}
            while True:
                line = self._line()
                if not line:
                    break
                k, v = line.split(b":", 1)
                headers[k.decode().strip().lower()] = v.decode().strip()
            if status != 100:
                break
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int(self._line(), 16)
                if size == 0:
                    while self._line():
                        pass
                    break
                body += self._exact(size)
                self._exact(2)
        else:
            body = self._exact(int(headers.get("content-length", "0")))
        return Response(status, headers, body)


def exchange(port, data, timeout=60):
    """Sends raw bytes on a fresh connection and reads one response."""
    with connect(port, timeout) as s:
        s.sendall(data)
        return Reader(s).response()


def closed_by_peer(sock, timeout=30):
    """True once the server has closed `sock` (EOF or reset), reading and discarding what it sends."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def is_json_error(body):
    """The body is JSON holding an error message (OpenAI's {"error": {"message"}} or KServe's {"error": str})."""
    j = json.loads(body)
    err = j.get("error")
    if isinstance(err, dict):
        return isinstance(err.get("message"), str) and err["message"] != ""
    return isinstance(err, str) and err != ""


POLLS = 600  # x 0.05 s: generous, only a hang runs out


def poll(pred, what, polls=POLLS):
    """Waits until pred() holds, checking every 50 ms; fails the test naming `what` after `polls` checks."""
    for _ in range(polls):
        if pred():
            return
        time.sleep(0.05)
    pytest.fail(f"still waiting for {what} after {polls} polls")


def idle_engine(srv, waiting_too=True):
    """The decoder holds no KV block and runs no request (and, with waiting_too, queues none): from /metrics."""
    idle = srv.metric("stoke:kv_cache_blocks_used") == 0 and srv.metric("stoke:num_requests_running") == 0
    return idle and (not waiting_too or srv.metric("stoke:num_requests_waiting") == 0)
