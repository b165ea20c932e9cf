"""SmolLM2-135M-Instruct (Q4_1 GGUF) through stoke vs llama.cpp (llama-cpp-python, CPU), same file, same ids.

1. Teacher-forced logits over the fixed texts in smollm2_texts/ (>= 512 positions, scored through the paged KV in
   prefill chunks of 512 and 97 tokens): top-1 equal to llama.cpp's at >= 99% of positions.
2. Greedy 32-token continuations of >= 8 plain and chat prompts: identical to llama.cpp's for all but at most one
   (prompt ids identical always).

Both implementations quantise every matmul input to 8 bits per block of 32, so any rounding-level difference
upstream flips some of those roundings and this small model amplifies each flip to ~0.1-0.2 logits (llama.cpp
against itself with an fp32 instead of fp16 KV cache agrees on top-1 at only ~97% of positions). Stoke meets the
literal criteria by computing a GGUF model on the CPU in ggml's order and precision (kernels/cpu/ggml_numerics.h,
on by default; the flag --ggml-numerics off turns it off): against llama-cpp-python's AVX2 build its logits are then
bit-identical. A llama.cpp built for another ISA (AVX-512 paths sum in 16 lanes) differs at rounding level again.
Figures (top-1 agreement, mean / max |dlogit|, bit-identical rows) are printed (run with -s) and attached to the
junit report as properties.

llama.cpp's side (ids, logits, greedy ids) depends only on the model file, the llama-cpp-python build and the
inputs, so it is kept in ~/.cache/stoke/golden/KEY (STOKE_GOLDEN_CACHE overrides), KEY hashing all of those
(the build through its venv, which scripts/setup.sh keys by the pinned requirements, and the reference code's
source): a second run, from another clone too, recomputes only stoke's side.
"""
import hashlib
import inspect
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
TEXTS = sorted((HERE / "smollm2_texts").glob("*.txt"))
THREADS = 2
MARGIN = 0.5  # logits; a top-1 lead below this is a near-tie (reported: agreement where llama.cpp is decisive)

# (prompt, chat): chat prompts go through the model's ChatML template as one user message.
GREEDY_PROMPTS = [
    ("The capital of France is", False),
    ("def fibonacci(n):\n", False),
    ("Once upon a time, in a small village by the sea,", False),
    ("The three primary colors are", False),
    ("1, 2, 3, 4, 5,", False),
    ("What is the capital of France?", True),
    ("Write a haiku about the ocean.", True),
    ("Explain what a CPU does in one sentence.", True),
    ("List three fruits.", True),
]
CHATML_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def llama_cpp_mod():
    return pytest.importorskip("llama_cpp")


class Reference:
    """llama.cpp loaded on first use; its results cached on disk under a key of everything they depend on."""

    def __init__(self, llama_cpp_mod, model_path):
        self.mod, self.model_path, self._llm = llama_cpp_mod, model_path, None
        st = model_path.stat()
        key = hashlib.sha256()
        for part in (str(model_path), str(st.st_size), str(st.st_mtime_ns), llama_cpp_mod.__version__,
                     os.path.realpath(sys.prefix), str(THREADS), inspect.getsource(llama_cpp_logits),
                     inspect.getsource(llama_cpp_greedy), inspect.getsource(Reference)):
            key.update(part.encode() + b"\0")
        root = pathlib.Path(os.environ.get("STOKE_GOLDEN_CACHE", pathlib.Path.home() / ".cache/stoke/golden"))
        self.dir = root / key.hexdigest()[:24]

    @property
    def llm(self):
        if self._llm is None:  # llama.cpp's defaults (fp16 KV cache), as a user would run it
            self._llm = self.mod.Llama(model_path=str(self.model_path), logits_all=True, n_ctx=2048,
                                       n_threads=THREADS, verbose=False)
        return self._llm

    def _path(self, kind, text):
        return self.dir / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:24]}"

    def teacher_forced(self, text):
        """(ids, logits [len(ids), vocab] fp32) of a plain text."""
        p = self._path("tf", text)
        if (p / "logits.npy").exists():
            return json.loads((p / "ids.json").read_text()), np.load(p / "logits.npy")
        ids = self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        logits = llama_cpp_logits(self.llm, ids)
        p.mkdir(parents=True, exist_ok=True)
        np.save(p / "logits.tmp.npy", logits)
        (p / "ids.json").write_text(json.dumps(ids))
        os.replace(p / "logits.tmp.npy", p / "logits.npy")  # complete entries only
        return ids, logits

    def greedy(self, prompt, chat, max_tokens):
        """(prompt ids, greedy ids, per-step top-1 leads, detokenised text) as llama.cpp computes them."""
        p = self._path("greedy", json.dumps([prompt, chat, max_tokens]))
        if (p / "greedy.json").exists():
            g = json.loads((p / "greedy.json").read_text())
            return g["ids"], g["ref"], g["leads"], g["text"]
        if chat:
            rendered = (f"<|im_start|>system\n{CHATML_SYSTEM}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
                        "<|im_start|>assistant\n")
            ids = self.llm.tokenize(rendered.encode("utf-8"), add_bos=False, special=True)
        else:
            ids = self.llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)  # BOS if the model asks
        ref, leads = llama_cpp_greedy(self.llm, ids, max_tokens)
        text = self.llm.detokenize(ref).decode("utf-8", errors="replace")
        p.mkdir(parents=True, exist_ok=True)
        (p / "greedy.tmp").write_text(json.dumps({"ids": ids, "ref": ref, "leads": leads, "text": text}))
        os.replace(p / "greedy.tmp", p / "greedy.json")
        return ids, ref, leads, text


