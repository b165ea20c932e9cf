#!/usr/bin/env python3
"""Writes tests/golden/minilm_reference.json: all-MiniLM-L6-v2 embeddings of minilm_sentences.txt computed by
sentence-transformers on the CPU (the reference stoke's BertEncoder is checked against).

Run once, locally, in a SEPARATE venv (torch is big and CI must not need it):
  python3 -m venv /tmp/stvenv && /tmp/stvenv/bin/pip install sentence-transformers
  HF_HUB_OFFLINE=1 /tmp/stvenv/bin/python tests/golden/make_minilm_reference.py [--model-dir DIR]
The model folder defaults to $STOKE_MODEL_DIR/all-minilm-l6-v2 (STOKE_MODEL_DIR: ~/.cache/stoke/models).
"""
import argparse
import json
import os
import pathlib

HERE = pathlib.Path(__file__).resolve().parent


def read_sentences(path: pathlib.Path) -> list[str]:
    # One text per line, exactly as `stoke embed --file` reads it: split on '\n', drop one trailing '\r'.
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [l[:-1] if l.endswith("\r") else l for l in lines]


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    default_dir = pathlib.Path(os.environ.get("STOKE_MODEL_DIR", pathlib.Path.home() / ".cache/stoke/models"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default=str(default_dir / "all-minilm-l6-v2"))
    ap.add_argument("--sentences", default=str(HERE / "minilm_sentences.txt"))
    ap.add_argument("--out", default=str(HERE / "minilm_reference.json"))
    args = ap.parse_args()

    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(args.model_dir, device="cpu", local_files_only=True)
    model.eval()
    sentences = read_sentences(pathlib.Path(args.sentences))
    assert len(sentences) >= 50, len(sentences)
    # The 128-vs-256 trap: sentence-transformers must be using 256 (sentence_bert_config.json).
    assert model.max_seq_length == 256, model.max_seq_length
    with torch.no_grad():
        emb = model.encode(sentences, batch_size=16, convert_to_numpy=True, normalize_embeddings=True)
    tok = model.tokenizer(sentences, truncation=False, add_special_tokens=True)
    token_counts = [len(ids) for ids in tok["input_ids"]]
    out = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "reference": f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}, CPU fp32",
        "max_seq_length": model.max_seq_length,
        "dim": int(emb.shape[1]),
        "sentences": sentences,
        "token_counts_untruncated": token_counts,
        # float32 values printed with 9 significant digits (round-trips exactly).
        "embeddings": [[float(f"{x:.9g}") for x in row] for row in emb.tolist()],
    }
    pathlib.Path(args.out).write_text(json.dumps(out, ensure_ascii=False, indent=None) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(sentences)} sentences, max tokens {max(token_counts)}")


if __name__ == "__main__":
    main()
