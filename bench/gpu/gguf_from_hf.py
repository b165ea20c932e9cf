#!/usr/bin/env python3
"""Convert a Llama-family HF folder (stoke model synth's output, or any bf16/f16/f32 safetensors Llama) into a
GGUF that llama.cpp and stoke load: llama tensor names, llama.* metadata, and a tokenizer.

  python3 bench/gpu/gguf_from_hf.py SYNTH_DIR OUT.gguf [--vocab auto|hf|dummy]

Tensors: model.embed_tokens -> token_embd, layers.N.self_attn.{q,k,v,o}_proj -> blk.N.attn_{q,k,v,output},
mlp.{gate,up,down}_proj -> blk.N.ffn_{gate,up,down}, input_layernorm -> blk.N.attn_norm,
post_attention_layernorm -> blk.N.ffn_norm, model.norm -> output_norm, lm_head -> output (absent when the
embeddings are tied). q_proj and k_proj rows are permuted as llama.cpp's convert_hf_to_gguf.py does
(LlamaModel.permute: HF's rotate-half RoPE layout -> ggml's interleaved pairs). 2-D weights keep the
checkpoint's dtype (bf16 stays bf16, stored as raw BF16), 1-D norms become f32, as convert_hf_to_gguf.py writes
them. A llama3 rope_scaling adds rope_freqs (the same factors convert_hf_to_gguf.py computes).

Streaming: the safetensors files are memory-mapped and each tensor is written straight to the output in turn;
only a permuted q/k matrix (one layer's) is copied. Peak memory is a few hundred MB even for 8B (16 GB out).

Vocabulary (--vocab): `hf` reads tokenizer.json when it is a byte-level BPE (stoke model synth writes one of the
model's vocab size): tokenizer.ggml.model gpt2 with its tokens, merges, special tokens as control, and pre
'llama-bpe' (a Split with the Llama-3 regex), 'smollm' (individual digits) or 'gpt2'; stoke's and llama.cpp's
tokenizers both load that. `dummy` writes an SPM-style ('llama') vocabulary of vocab_size pieces (<unk>, <s>,
</s>, the 256 byte pieces, then '▁t<i>'), enough for llama-bench and token-id prompts; stoke's GGUF tokenizer
does not read SPM vocabularies (bench step does not need one). `auto` (default): hf when possible, else dummy.
"""
import argparse
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # no gguf package (the GPU machine?): the gguf-py of the llama.cpp tarball ($GGUF_PY)
    import os
    import types
    sys.path.insert(0, os.environ.get("GGUF_PY") or
                    os.path.join(os.environ.get("LLAMA_CPP_DIR", "/tmp/llama.cpp-peer"), "llama.cpp", "gguf-py"))
    try:
        import yaml  # noqa: F401  (gguf.metadata imports it; only model cards use it, never this script)
    except ImportError:
        sys.modules["yaml"] = types.ModuleType("yaml")
    import gguf  # noqa: E402

ST_DTYPES = {"BF16": (np.uint16, gguf.GGMLQuantizationType.BF16), "F16": (np.float16, gguf.GGMLQuantizationType.F16),
             "F32": (np.float32, gguf.GGMLQuantizationType.F32)}


def open_safetensors(folder: Path):
    """name -> (memmap array in storage dtype, safetensors dtype); the files stay mapped."""
    idx = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.exists() else ["model.safetensors"]
    out = {}
    for f in files:
        path = folder / f
        with open(path, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dt = info["dtype"]
            if dt not in ST_DTYPES:
                raise SystemExit(f"{path}: tensor {name} has dtype {dt}; only BF16, F16, F32 are supported")
            b, e = info["data_offsets"]
            arr = mm[base + b: base + e].view(ST_DTYPES[dt][0]).reshape(info["shape"])
            out[name] = (arr, dt)
    return out


def to_f32(arr, dt):
    if dt == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def permute(w, n_head, n_head_kv):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute, on numpy (any dtype: a pure row shuffle)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return np.ascontiguousarray(
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(cfg, head_dim):
    rs = cfg.get("rope_scaling") or {}
    if (rs.get("rope_type") or rs.get("type") or "").lower() != "llama3":
        return None
    base = cfg.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor = rs.get("factor", 8.0)
    lo, hi = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    lo_wl, hi_wl = old / lo, old / hi
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - s) / factor + s))
    return np.array(out, dtype=np.float32)