@pytest.fixture(scope="module")
def llm(llama_cpp_mod, smollm2_path):
    return Reference(llama_cpp_mod, smollm2_path)


def llama_cpp_logits(model, ids):
    model.reset()
    model.eval(ids)
    return np.array(model.scores[: len(ids)], dtype=np.float32)


def stoke_score(stoke_bin, model, ids, out_path, chunk):
    ids_path = out_path.with_suffix(".json")
    ids_path.write_text(json.dumps(ids))
    r = subprocess.run([str(stoke_bin), "score", "--model", str(model), "--ids", f"@{ids_path}", "--out",
                        str(out_path), "--chunk", str(chunk), "--threads", str(THREADS)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    meta = json.loads(r.stdout)
    assert meta["tokens"] == len(ids)
    return np.fromfile(out_path, dtype=np.float32).reshape(len(ids), meta["vocab"])


def margins(logits):
    top2 = np.sort(logits, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def test_teacher_forced_logits_match_llama_cpp(stoke_bin, smollm2_path, llm, tmp_path, record_property):
    n = agree = exact = decisive = decisive_agree = 0
    abs_sum = abs_max = 0.0
    for i, text_path in enumerate(TEXTS):
        ids, ref = llm.teacher_forced(text_path.read_text(encoding="utf-8"))
        assert 0 < len(ids) < 2048
        chunk = 512 if i % 2 == 0 else 97  # chunked prefill through the paged KV, odd and even boundaries
        got = stoke_score(stoke_bin, smollm2_path, ids, tmp_path / f"{text_path.stem}.f32", chunk)
        assert got.shape == ref.shape
        assert np.isfinite(got).all()
        diff = np.abs(got.astype(np.float64) - ref)
        same = got.argmax(axis=1) == ref.argmax(axis=1)
        firm = margins(ref) >= MARGIN
        print(f"{text_path.name}: {len(ids)} tokens (chunk {chunk}), top-1 agree {same.mean():.2%} "
              f"(decisive {same[firm].mean():.2%} of {firm.sum()}), mean |dlogit| {diff.mean():.4f}, "
              f"max {diff.max():.4f}, bit-identical rows {(got == ref).all(axis=1).mean():.2%}")
        n += len(ids)
        agree += int(same.sum())
        exact += int((got == ref).all(axis=1).sum())
        decisive += int(firm.sum())
        decisive_agree += int(same[firm].sum())
        abs_sum += float(diff.sum()) / ref.shape[1]
        abs_max = max(abs_max, float(diff.max()))
    props = {"positions": n, "top1_agreement": agree / n, "decisive_positions": decisive,
             "decisive_top1_agreement": decisive_agree / decisive, "mean_abs_dlogit": abs_sum / n,
             "max_abs_dlogit": abs_max, "bit_identical_rows": exact / n}
    print("all:", json.dumps(props))
    for k, v in props.items():
        record_property(k, v)
    assert n >= 512
    assert agree / n >= 0.99


def llama_cpp_greedy(model, ids, max_tokens):
    """Greedy ids and, per step, llama.cpp's top-1 margin."""
    model.reset()
    model.eval(ids)
    out, leads = [], []
    while len(out) < max_tokens:
        row = np.array(model.scores[model.n_tokens - 1], dtype=np.float32)
        tok = int(row.argmax())
        if tok == model.token_eos():
            break
        top2 = np.sort(row)[-2:]
        out.append(tok)
        leads.append(float(top2[1] - top2[0]))
        model.eval([tok])
    return out, leads


def stoke_greedy(stoke_bin, model, prompt, chat, max_tokens):
    cmd = [str(stoke_bin), "generate", "--model", str(model), "--prompt", prompt, "--temperature", "0",
           "--max-tokens", str(max_tokens), "--threads", str(THREADS), "--print-ids"]
    if chat:
        cmd.append("--chat")
    r = subprocess.run(cmd, capture_output=True, timeout=900)
    assert r.returncode == 0, r.stderr.decode()
    ids = json.loads(r.stderr.decode().strip().splitlines()[-1])
    return r.stdout.decode("utf-8"), ids["prompt"], ids["generated"]


def test_greedy_continuations_match_llama_cpp(stoke_bin, smollm2_path, llm, record_property):
    assert len(GREEDY_PROMPTS) >= 8
    identical = 0
    for prompt, chat in GREEDY_PROMPTS:
        ids, ref, leads, ref_text = llm.greedy(prompt, chat, 32)
        text, prompt_ids, got = stoke_greedy(stoke_bin, smollm2_path, prompt, chat, 32)
        assert prompt_ids == ids, f"prompt tokenization differs for {prompt!r}"
        if got == ref:
            identical += 1
            assert text == ref_text
            print(f"same chat={chat} {prompt!r}: {text!r}")
            continue
        j = next((k for k in range(min(len(got), len(ref))) if got[k] != ref[k]), min(len(got), len(ref)))
        lead = leads[j] if j < len(leads) else 0.0  # j == len(ref): stoke went on where llama.cpp hit EOS
        print(f"DIFF chat={chat} {prompt!r} at token {j}, llama.cpp lead {lead:.3f}\n"
              f"  llama.cpp: {ref_text!r}\n  stoke:     {text!r}")
    record_property("greedy_identical", identical)
    print(f"greedy: {identical}/{len(GREEDY_PROMPTS)} identical")
    assert identical >= len(GREEDY_PROMPTS) - 1
