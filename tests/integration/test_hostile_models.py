"""Hostile model files, made here byte by byte: GGUF files and safetensors (in an HF folder beside MiniLM's config and
tokenizer) with sizes that overflow, offsets past the end, duplicate names, absurd dimensions, bad magic and
truncation. Each must fail `stoke model inspect` and `stoke generate` / `stoke embed` with an error naming the
problem: a clean exit code (not a signal), the problem in stderr, and no huge allocation (the child's peak RSS)."""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading

import pytest

MAX_RSS_KB = 1 << 20  # 1 GiB: far above what stoke needs to refuse a file, far below what the lies ask for

GGUF_STRING, GGUF_U32, GGUF_ARRAY = 8, 4, 9
F32 = 0


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv_string(key, value):
    return gstr(key) + struct.pack("<I", GGUF_STRING) + gstr(value)


def tensor_info(name, dims, ggml_type=F32, offset=0):
    return gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", ggml_type, offset)


def gguf(kvs=None, tensors=None, data=b"\0" * 64, magic=b"GGUF", version=3, n_tensors=None, n_kv=None):
    kvs = [kv_string("general.architecture", "llama")] if kvs is None else kvs
    tensors = [tensor_info("token_embd.weight", [4, 4])] if tensors is None else tensors
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    body += b"\0" * (-len(body) % 32)
    return body + data


GGUF_CASES = [
    # (name, bytes, fragment of the error)
    ("bad magic", gguf(magic=b"GGUX"), "neither a GGUF file"),
    ("ten bytes", gguf()[:10], "truncated GGUF header"),
    ("header cut short", gguf()[:40], "cannot fit"),
    ("version 99", gguf(version=99), "unsupported GGUF version 99"),
    ("tensor_count 2**63", gguf(n_tensors=1 << 63), "tensor_count"),
    ("metadata_kv_count 2**62", gguf(n_kv=1 << 62), "metadata_kv_count"),
    ("key length 2**64 - 1", gguf(kvs=[struct.pack("<Q", (1 << 64) - 1) + b"general.architecture"]), "length"),
    ("string value length 2**63", gguf(kvs=[gstr("general.architecture") + struct.pack("<IQ", GGUF_STRING, 1 << 63)]),
     "length"),
    ("array of 2**62 u32", gguf(kvs=[kv_string("general.architecture", "llama"), gstr("x.arr") +
                                     struct.pack("<IIQ", GGUF_ARRAY, GGUF_U32, 1 << 62)]), "exceeds remaining"),
    ("unknown metadata type", gguf(kvs=[gstr("x.k") + struct.pack("<I", 77) + b"\0" * 8]), "unknown"),
    ("duplicate metadata key", gguf(kvs=[kv_string("general.architecture", "llama")] * 2), "duplicate key"),
    ("alignment 3", gguf(kvs=[kv_string("general.architecture", "llama"),
                              gstr("general.alignment") + struct.pack("<II", GGUF_U32, 3)]), "not a power of two"),
    ("n_dims 100", gguf(tensors=[tensor_info("t", [1] * 100)]), "n_dims 100"),
    ("dimensions whose product overflows", gguf(tensors=[tensor_info("t", [1 << 40, 1 << 40])]), "overflows"),
    ("dimension 2**63", gguf(tensors=[tensor_info("t", [1 << 63])]), "out of range"),
    ("unknown ggml type", gguf(tensors=[tensor_info("t", [4, 4], ggml_type=999)]), "ggml type"),
    ("tensor offset past the end", gguf(tensors=[tensor_info("t", [4, 4], offset=1 << 40)]), "offset"),
    ("tensor data past the end", gguf(tensors=[tensor_info("t", [1 << 20, 4])]), "runs past end of file"),
    ("duplicate tensor names", gguf(tensors=[tensor_info("t", [4]), tensor_info("t", [4], offset=32)]),
     "duplicate tensor name"),
]


# The child is started by a small Python of its own: the kernel carries the peak RSS of the process that
# forked (or vforked) a child into the child's own maxrss at exec, and the pytest process itself grows past
# MAX_RSS_KB over a full run (the golden tests load models into it).
_WRAP = r"""
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write(f"\n@@child {os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}\n")
"""


