"""stoke's safetensors reader against the reference implementation (huggingface/safetensors, PyPI `safetensors`).

1. Files written by the official writer read back with the same tensors, dtypes and byte counts.
2. On hand-made edge cases (valid and malformed) stoke accepts exactly the files the reference accepts.
stoke is driven through `stoke model inspect --json` on a folder holding config.json + model.safetensors.
"""
import json
import os
import struct
import subprocess

import pytest

np = pytest.importorskip("numpy")
safetensors = pytest.importorskip("safetensors")
from safetensors.numpy import save_file  # noqa: E402


def stoke_inspect(stoke_bin, folder):
    r = subprocess.run([str(stoke_bin), "model", "inspect", str(folder), "--json"], capture_output=True, text=True,
                       timeout=60)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else None), r.stderr


def reference_accepts(path):
    try:
        with safetensors.safe_open(str(path), "np") as f:
            for k in f.keys():
                f.get_tensor(k)
        return True
    except Exception:  # noqa: BLE001 - any refusal counts
        return False


def make_folder(tmp_path, name, data: bytes):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "golden-test"}')
    (folder / "model.safetensors").write_bytes(data)
    return folder


DTYPES = {  # numpy dtype -> safetensors / stoke name
    np.bool_: "BOOL", np.uint8: "U8", np.int8: "I8", np.uint16: "U16", np.int16: "I16", np.uint32: "U32",
    np.int32: "I32", np.uint64: "U64", np.int64: "I64", np.float16: "F16", np.float32: "F32", np.float64: "F64",
}


def test_official_writer_files_read_back(stoke_bin, tmp_path):
    rng = np.random.default_rng(1234)
    tensors = {}
    for i, (dt, _) in enumerate(DTYPES.items()):
        shape = [(3, 5), (7,), (2, 3, 4), (0, 4), (1,)][i % 5]
        tensors[f"layer.{i}.weight"] = (rng.standard_normal(shape) * 10).astype(dt)
    tensors["scalar"] = np.array(3.5, dtype=np.float32)
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path), metadata={"format": "np", "note": "golden"})
    folder = make_folder(tmp_path, "official", path.read_bytes())
    rc, j, err = stoke_inspect(stoke_bin, folder)
    assert rc == 0, err
    assert j["tensors"] == len(tensors)
    expect = {}
    for t in tensors.values():
        e = expect.setdefault(DTYPES[t.dtype.type], {"tensors": 0, "values": 0, "bytes": 0})
        e["tensors"] += 1
        e["values"] += t.size
        e["bytes"] += t.nbytes
    got = {t["dtype"]: {k: t[k] for k in ("tensors", "values", "bytes")} for t in j["tensor_types"]}
    assert got == expect
    floats = sum(t.size for t in tensors.values() if t.dtype.kind == "f")
    assert j["parameters"] == floats
    assert j["weights_size"] == path.stat().st_size


def pack(header, data=b"", pad=0):
    h = json.dumps(header, separators=(",", ":")).encode() + b" " * pad
    return struct.pack("<Q", len(h)) + h + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


D24 = bytes(range(24))
CASES = {
    # valid
    "plain": pack({"w": entry("F32", [2, 3], 0, 24)}, D24),
    "space_padded_header": pack({"w": entry("F32", [6], 0, 24)}, D24, pad=7),
    "metadata": pack({"__metadata__": {"format": "pt"}, "w": entry("F32", [6], 0, 24)}, D24),
    "offsets_listed_out_of_order": pack({"b": entry("F32", [3], 12, 24), "a": entry("F32", [3], 0, 12)}, D24),
    "empty_tensor": pack({"e": entry("F16", [0, 8], 0, 0), "w": entry("U8", [24], 0, 24)}, D24),
    "scalar": pack({"s": entry("F64", [], 0, 8)}, D24[:8]),
    "no_tensors": pack({}),
    # malformed
    "truncated_data": pack({"w": entry("F32", [6], 0, 24)}, D24[:23]),
    "trailing_bytes": pack({"w": entry("F32", [4], 0, 16)}, D24),
    "hole": pack({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 16, 24)}, D24),
    "overlap": pack({"a": entry("F32", [4], 0, 16), "b": entry("F32", [4], 8, 24)}, D24),
    "size_mismatch": pack({"w": entry("F32", [5], 0, 24)}, D24),
    "end_before_begin": pack({"w": entry("F32", [0], 24, 0)}, D24),
    "negative_dim": pack({"w": entry("F32", [-6], 0, 24)}, D24),
    "unknown_dtype": pack({"w": entry("Q4_0", [6], 0, 24)}, D24),
    "header_not_object": struct.pack("<Q", 5) + b"[1,2]",
    "header_past_end": struct.pack("<Q", 1000) + b"{}",
    "header_over_limit": struct.pack("<Q", 100_000_001) + b"{}",
    "short_file": b"\x02\x00\x00",
    "bad_json": struct.pack("<Q", 5) + b"{nope",
    "metadata_not_strings": pack({"__metadata__": {"n": 1}, "w": entry("F32", [6], 0, 24)}, D24),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_accepts_what_the_reference_accepts(stoke_bin, tmp_path, name):
    data = CASES[name]
    folder = make_folder(tmp_path, name, data)
    ref = reference_accepts(folder / "model.safetensors")
    rc, _, err = stoke_inspect(stoke_bin, folder)
    assert (rc == 0) == ref, f"reference {'accepts' if ref else 'rejects'}, stoke exit {rc}: {err}"
    if rc != 0:
        assert rc == 1
        assert str(folder / "model.safetensors") in err