def hf_bpe_vocab(folder: Path, n_vocab: int):
    """(tokens, types, merges, pre, bos, eos, add_bos) from a byte-level BPE tokenizer.json, or None."""
    p = folder / "tokenizer.json"
    if not p.exists():
        return None
    t = json.loads(p.read_text())
    m = t.get("model", {})
    if m.get("type") != "BPE" or "ByteLevel" not in json.dumps(t.get("pre_tokenizer")):
        return None
    vocab = dict(m["vocab"])
    special = set()
    for a in t.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
        if a.get("special"):
            special.add(a["id"])
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [gguf.TokenType.UNUSED] * n_vocab
    for tok, i in vocab.items():
        if i < n_vocab:
            tokens[i] = tok
            types[i] = gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
    merges = [mm if isinstance(mm, str) else " ".join(mm) for mm in m.get("merges", [])]
    pre_s = json.dumps(t.get("pre_tokenizer"))
    if '"Split"' in pre_s and "Regex" in pre_s:
        pre = "llama-bpe"
    elif "individual_digits" in pre_s:
        pre = "smollm"
    else:
        pre = "gpt2"
    tc = {}
    if (folder / "tokenizer_config.json").exists():
        tc = json.loads((folder / "tokenizer_config.json").read_text())

    def tid(key):
        v = tc.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return vocab.get(v) if v is not None else None
    return tokens, types, merges, pre, tid("bos_token"), tid("eos_token"), bool(tc.get("add_bos_token", pre == "llama-bpe"))


