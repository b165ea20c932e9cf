"""`stoke embed` on all-MiniLM-L6-v2 against sentence-transformers (minilm_reference.json, written by
make_minilm_reference.py): cosine >= 0.9999 for every sentence, unit norm within 1e-5, 256-token truncation."""
import json
import pathlib
import subprocess

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
REFERENCE = json.loads((HERE / "minilm_reference.json").read_text(encoding="utf-8"))
SENTENCES_FILE = HERE / "minilm_sentences.txt"


def embed(stoke_bin, model, *args, texts=()):
    proc = subprocess.run([str(stoke_bin), "embed", "--model", str(model), *args, *texts],
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return np.array(json.loads(proc.stdout), dtype=np.float64)


def cosines(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_reference_covers_the_truncation_trap():
    counts = REFERENCE["token_counts_untruncated"]
    assert len(REFERENCE["sentences"]) >= 50
    assert REFERENCE["max_seq_length"] == 256
    assert any(128 < n <= 256 for n in counts), "need sentences between the 128 and 256 limits"
    assert any(n > 256 for n in counts), "need sentences beyond the 256 limit"


def test_file_matches_sentence_transformers(stoke_bin, minilm_path):
    ref = np.array(REFERENCE["embeddings"], dtype=np.float64)
    got = embed(stoke_bin, minilm_path, "--file", str(SENTENCES_FILE))
    assert got.shape == ref.shape == (len(REFERENCE["sentences"]), 384)
    cos = cosines(got, ref)
    worst = int(np.argmin(cos))
    assert cos.min() >= 0.9999, f"sentence {worst} {REFERENCE['sentences'][worst][:60]!r}: cosine {cos[worst]}"
    norms = np.linalg.norm(got, axis=1)
    assert np.abs(norms - 1).max() <= 1e-5, norms


def test_positional_texts_keep_order_and_batching_is_invisible(stoke_bin, minilm_path):
    idx = [53, 0, 34, 61, 15]  # long (> 256 tokens), short, CJK, long German, punctuation
    texts = [REFERENCE["sentences"][i] for i in idx]
    ref = np.array([REFERENCE["embeddings"][i] for i in idx])
    one_batch = embed(stoke_bin, minilm_path, texts=texts)
    assert cosines(one_batch, ref).min() >= 0.9999
    singly = embed(stoke_bin, minilm_path, "--batch-size", "1", texts=texts)
    np.testing.assert_allclose(singly, one_batch, atol=1e-6)


def test_128_token_truncation_would_be_caught(stoke_bin, minilm_path):
    # The check is sensitive to the max-length trap: capping at 128 (tokenizer.json's value) moves the long
    # sentences well below the cosine threshold.
    longest = int(np.argmax(REFERENCE["token_counts_untruncated"]))
    text = REFERENCE["sentences"][longest]
    got = embed(stoke_bin, minilm_path, "--max-seq-length", "128", texts=[text])
    assert cosines(got, np.array([REFERENCE["embeddings"][longest]]))[0] < 0.999


def test_errors_exit_1_with_a_message(stoke_bin, minilm_path, tmp_path):
    proc = subprocess.run([str(stoke_bin), "embed", "--model", str(tmp_path / "nope"), "x"], capture_output=True)
    assert proc.returncode == 1 and proc.stdout == b"" and b"nope" in proc.stderr
    proc = subprocess.run([str(stoke_bin), "embed", "--model", str(minilm_path)], capture_output=True)
    assert proc.returncode == 1 and b"no input" in proc.stderr
