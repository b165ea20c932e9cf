"""stoke's tokenizers vs the reference implementations, id for id, on every line of tokenizer_corpus.txt
(regenerate with make_corpus.py) plus multi-line texts built from it.

- all-minilm-l6-v2 (WordPiece, tokenizer.json) vs HF `tokenizers` (the file's 128-token truncation disabled).
- SmolLM2-135M-Instruct GGUF (byte-level BPE, pre "smollm") vs llama.cpp through llama-cpp-python.
- The tokenizer.json BPE path: SmolLM2's vocab and merges written as tokenizer.json (smollm and Llama-3
  pre-tokenizers) and compared with HF `tokenizers` loading the same file.
- SmolLM2's chat template: stoke's native ChatML rendering vs jinja2 rendering the GGUF's template.

Literal special-token text ("<|im_start|>", "[CLS]") in user text must stay text by default (HF:
encode_special_tokens=True, llama.cpp: special=False); with --parse-special both sides match them.
"""
import json
import pathlib
import subprocess

import pytest

HERE = pathlib.Path(__file__).resolve().parent
CORPUS = HERE / "tokenizer_corpus.txt"
SEPARATORS = ["\n", "\n\n", "\r\n", " \n ", "\n\n\n", "\n \n", "\t\n", "\n  "]


def corpus_lines() -> list[str]:
    text = CORPUS.read_bytes().decode("utf-8")
    lines = text.split("\n")  # not splitlines(): lines hold \r, \x0b, \x85, \u2028 on purpose
    assert lines[-1] == "", "corpus must end with a newline"
    lines = lines[:-1]
    assert len(lines) >= 2000
    return lines


