"""stoke's GGUF reader and GGML (de)quantisers against the `gguf` package (gguf-py, llama.cpp's own Python side).

gguf-py writes GGUF files (v3, and v2 by patching the version field) with metadata of every value type and one
tensor of each type stoke supports; stoke's reader, driven through tests/tools/gguf_golden_tool, must report the
same metadata and dequantise every tensor bit-exactly like gguf.quants.dequantize (whose operation order is
ggml's). Quantised bytes from stoke's reference quantisers must equal gguf.quants.quantize's.

Env: STOKE_BUILD_DIR (default build/release) holds tests/tools/gguf_golden_tool.
"""
import json
import math
import pathlib
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402

from conftest import build_dir  # noqa: E402

RNG_SEED = 20240601


@pytest.fixture(scope="session")
def tool() -> pathlib.Path:
    p = build_dir() / "tests" / "tools" / "gguf_golden_tool"
    if not p.exists():
        pytest.fail(f"{p} not built (cmake --build {build_dir()} --target gguf_golden_tool)")
    return p


def run_dump(tool, path, outdir=None, tensors=None):
    args = [str(tool), "dump", str(path)]
    if outdir is not None:
        args.append(str(outdir))
    if tensors:
        args += ["--tensors", ",".join(tensors)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# ---- metadata ------------------------------------------------------------------------------------------------

# key -> (GGUF type name, value type for gguf-py, value, array sub-type)
SCALARS = {
    "t.u8": ("u8", V.UINT8, 255),
    "t.i8": ("i8", V.INT8, -128),
    "t.u16": ("u16", V.UINT16, 65535),
    "t.i16": ("i16", V.INT16, -32768),
    "t.u32": ("u32", V.UINT32, 2**32 - 1),
    "t.i32": ("i32", V.INT32, -(2**31)),
    "t.f32": ("f32", V.FLOAT32, float(np.float32(3.14159))),
    "t.u64": ("u64", V.UINT64, 2**64 - 1),
    "t.i64": ("i64", V.INT64, -(2**63)),
    "t.f64": ("f64", V.FLOAT64, math.pi),
    "t.true": ("bool", V.BOOL, True),
    "t.false": ("bool", V.BOOL, False),
    "t.str": ("string", V.STRING, "héllo ✓ 日本 \n\t\"quoted\""),
    "t.empty_str": ("string", V.STRING, ""),
}
ARRAYS = {
    "a.u8": ("u8", V.UINT8, [0, 1, 255]),
    "a.i8": ("i8", V.INT8, [-128, 0, 127]),
    "a.u16": ("u16", V.UINT16, [0, 65535]),
    "a.i16": ("i16", V.INT16, [-32768, 32767]),
    "a.u32": ("u32", V.UINT32, [0, 2**32 - 1]),
    "a.i32": ("i32", V.INT32, [1, -2, 3]),
    "a.f32": ("f32", V.FLOAT32, [0.5, -1.25, float(np.float32(0.1))]),
    "a.u64": ("u64", V.UINT64, [2**64 - 1, 0]),
    "a.i64": ("i64", V.INT64, [-(2**63), 2**63 - 1]),
    "a.f64": ("f64", V.FLOAT64, [1e300, -2.5]),
    "a.bool": ("bool", V.BOOL, [True, False, True]),
    "a.str": ("string", V.STRING, ["a", "", "Ġthe", "日本"]),
}
NESTED = {
    "n.ints": [[1, 2], [3]],
    "n.strs": [["a"], ["b", "c"]],
    "n.deep": [[[1], [2, 3]], [[4]]],
}


def add_metadata(w):
    for key, (_, vtype, value) in SCALARS.items():
        w.add_key_value(key, value, vtype)
    for key, (_, sub, value) in ARRAYS.items():
        w.add_key_value(key, value, V.ARRAY, sub_type=sub)
    for key, value in NESTED.items():
        w.add_key_value(key, value, V.ARRAY)


def check_metadata(dump, path):
    meta = {m["key"]: m for m in dump["metadata"]}
    for key, (tname, _, value) in SCALARS.items():
        assert meta[key]["type"] == tname, key
        if tname == "f32":
            assert np.float32(meta[key]["value"]) == np.float32(value), key
        else:
            assert meta[key]["value"] == value, key
    for key, (tname, _, value) in ARRAYS.items():
        assert meta[key]["type"] == "array" and meta[key]["elem_type"] == tname, key
        if tname == "f32":
            assert np.array_equal(np.float32(meta[key]["value"]), np.float32(value)), key
        else:
            assert meta[key]["value"] == value, key
    for key, value in NESTED.items():
        assert meta[key]["type"] == "array" and meta[key]["elem_type"] == "array", key
        assert meta[key]["value"] == value, key
    compare_with_gguf_reader(dump, path)


def compare_with_gguf_reader(dump, path):
    """Every non-nested key: same order, type and value as gguf-py's GGUFReader."""
    reader = gguf.GGUFReader(str(path))
    fields = [f for f in reader.fields.values() if not f.name.startswith("GGUF.")]
    assert [m["key"] for m in dump["metadata"]] == [f.name for f in fields]
    names = {V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16", V.UINT32: "u32", V.INT32: "i32",
             V.FLOAT32: "f32", V.BOOL: "bool", V.STRING: "string", V.ARRAY: "array", V.UINT64: "u64",
             V.INT64: "i64", V.FLOAT64: "f64"}
    for m, f in zip(dump["metadata"], fields):
        assert m["type"] == names[f.types[0]], f.name
        if f.types[0] == V.ARRAY:
            assert m["elem_type"] == names[f.types[1]], f.name
            if f.types[1] == V.ARRAY:
                continue  # gguf-py's reader flattens nested arrays
        want = f.contents()
        if f.types[-1] == V.FLOAT32:
            assert np.array_equal(np.float32(m["value"]), np.float32(want)), f.name
        else:
            assert m["value"] == want, f.name


# ---- tensors -------------------------------------------------------------------------------------------------


def random_k_blocks(rng, qtype, n_blocks):
    """Random but valid K-quant blocks: random bits with finite, moderate fp16 scales."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)

    def halves(n):
        return (rng.standard_normal(n) * 0.01).astype(np.float16).view(np.uint8).reshape(n, 2)

    if qtype == Q.Q4_K:  # d, dmin first
        raw[:, 0:2] = halves(n_blocks)
        raw[:, 2:4] = halves(n_blocks)
    elif qtype == Q.Q6_K:  # d last
        raw[:, 208:210] = halves(n_blocks)
    return raw


def special_floats(n, dtype):
    """Values that exercise conversions: zeros, infinities, subnormals, extremes, a NaN."""
    info = np.finfo(dtype) if dtype != "bf16" else None
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -2.5]
    if info is not None:
        vals += [float(info.tiny), float(info.tiny) / 4, float(info.max), -float(info.max)]
    else:
        vals += [1e-40, 3e38, -1.17e-38]  # bf16 keeps fp32's exponent range, subnormals included
    return np.array((vals * n)[:n], dtype=np.float32)


def make_tensors(rng):
    """name -> (ggml type, gguf-py payload, shape outermost-first)."""
    out = {}
    for qtype, shape in [(Q.Q4_0, (3, 64)), (Q.Q4_1, (3, 64)), (Q.Q5_0, (2, 96)), (Q.Q5_1, (2, 96)),
                         (Q.Q8_0, (2, 3, 64)), (Q.BF16, (4, 40))]:
        data = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        data.reshape(-1)[:3] = 0.0  # a few exact zeros
        if qtype == Q.BF16:
            data.reshape(-1)[-11:] = special_floats(11, "bf16")
        out[f"t.{qtype.name.lower()}"] = (qtype, gguf.quants.quantize(data, qtype), shape)
    f32 = rng.standard_normal((5, 7)).astype(np.float32)
    f32.reshape(-1)[:11] = special_floats(11, np.float32)
    out["t.f32"] = (Q.F32, f32, (5, 7))
    f16 = (rng.standard_normal((6, 8)) * 100).astype(np.float16)
    f16.reshape(-1)[:11] = special_floats(11, np.float16).astype(np.float16)
    out["t.f16"] = (Q.F16, f16, (6, 8))
    out["t.norm"] = (Q.F32, rng.standard_normal(576).astype(np.float32), (576,))
    for qtype in (Q.Q4_K, Q.Q6_K):
        rows, cols = 3, 512
        raw = random_k_blocks(rng, qtype, rows * cols // 256).reshape(rows, -1)
        out[f"t.{qtype.name.lower()}"] = (qtype, raw, (rows, cols))
    return out


def write_gguf(path, tensors, alignment=None, version=3):
    w = gguf.GGUFWriter(str(path), arch="llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    add_metadata(w)
    w.add_quantization_version(2)
    for name, (qtype, payload, _) in tensors.items():
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(name, payload)
        else:
            w.add_tensor(name, payload, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version != 3:
        b = bytearray(path.read_bytes())
        b[4:8] = version.to_bytes(4, "little")
        path.write_bytes(bytes(b))


def check_tensors(dump, path, outdir, tensors=None):
    """Every tensor: same name/type/shape as GGUFReader and dequantised values bit-equal to gguf.quants."""
    reader = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in reader.tensors}
    assert [t["name"] for t in dump["tensors"]] == [t.name for t in reader.tensors]
    checked = 0
    for t in dump["tensors"]:
        rt = by_name[t["name"]]
        assert t["ggml_type"] == int(rt.tensor_type), t["name"]
        assert t["shape"] == [int(d) for d in reversed(rt.shape.tolist())], t["name"]
        assert t["nbytes"] == int(rt.n_bytes), t["name"]
        if tensors is not None and t["name"] not in tensors:
            continue
        ours = np.fromfile(outdir / f"{t['index']}.f32", dtype=np.float32)
        ref = np.ascontiguousarray(gguf.quants.dequantize(rt.data, rt.tensor_type), dtype=np.float32).reshape(-1)
        assert ours.shape == ref.shape, t["name"]
        diff = np.flatnonzero(ours.view(np.uint32) != ref.view(np.uint32))
        assert diff.size == 0, (f"{t['name']} ({rt.tensor_type.name}): {diff.size} values differ, first at "
                                f"{diff[0]}: ours {ours[diff[0]]!r} ref {ref[diff[0]]!r}")
        checked += 1
    return checked


@pytest.mark.parametrize("version", [3, 2])
def test_synthetic_file_matches_gguf_py(tool, tmp_path, version):
    rng = np.random.default_rng(RNG_SEED + version)
    tensors = make_tensors(rng)
    path = tmp_path / f"synthetic_v{version}.gguf"
    write_gguf(path, tensors, version=version)
    out = tmp_path / "out"
    out.mkdir()
    dump = run_dump(tool, path, out)
    assert dump["version"] == version
    assert dump["alignment"] == 32
    assert dump["data_offset"] % 32 == 0
    check_metadata(dump, path)
    assert check_tensors(dump, path, out) == len(tensors)
    types = {t["dtype"] for t in dump["tensors"]}
    assert types == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K"}


def test_custom_alignment(tool, tmp_path):
    rng = np.random.default_rng(RNG_SEED)
    tensors = make_tensors(rng)
    path = tmp_path / "aligned.gguf"
    write_gguf(path, tensors, alignment=256)
    out = tmp_path / "out"
    out.mkdir()
    dump = run_dump(tool, path, out)
    assert dump["alignment"] == 256
    assert dump["data_offset"] % 256 == 0
    assert check_tensors(dump, path, out) == len(tensors)


def test_broken_files_fail_with_a_message(tool, tmp_path):
    rng = np.random.default_rng(RNG_SEED)
    path = tmp_path / "ok.gguf"
    write_gguf(path, make_tensors(rng))
    data = path.read_bytes()
    cases = {
        "v1.gguf": (data[:4] + (1).to_bytes(4, "little") + data[8:], "v1 is not supported"),
        "swapped.gguf": (data[:4] + (3).to_bytes(4, "big") + data[8:], "byte-swapped"),
        "cut.gguf": (data[: len(data) // 2], "DATA_LOSS"),
        "tiny.gguf": (data[:10], "truncated GGUF header"),
    }
    for name, (content, message) in cases.items():
        p = tmp_path / name
        p.write_bytes(content)
        r = subprocess.run([str(tool), "dump", str(p)], capture_output=True, text=True)
        assert r.returncode == 1, name
        assert message in r.stderr and name in r.stderr, (name, r.stderr)


# ---- quantisers ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1])
def test_reference_quantisers_match_gguf_py(tool, tmp_path, qtype):
    rng = np.random.default_rng(RNG_SEED + int(qtype))
    rows = [
        rng.standard_normal(32 * 64),
        rng.standard_normal(32 * 8) * 1e-3,
        np.zeros(32),
        np.full(32, 0.75),  # constant block: d = 0 for Q4_1/Q5_1
        np.linspace(-1, 1, 32 * 4),  # many values on exact grid points and ties
        np.tile(np.arange(-16, 16), 2) * 0.5,
    ]
    x = np.concatenate(rows).astype(np.float32)
    src, dst = tmp_path / "x.f32", tmp_path / "q.bin"
    x.tofile(src)
    r = subprocess.run([str(tool), "quantize", qtype.name, str(src), str(dst)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = np.fromfile(dst, dtype=np.uint8)
    ref = gguf.quants.quantize(x, qtype).reshape(-1)
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    bad = np.flatnonzero((ours != ref).reshape(-1, type_size).any(axis=1))
    assert bad.size == 0, f"{qtype.name}: {bad.size} blocks differ, first #{bad[0]}"


# ---- the real model ------------------------------------------------------------------------------------------


def test_real_smollm2(tool, tmp_path, smollm2_path):
    out = tmp_path / "out"
    out.mkdir()
    names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.29.ffn_down.weight",
             "blk.0.attn_norm.weight", "output_norm.weight"]
    dump = run_dump(tool, smollm2_path, out, tensors=names)
    assert dump["version"] == 3
    assert len(dump["tensors"]) == 272
    compare_with_gguf_reader(dump, smollm2_path)
    assert check_tensors(dump, smollm2_path, out, tensors=set(names)) == len(names)
