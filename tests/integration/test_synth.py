"""`stoke model synth` from the outside: the files Hugging Face libraries read (safetensors headers through the
safetensors package, tokenizer.json through the tokenizers package), determinism per seed, and usage errors.
Small --layers keep it fast on the CPU."""
import hashlib
import json
import subprocess

import pytest

safetensors = pytest.importorskip("safetensors")
tokenizers = pytest.importorskip("tokenizers")


def synth(stoke_bin, out, *args):
    return subprocess.run([str(stoke_bin), "model", "synth", "--out", str(out), "--quiet", *args],
                          capture_output=True, text=True, timeout=300)


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def smol(stoke_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "smol"
    r = synth(stoke_bin, out, "--shape", "smollm2-135m", "--layers", "2", "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    return out


def header(path):
    """The safetensors JSON header, read by hand (dtype names as the format spells them)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert (8 + n) % 8 == 0, "data must start 8-byte aligned"
    return json.loads(raw[8:8 + n]), 8 + n, len(raw)


def test_llama_safetensors_and_config(smol):
    cfg = json.loads((smol / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (576, 9, 3)
    assert (cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]) == (1536, 49152, 2)
    assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "bfloat16"
    from safetensors import safe_open
    with safe_open(str(smol / "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        names = set(f.keys())
        shapes = {k: f.get_slice(k).get_shape() for k in names}
        dtypes = {f.get_slice(k).get_dtype() for k in names}
    assert dtypes == {"BF16"}
    assert "lm_head.weight" not in names  # tied
    assert shapes["model.embed_tokens.weight"] == [49152, 576]
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == [192, 576]
    assert shapes["model.layers.0.mlp.down_proj.weight"] == [576, 1536]
    assert shapes["model.norm.weight"] == [576]
    assert len(names) == 1 + 2 * 9 + 1
    h, data_start, size = header(smol / "model.safetensors")
    end = max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
    assert data_start + end == size


def test_values_follow_the_scheme(smol):
    """bf16 weights decoded by hand: norms ~1, embedding std 2.5/sqrt(H), nothing out of range."""
    import numpy as np
    h, start, _ = header(smol / "model.safetensors")
    raw = (smol / "model.safetensors").read_bytes()

    def tensor(name):
        b, e = h[name]["data_offsets"]
        u16 = np.frombuffer(raw[start + b:start + e], dtype=np.uint16)
        return (u16.astype(np.uint32) << 16).view(np.float32)

    norm = tensor("model.norm.weight")
    assert abs(norm.mean() - 1.0) < 0.01 and 0.01 < norm.std() < 0.03
    emb = tensor("model.embed_tokens.weight")
    assert abs(emb.std() - 2.5 / 576 ** 0.5) < 0.002
    assert np.isfinite(emb).all() and np.abs(emb).max() < 3.5 * 2.5 / 576 ** 0.5 + 1e-3


def test_tokenizer_loads_in_hf_tokenizers(smol):
    tok = tokenizers.Tokenizer.from_file(str(smol / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 49152
    text = "Hello, world! 12345 synthetic tokens\n"
    enc = tok.encode(text)
    assert tok.decode(enc.ids) == text
    assert tok.token_to_id("<|im_end|>") == 2
    tc = json.loads((smol / "tokenizer_config.json").read_text())
    assert tc["eos_token"] == "<|im_end|>" and "chat_template" in tc


def test_llama3_tokenizer_in_hf_tokenizers(stoke_bin, tmp_path):
    out = tmp_path / "l1b"
    r = synth(stoke_bin, out, "--shape", "llama-3.2-1b", "--layers", "1")
    assert r.returncode == 0, r.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_scaling"] == {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    assert cfg["rope_theta"] == 500000.0 and cfg["max_position_embeddings"] == 131072
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 128256
    enc = tok.encode("The capital of France is")
    assert enc.ids[0] == 128000  # <|begin_of_text|> from the post-processor
    assert tok.decode(enc.ids, skip_special_tokens=True) == "The capital of France is"
    assert tok.token_to_id("<|eot_id|>") == 128009


def test_bert_files(stoke_bin, tmp_path):
    out = tmp_path / "bert"
    r = synth(stoke_bin, out, "--shape", "bert-base", "--layers", "1", "--dtype", "f32")
    assert r.returncode == 0, r.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["BertModel"] and cfg["num_hidden_layers"] == 1
    from safetensors.numpy import load_file
    t = load_file(str(out / "model.safetensors"))
    assert t["embeddings.word_embeddings.weight"].shape == (30522, 768)
    assert t["encoder.layer.0.intermediate.dense.weight"].shape == (3072, 768)
    assert t["pooler.dense.bias"].shape == (768,)
    assert t["encoder.layer.0.output.LayerNorm.weight"].dtype.name == "float32"
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == 30522
    enc = tok.encode("hello world")
    assert enc.ids[0] == 101 and enc.ids[-1] == 102
    assert len((out / "vocab.txt").read_text().splitlines()) == 30522


def test_same_seed_same_bytes_other_seed_other_bytes(stoke_bin, tmp_path):
    runs = {}
    for name, seed in (("a", "9"), ("b", "9"), ("c", "10")):
        r = synth(stoke_bin, tmp_path / name, "--shape", "bert-base", "--layers", "1", "--seed", seed)
        assert r.returncode == 0, r.stderr
        runs[name] = {f: sha(tmp_path / name / f) for f in ("model.safetensors", "tokenizer.json", "config.json")}
    assert runs["a"] == runs["b"]
    assert runs["a"]["model.safetensors"] != runs["c"]["model.safetensors"]


def test_bad_shape_lists_the_shapes(stoke_bin, tmp_path):
    r = synth(stoke_bin, tmp_path / "x", "--shape", "llama-70b")
    assert r.returncode == 2
    for s in ("llama-3.1-8b", "llama-3.2-1b", "smollm2-135m", "bert-base", "bert-large"):
        assert s in r.stderr
    r = synth(stoke_bin, tmp_path / "x", "--shape", "bert-base", "--arch", "llama")
    assert r.returncode == 2 and "does not match" in r.stderr