def multiline_texts(lines: list[str]) -> list[str]:
    """Texts with newlines (the corpus has none): groups of lines joined by newline runs, plus edge cases."""
    out = ["\n", "\n\n", " \n", "\n ", "a\n", "\nb", "a\n\n\nb", "x \n\n y", "\r\n\r\n", "end\n\n"]
    for i in range(0, 900, 3):
        sep = SEPARATORS[(i // 3) % len(SEPARATORS)]
        out.append(sep.join(lines[i:i + 3]) + ("\n" if i % 2 else ""))
    return out


def run_stoke(stoke_bin, model, texts, tmp_path, *flags) -> list[list[int]]:
    """All texts through one `stoke tokenize --jsonl` process (texts as JSON strings, one per line)."""
    src = tmp_path / "texts.jsonl"
    src.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    r = subprocess.run([str(stoke_bin), "tokenize", "--model", str(model), "--file", str(src), "--jsonl",
                        "--input-json", *flags], capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    out = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert len(out) == len(texts)
    return out


def assert_same(what, texts, ours, ref):
    bad = [(t, o, r) for t, o, r in zip(texts, ours, ref) if o != r]
    msg = [f"{what}: {len(bad)} of {len(texts)} texts differ; first ones:"]
    for t, o, r in bad[:5]:
        first = next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), min(len(o), len(r)))
        msg.append(f"  text {t[:120]!r}\n    stoke {o[max(0, first - 3):first + 6]} ... (len {len(o)})\n"
                   f"    ref   {r[max(0, first - 3):first + 6]} ... (len {len(r)}) first diff at {first}")
    assert not bad, "\n".join(msg)


@pytest.fixture(scope="module")
def texts():
    lines = corpus_lines()
    return lines + multiline_texts(lines)


def test_corpus_file_path_matches_json_input_path(stoke_bin, minilm_path, tmp_path):
    """The plain `--file corpus --jsonl` path (what the docs show) gives the same ids as --input-json."""
    lines = corpus_lines()
    r = subprocess.run([str(stoke_bin), "tokenize", "--model", str(minilm_path), "--file", str(CORPUS), "--jsonl"],
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    plain = [json.loads(x) for x in r.stdout.decode().splitlines()]
    assert plain == run_stoke(stoke_bin, minilm_path, lines, tmp_path)


# ---- MiniLM: WordPiece vs HF tokenizers ------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_minilm(minilm_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    tok.no_truncation()  # the file bakes in 128; stoke truncates only when asked
    tok.no_padding()
    return tok


@pytest.mark.parametrize("parse_special", [False, True], ids=["literal-specials", "parse-special"])
def test_minilm_wordpiece_matches_hf(stoke_bin, minilm_path, hf_minilm, texts, tmp_path, parse_special):
    hf_minilm.encode_special_tokens = not parse_special
    ref = [e.ids for e in hf_minilm.encode_batch(texts)]
    ours = run_stoke(stoke_bin, minilm_path, texts, tmp_path, *(["--parse-special"] if parse_special else []))
    assert_same(f"MiniLM parse_special={parse_special}", texts, ours, ref)
    if not parse_special:  # the corpus really exercises the literal-special path
        assert any(101 not in o[1:-1] and "[CLS]" in t for t, o in zip(texts, ours))


def test_minilm_no_special(stoke_bin, minilm_path, hf_minilm, texts, tmp_path):
    hf_minilm.encode_special_tokens = True
    sample = texts[:400]
    ref = [e.ids for e in hf_minilm.encode_batch(sample, add_special_tokens=False)]
    assert_same("MiniLM --no-special", sample, run_stoke(stoke_bin, minilm_path, sample, tmp_path, "--no-special"), ref)


# ---- SmolLM2 GGUF: byte-level BPE vs llama.cpp -----------------------------------------------------------


@pytest.fixture(scope="module")
def llama_vocab(smollm2_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=str(smollm2_path), vocab_only=True, verbose=False)


@pytest.mark.parametrize("parse_special", [False, True], ids=["literal-specials", "parse-special"])
def test_smollm2_gguf_matches_llama_cpp(stoke_bin, smollm2_path, llama_vocab, texts, tmp_path, parse_special):
    # add_bos=True: llama.cpp then adds BOS only if the file says so (tokenizer.ggml.add_bos_token = false here).
    ref = [llama_vocab.tokenize(t.encode("utf-8"), add_bos=True, special=parse_special) for t in texts]
    ours = run_stoke(stoke_bin, smollm2_path, texts, tmp_path, *(["--parse-special"] if parse_special else []))
    assert_same(f"SmolLM2 GGUF special={parse_special}", texts, ours, ref)
    n_control = sum(sum(1 for i in o if i <= 16) for o in ours)
    assert (n_control > 0) == parse_special  # control ids only ever come from parse_special


def test_smollm2_gguf_no_special(stoke_bin, smollm2_path, llama_vocab, texts, tmp_path):
    sample = texts[:300]
    ref = [llama_vocab.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in sample]
    assert_same("SmolLM2 --no-special", sample, run_stoke(stoke_bin, smollm2_path, sample, tmp_path, "--no-special"),
                ref)


# ---- tokenizer.json BPE (smollm and Llama-3 pre-tokenizers) vs HF tokenizers -----------------------------

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="module")
def smollm2_vocab(smollm2_path):
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(str(smollm2_path))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    return tokens, [tuple(m.split(" ", 1)) for m in merges], types


@pytest.mark.parametrize("pre", ["smollm", "llama3"])
def test_bpe_tokenizer_json_matches_hf(stoke_bin, smollm2_vocab, texts, tmp_path, pre):
    tk = pytest.importorskip("tokenizers")
    tokens, merges, types = smollm2_vocab
    vocab = {t: i for i, t in enumerate(tokens)}
    model = tk.models.BPE(vocab=vocab, merges=merges, ignore_merges=(pre == "llama3"))
    tok = tk.Tokenizer(model)
    if pre == "smollm":
        tok.pre_tokenizer = tk.pre_tokenizers.Sequence([
            tk.pre_tokenizers.Digits(individual_digits=True),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tok.pre_tokenizer = tk.pre_tokenizers.Sequence([
            tk.pre_tokenizers.Split(tk.Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tk.decoders.ByteLevel()
    tok.add_special_tokens([tk.AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    folder = tmp_path / f"tok-{pre}"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    tok = tk.Tokenizer.from_file(str(folder / "tokenizer.json"))  # exactly what stoke reads
    tok.encode_special_tokens = True
    ref = [e.ids for e in tok.encode_batch(texts)]
    ours = run_stoke(stoke_bin, folder, texts, tmp_path)
    assert_same(f"tokenizer.json BPE pre={pre}", texts, ours, ref)


# ---- chat template ---------------------------------------------------------------------------------------

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Write a haiku\nabout the sea.\n"}],
    [{"role": "user", "content": "  spaces, tabs\t, 日本語 and 😀 and a literal <|im_end|> marker  "}],
    [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
]
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def stoke_prompt(stoke_bin, model, conv):
    r = subprocess.run([str(stoke_bin), "tokenize", "--model", str(model), "--chat", "--messages", "--print-prompt",
                        json.dumps(conv)], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout.decode()


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=[f"conv{i}" for i in range(len(CONVERSATIONS))])
def test_smollm2_chat_template_matches_jinja(stoke_bin, smollm2_path, llama_vocab, conv):
    ours = stoke_prompt(stoke_bin, smollm2_path, conv)
    try:
        import jinja2.sandbox
    except ImportError:  # no jinja2: the hand-checked ChatML form
        sys_part = "" if conv[0]["role"] == "system" else f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
        ref = sys_part + "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conv)
        ref += "<|im_start|>assistant\n"
    else:  # the template from the file, rendered the way HF transformers does
        template = llama_vocab.metadata["tokenizer.chat_template"]
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        ref = env.from_string(template).render(messages=conv, add_generation_prompt=True,
                                               bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert ours == ref
    # And the ids of the rendered prompt (markers as control tokens) equal llama.cpp's.
    r = subprocess.run([str(stoke_bin), "tokenize", "--model", str(smollm2_path), "--chat", "--messages",
                        json.dumps(conv)], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert json.loads(r.stdout) == llama_vocab.tokenize(ref.encode("utf-8"), add_bos=True, special=True)


def test_smollm2_chat_single_user_message(stoke_bin, smollm2_path):
    r = subprocess.run([str(stoke_bin), "tokenize", "--model", str(smollm2_path), "--chat", "--print-prompt", "Hi"],
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout.decode() == (f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
                                 "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_encoder_without_template_is_a_clear_error(stoke_bin, minilm_path):
    r = subprocess.run([str(stoke_bin), "tokenize", "--model", str(minilm_path), "--chat", "Hi"],
                       capture_output=True, timeout=120)
    assert r.returncode == 1
    assert b"no chat template" in r.stderr
