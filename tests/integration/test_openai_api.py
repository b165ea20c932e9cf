"""The OpenAI-compatible API of a real `stoke serve` (SmolLM2-135M) driven by the real `openai` client:
chat and completions, streaming and not, stop strings, max_tokens, seeds, logprobs, usage counts."""
import jinja2
import pytest

CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]


def reference_chat_prompt_ids(vocab, messages):
    """The chat prompt as the reference (llama.cpp's tokenizer over the GGUF's own Jinja template) tokenizes it."""
    template = vocab.metadata["tokenizer.chat_template"]
    text = jinja2.Environment().from_string(template).render(messages=messages, add_generation_prompt=True)
    return vocab.tokenize(text.encode(), add_bos=False, special=True)


def test_chat_completion_shape_and_usage(openai_client, model_name, smollm2_vocab):
    r = openai_client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=24, temperature=0)
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion"
    assert r.model == model_name
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0
    assert c.message.role == "assistant"
    assert c.message.content.strip()
    assert c.finish_reason in ("stop", "length")
    assert c.logprobs is None
    # usage: prompt tokens are exactly what the reference tokenizer makes of the templated prompt
    assert r.usage.prompt_tokens == len(reference_chat_prompt_ids(smollm2_vocab, CHAT))
    assert 1 <= r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 24


def test_completion_usage_matches_tokenizer(openai_client, model_name, smollm2_vocab):
    prompt = "The quick brown fox jumps over the lazy dog. Then the fox"
    r = openai_client.completions.create(model=model_name, prompt=prompt, max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    assert r.usage.prompt_tokens == len(smollm2_vocab.tokenize(prompt.encode(), add_bos=True, special=False))
    assert r.usage.completion_tokens == 8 or r.choices[0].finish_reason == "stop"
    assert r.choices[0].text


def test_completion_default_max_tokens_is_16(openai_client, model_name):
    r = openai_client.completions.create(model=model_name, prompt="Count: 1, 2, 3,", temperature=0,
                                         extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16
    assert r.choices[0].finish_reason == "length"


def test_max_tokens_with_ignore_eos(openai_client, model_name):
    for n in (1, 5):
        r = openai_client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=n, temperature=0,
                                                  extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == n
        assert r.choices[0].finish_reason == "length"
    # max_completion_tokens is the newer name for the same limit
    r = openai_client.chat.completions.create(model=model_name, messages=CHAT, max_completion_tokens=3,
                                              temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3


def test_token_id_prompt_equals_text_prompt(openai_client, model_name, smollm2_vocab):
    prompt = "Paris is the capital of"
    ids = smollm2_vocab.tokenize(prompt.encode(), add_bos=True, special=False)
    by_text = openai_client.completions.create(model=model_name, prompt=prompt, max_tokens=6, temperature=0)
    by_ids = openai_client.completions.create(model=model_name, prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_chat_streaming_equals_non_streaming(openai_client, model_name):
    full = openai_client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=20, temperature=0)
    stream = openai_client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=20, temperature=0,
                                                   stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    # the finish chunk comes before the usage chunk, which has no choices
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_streaming(openai_client, model_name):
    full = openai_client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=12,
                                            temperature=0)
    chunks = list(openai_client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=12,
                                                   temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage anywhere


def test_stop_strings(openai_client, model_name):
    prompt = "Count from one to twenty in words: one, two, three,"
    free = openai_client.completions.create(model=model_name, prompt=prompt, max_tokens=24, temperature=0,
                                            extra_body={"ignore_eos": True}).choices[0].text
    # stop at a word that appears after some output: the text ends right before it, finish_reason "stop"
    words = [w.strip(" ,.") for w in free.split()]
    stop_word = next(w for w in words[2:] if len(w) >= 3)
    expected = free[:free.index(stop_word)]
    for stop in (stop_word, [stop_word, "zzzz-never"]):
        r = openai_client.completions.create(model=model_name, prompt=prompt, max_tokens=24, temperature=0,
                                             stop=stop, extra_body={"ignore_eos": True})
        assert r.choices[0].text == expected
        assert r.choices[0].finish_reason == "stop"
        assert stop_word not in r.choices[0].text
    # streaming never emits any part of the stop string
    chunks = list(openai_client.completions.create(model=model_name, prompt=prompt, max_tokens=24, temperature=0,
                                                   stop=stop_word, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == expected


def test_seed_reproducibility(openai_client, model_name):
    def sample(seed):
        return openai_client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": "Write a short poem about the sea."}],
            max_tokens=24, temperature=1.0, top_p=0.95, seed=seed,
            extra_body={"ignore_eos": True}).choices[0].message.content

    a, b = sample(1234), sample(1234)
    assert a == b
    others = {sample(s) for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "different seeds should not all give the same sample"


def test_chat_logprobs(openai_client, model_name):
    r = openai_client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=6, temperature=0,
                                              logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        assert t.bytes is not None
        # greedy: the chosen token is the most likely one
        assert t.logprob == pytest.approx(max(a.logprob for a in t.top_logprobs), abs=1e-5)
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
    assert "".join(bytes(t.bytes).decode("utf-8", "replace") for t in content) == r.choices[0].message.content


def test_completion_logprobs(openai_client, model_name):
    r = openai_client.completions.create(model=model_name, prompt="The sky is", max_tokens=4, temperature=0,
                                         logprobs=2, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0
    for chosen, tops in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(tops) == 2
        assert chosen == pytest.approx(max(tops.values()), abs=1e-5)


def test_models_endpoint(openai_client, model_name):
    models = openai_client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert models.data[0].object == "model"
