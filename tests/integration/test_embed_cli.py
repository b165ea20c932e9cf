"""`stoke embed` on token ids and its encoder benchmark (--ids-file, --bench-batch), on the CPU with a tiny
random BERT written here, plus the device flags' errors. The GPU side runs in bench/gpu/bert_bench.sh and
engine/cuda/cuda_bert_gpu_test.cc."""
import json
import subprocess

import numpy as np
import pytest
from safetensors.numpy import save_file

H, LAYERS, HEADS, INTER, VOCAB, MAX_POS = 32, 2, 2, 64, 120, 64


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_bert")
    rng = np.random.default_rng(0)

    def n(*shape, std=0.5, mean=0.0):
        return (rng.standard_normal(shape) * std + mean).astype(np.float32)

    t = {"embeddings.word_embeddings.weight": n(VOCAB, H), "embeddings.position_embeddings.weight": n(MAX_POS, H),
         "embeddings.token_type_embeddings.weight": n(2, H), "embeddings.LayerNorm.weight": n(H, std=0.1, mean=1),
         "embeddings.LayerNorm.bias": n(H, std=0.1)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for name, (o, k) in {"attention.self.query": (H, H), "attention.self.key": (H, H),
                             "attention.self.value": (H, H), "attention.output.dense": (H, H),
                             "intermediate.dense": (INTER, H), "output.dense": (H, INTER)}.items():
            t[p + name + ".weight"] = n(o, k, std=k ** -0.5)
            t[p + name + ".bias"] = n(o, std=0.1)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + ln + ".weight"] = n(H, std=0.1, mean=1)
            t[p + ln + ".bias"] = n(H, std=0.1)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps({
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": VOCAB, "hidden_size": H,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": INTER,
        "max_position_embeddings": MAX_POS, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}))
    return d


def run(stoke_bin, *args, check=True):
    return subprocess.run([str(stoke_bin), "embed", *map(str, args)], capture_output=True, text=True, timeout=120,
                          check=check)


def test_ids_file_batches_agree_and_are_unit_vectors(stoke_bin, tiny_bert, tmp_path):
    rows = [[1, 5, 9, 2], [1, 7, 2], [1] + list(range(10, 40)) + [2], [1, 2]]
    f = tmp_path / "ids.json"
    f.write_text(json.dumps(rows))
    together = np.array(json.loads(run(stoke_bin, "--model", tiny_bert, "--ids-file", f).stdout))
    assert together.shape == (4, H)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    one_by_one = np.array(json.loads(run(stoke_bin, "--model", tiny_bert, "--ids-file", f, "--batch-size", 1).stdout))
    np.testing.assert_allclose(one_by_one, together, atol=2e-6)
    # Different inputs give different embeddings (the model is not degenerate).
    assert np.dot(together[0], together[2]) < 0.99


def test_ids_file_errors_name_the_problem(stoke_bin, tiny_bert, tmp_path):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps([[1, 2], [1, VOCAB + 5, 2]]))
    p = run(stoke_bin, "--model", tiny_bert, "--ids-file", f, check=False)
    assert p.returncode == 1
    assert f"id {VOCAB + 5} is outside [0, {VOCAB})" in p.stderr
    f.write_text(json.dumps({"not": "a list"}))
    p = run(stoke_bin, "--model", tiny_bert, "--ids-file", f, check=False)
    assert p.returncode == 1 and "expected a JSON array" in p.stderr


def test_bench_batch_json(stoke_bin, tiny_bert, tmp_path):
    out = tmp_path / "bench.json"
    run(stoke_bin, "--model", tiny_bert, "--bench-batch", "1,3", "--seq-len", 16, "--bench-seconds", 0.05,
        "--json", out)
    j = json.loads(out.read_text())
    assert j["device"] == "cpu" and j["seq_len"] == 16 and j["hidden_size"] == H
    assert [r["batch"] for r in j["results"]] == [1, 3]
    for r in j["results"]:
        assert r["iters"] >= 3 and r["seqs_per_s"] > 0
        assert r["seqs_per_s"] == pytest.approx(r["batch"] * 1e3 / r["ms_per_batch"], rel=1e-6)
        assert r["compute_ms_median"] == 0  # device event times exist only on a GPU
    p = run(stoke_bin, "--model", tiny_bert, "--bench-batch", "2", "--seq-len", MAX_POS + 1, check=False)
    assert p.returncode == 1 and "--seq-len" in p.stderr
    # --bench-lengths: a packed variable-length batch, the lengths used in turn.
    run(stoke_bin, "--model", tiny_bert, "--bench-batch", "5", "--bench-lengths", "4,30,9", "--bench-seconds",
        0.05, "--json", out)
    (r,) = json.loads(out.read_text())["results"]
    assert r["tokens"] == 4 + 30 + 9 + 4 + 30
    assert r["tokens_per_s"] == pytest.approx(r["seqs_per_s"] * r["tokens"] / 5, rel=1e-6)
    p = run(stoke_bin, "--model", tiny_bert, "--bench-batch", "2", "--bench-lengths", f"3,{MAX_POS + 1}",
            check=False)
    assert p.returncode == 1 and "--bench-lengths" in p.stderr


def test_device_flag(stoke_bin, tiny_bert, tmp_path):
    f = tmp_path / "ids.json"
    f.write_text(json.dumps([[1, 5, 2]]))
    cpu = json.loads(run(stoke_bin, "--model", tiny_bert, "--ids-file", f).stdout)
    auto = run(stoke_bin, "--model", tiny_bert, "--ids-file", f, "--device", "auto")
    # auto is the CPU unless this binary has CUDA and sees a GPU; then the GPU result is close to the CPU's.
    np.testing.assert_allclose(json.loads(auto.stdout), cpu, atol=2e-2)
    cuda = run(stoke_bin, "--model", tiny_bert, "--ids-file", f, "--device", "cuda", check=False)
    if cuda.returncode != 0:  # no CUDA build or no GPU: says which
        assert "--device cuda: " in cuda.stderr and ("without CUDA" in cuda.stderr or "no CUDA GPU" in cuda.stderr)
    else:
        np.testing.assert_allclose(json.loads(cuda.stdout), cpu, atol=2e-2)
    p = run(stoke_bin, "--model", tiny_bert, "--ids-file", f, "--device", "tpu", check=False)
    assert p.returncode == 2  # CLI11 rejects the value