def dummy_spm_vocab(n_vocab: int):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    if n_vocab < len(tokens) + 1:
        raise SystemExit(f"vocab_size {n_vocab} is too small for a dummy SPM vocabulary")
    tokens += [f"\u2581t{i}" for i in range(n_vocab - len(tokens))]
    types += [gguf.TokenType.NORMAL] * (n_vocab - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(n_vocab - 259)]
    return tokens, types, scores


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, help="HF folder: config.json + model.safetensors (or a sharded index)")
    ap.add_argument("out", type=Path, help="output .gguf")
    ap.add_argument("--vocab", choices=["auto", "hf", "dummy"], default="auto")
    ap.add_argument("--name", default=None, help="general.name (default: the folder's name)")
    a = ap.parse_args()

    cfg = json.loads((a.model / "config.json").read_text())
    if cfg.get("model_type", "llama") not in ("llama", "mistral"):
        raise SystemExit(f"model_type {cfg.get('model_type')}: only llama/mistral are converted")
    n_embd, n_layer = cfg["hidden_size"], cfg["num_hidden_layers"]
    n_head = cfg["num_attention_heads"]
    n_head_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim") or n_embd // n_head
    n_vocab = cfg["vocab_size"]
    tied = cfg.get("tie_word_embeddings", False)

    st = open_safetensors(a.model)
    # (gguf name, hf name, transform)
    plan = [("token_embd.weight", "model.embed_tokens.weight", None)]
    for i in range(n_layer):
        p = f"model.layers.{i}."
        plan += [(f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight", None),
                 (f"blk.{i}.attn_q.weight", p + "self_attn.q_proj.weight", (n_head, n_head)),
                 (f"blk.{i}.attn_k.weight", p + "self_attn.k_proj.weight", (n_head, n_head_kv)),
                 (f"blk.{i}.attn_v.weight", p + "self_attn.v_proj.weight", None),
                 (f"blk.{i}.attn_output.weight", p + "self_attn.o_proj.weight", None),
                 (f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight", None),
                 (f"blk.{i}.ffn_gate.weight", p + "mlp.gate_proj.weight", None),
                 (f"blk.{i}.ffn_up.weight", p + "mlp.up_proj.weight", None),
                 (f"blk.{i}.ffn_down.weight", p + "mlp.down_proj.weight", None)]
    plan.append(("output_norm.weight", "model.norm.weight", None))
    if "lm_head.weight" in st and not tied:
        plan.append(("output.weight", "lm_head.weight", None))
    missing = [h for _, h, _ in plan if h not in st]
    if missing:
        raise SystemExit(f"{a.model}: tensors missing: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    used = {h for _, h, _ in plan} | ({"lm_head.weight"} if tied else set())
    extra = [n for n in st if n not in used and not n.endswith("rotary_emb.inv_freq")]
    if extra:
        raise SystemExit(f"{a.model}: tensors this converter does not map: {extra[:5]}")

    dts = {st[h][1] for _, h, _ in plan if st[h][0].ndim == 2}
    ftype = {"BF16": gguf.LlamaFileType.MOSTLY_BF16, "F16": gguf.LlamaFileType.MOSTLY_F16,
             "F32": gguf.LlamaFileType.ALL_F32}[dts.pop() if len(dts) == 1 else "F32"]

    w = gguf.GGUFWriter(str(a.out), "llama")
    w.add_name(a.name or a.model.name)
    w.add_context_length(cfg.get("max_position_embeddings", 8192))
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    if head_dim != n_embd // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    w.add_vocab_size(n_vocab)
    w.add_file_type(ftype)

    hf = hf_bpe_vocab(a.model, n_vocab) if a.vocab in ("auto", "hf") else None
    if a.vocab == "hf" and hf is None:
        raise SystemExit(f"{a.model}: no byte-level BPE tokenizer.json (use --vocab dummy)")
    if hf is not None:
        tokens, types, merges, pre, bos, eos, add_bos = hf
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        if bos is not None:
            w.add_bos_token_id(bos)
        if eos is not None:
            w.add_eos_token_id(eos)
        w.add_add_bos_token(add_bos and bos is not None)
        vocab_desc = f"gpt2 BPE from tokenizer.json (pre {pre}, {len(merges)} merges)"
    else:
        tokens, types, scores = dummy_spm_vocab(n_vocab)
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        vocab_desc = "dummy SPM"

    rope_factors = llama3_rope_factors(cfg, head_dim)
    # Tensor infos first (the header lists them all), then the data in the same order.
    def prepared(gname, hname, perm):
        arr, dt = st[hname]
        if arr.ndim == 1:
            return to_f32(arr, dt), None
        if perm is not None:
            arr = permute(arr, *perm)
        return arr, ST_DTYPES[dt][1]
    for gname, hname, perm in plan:
        arr, dt = st[hname]
        if arr.ndim == 1:
            w.add_tensor_info(gname, arr.shape, np.dtype(np.float32), arr.size * 4)
        else:
            w.add_tensor_info(gname, arr.shape, arr.dtype, arr.nbytes, raw_dtype=ST_DTYPES[dt][1])
    if rope_factors is not None:
        w.add_tensor_info("rope_freqs.weight", rope_factors.shape, rope_factors.dtype, rope_factors.nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for k, (gname, hname, perm) in enumerate(plan):
        arr, _ = prepared(gname, hname, perm)
        w.write_tensor_data(arr)
        total += arr.nbytes
        if k % 50 == 0 or k == len(plan) - 1:
            print(f"\rgguf_from_hf: {k + 1}/{len(plan)} tensors, {total / 2**30:.2f} GiB", end="", file=sys.stderr)
    if rope_factors is not None:
        w.write_tensor_data(rope_factors)
    w.close()
    print(f"\ngguf_from_hf: wrote {a.out} ({a.out.stat().st_size / 2**30:.2f} GiB; {ftype.name}, {n_layer} layers, "
          f"vocab {n_vocab}: {vocab_desc}{', rope_freqs (llama3)' if rope_factors is not None else ''})", file=sys.stderr)


if __name__ == "__main__":
    main()