def run(args, timeout=120):
    """Runs stoke; returns (exit code, negative for a signal; stderr; the child's own peak RSS in KiB)."""
    p = subprocess.Popen([sys.executable, "-c", _WRAP, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    timer = threading.Timer(timeout, lambda: os.killpg(p.pid, signal.SIGKILL))  # a hang ends as a signal
    timer.start()
    try:
        err = p.stderr.read().decode(errors="replace")
        p.wait()
    finally:
        timer.cancel()
        p.stderr.close()
    head, sep, tail = err.rpartition("\n@@child ")
    if not sep:  # the wrapper itself was killed
        return -signal.SIGKILL, err, 0
    code, rss = (int(x) for x in tail.split())
    return code, head, rss


def check_refused(code, err, rss, fragment, what):
    assert code is not None and 0 < code < 128, (what, code, err)  # an error exit, not a signal
    assert fragment.lower() in err.lower(), (what, fragment, err)
    assert "terminate called" not in err and "Sanitizer" not in err, (what, err)
    assert rss < MAX_RSS_KB, (what, rss)


@pytest.mark.parametrize("name,data,fragment", GGUF_CASES, ids=[c[0] for c in GGUF_CASES])
def test_hostile_gguf(stoke_bin, tmp_path, name, data, fragment):
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    for args in (["model", "inspect", str(path)],
                 ["generate", "--model", str(path), "--prompt", "hi", "--max-tokens", "1"]):
        code, err, rss = run([str(stoke_bin), *args])
        check_refused(code, err, rss, fragment, (name, args[0]))


def safetensors(header, data=b"", header_len=None):
    h = json.dumps(header).encode() if isinstance(header, dict) else header
    return struct.pack("<Q", len(h) if header_len is None else header_len) + h + data


def entry(dtype="F32", shape=(2, 2), offsets=(0, 16)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


ST_CASES = [
    ("three bytes", b"\x01\x02\x03", "too short"),
    ("header length 2**63", safetensors({}, header_len=1 << 63), "over the"),
    ("header past the end", safetensors({"t": entry()}, header_len=1 << 20), "past the end"),
    ("header not JSON", safetensors(b"{not json}"), "not valid JSON"),
    ("header a JSON list", safetensors(b"[1, 2]"), "not a JSON object"),
    ("data_offsets past the end", safetensors({"t": entry(offsets=(0, 1 << 40))}, b"\0" * 16), "data_offsets"),
    ("data_offsets reversed", safetensors({"t": entry(offsets=(16, 0))}, b"\0" * 16), "end before they begin"),
    ("shape and byte count disagree", safetensors({"t": entry(shape=(4, 4))}, b"\0" * 16), "needs"),
    ("unknown dtype", safetensors({"t": entry(dtype="F128")}, b"\0" * 16), "F128"),
    ("negative dimension", safetensors({"t": entry(shape=(-2, 2))}, b"\0" * 16), "negative"),
    ("dimensions whose product overflows", safetensors({"t": entry(shape=(1 << 40, 1 << 40))}, b"\0" * 16),
     "overflows"),
    ("overlapping tensors", safetensors({"a": entry(), "b": entry(offsets=(8, 24))}, b"\0" * 24), "data_offsets"),
    ("duplicate tensor names", safetensors(b'{"t": ' + json.dumps(entry()).encode() + b', "t": ' +
                                           json.dumps(entry(offsets=(16, 32))).encode() + b"}", b"\0" * 32),
     "duplicate tensor name"),
]


@pytest.mark.parametrize("name,data,fragment", ST_CASES, ids=[c[0] for c in ST_CASES])
def test_hostile_safetensors(stoke_bin, minilm_path, tmp_path, name, data, fragment):
    folder = tmp_path / "model"
    folder.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (minilm_path / f).exists():
            shutil.copy(minilm_path / f, folder / f)
    (folder / "model.safetensors").write_bytes(data)
    for args in (["model", "inspect", str(folder)], ["embed", "--model", str(folder), "hello"]):
        code, err, rss = run([str(stoke_bin), *args])
        check_refused(code, err, rss, fragment, (name, args[0]))
