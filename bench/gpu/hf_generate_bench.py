#!/usr/bin/env python3
"""Hugging Face transformers `generate` throughput at fixed lengths, the baseline for bench/gpu/llm_bench.sh.

    python3 bench/gpu/hf_generate_bench.py --model DIR --batch 64,256 --input-len 1000 --output-len 1000 \
        --budget-s 90 --json $OUT/hf_generate.json

Per batch size: random token ids (fixed seed) of exactly --input-len, greedy, max_new_tokens = min_new_tokens =
N (so every sequence produces exactly N tokens; the synthetic model's EOS is ignored this way).
  TTFT = a run with max_new_tokens = 1 (the prefill plus one token), timed alone;
  TPOT = (time of the N-token run - TTFT) / (N - 1);
  output tokens/s = batch * N / time of the N-token run.
In a static batch every sequence shares those times, so p50 = p99 (reported as such). N starts at
--output-len; when a probe of 16 new tokens predicts that batch x N will not fit in --budget-s (or memory runs
out), N is reduced and the JSON says so (`output_len_measured`, `reduced_because`). Nothing is extrapolated.
"""
import argparse
import json
import sys
import time

import torch
import transformers


def log(msg):
    print(f"hf_generate_bench: {msg}", file=sys.stderr, flush=True)


def timed_generate(model, ids, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + n, (out.shape, ids.shape, n)
    return dt


def bench_batch(model, batch, in_len, out_len, budget_s, vocab):
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, min(vocab, 128000), (batch, in_len), generator=g).cuda()
    res = {"batch": batch, "input_len": in_len, "output_len_requested": out_len}
    try:
        timed_generate(model, ids[:, :16], 2)  # warm-up (kernels, allocator)
        ttft = timed_generate(model, ids, 1)
        probe_n = 16
        probe = timed_generate(model, ids, probe_n)
        tpot_est = max(probe - ttft, 1e-6) / (probe_n - 1)
        n = out_len
        predicted = ttft + tpot_est * (n - 1)
        if predicted > budget_s:
            n = max(probe_n, int((budget_s - ttft) / tpot_est) + 1)
            res["reduced_because"] = (f"{out_len} new tokens predicted to take {predicted:.0f} s "
                                      f"(> budget {budget_s:.0f} s) from a {probe_n}-token probe")
        log(f"batch {batch}: TTFT {ttft * 1e3:.0f} ms, TPOT ~{tpot_est * 1e3:.1f} ms, generating {n} tokens")
        total = timed_generate(model, ids, n)
    except torch.cuda.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        res["error"] = f"CUDA out of memory: {str(e).splitlines()[0]}"
        log(f"batch {batch}: {res['error']}")
        return res
    tpot = (total - ttft) / max(n - 1, 1)
    res.update({
        "output_len_measured": n, "seconds": total,
        "output_tokens_per_s": batch * n / total,
        "ttft_ms": {"p50": ttft * 1e3, "p99": ttft * 1e3},
        "tpot_ms": {"p50": tpot * 1e3, "p99": tpot * 1e3},
        "note": "static batch: every sequence shares TTFT and TPOT, so p50 = p99",
        "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
    })
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", default="64,256")
    ap.add_argument("--input-len", type=int, default=1000)
    ap.add_argument("--output-len", type=int, default=1000)
    ap.add_argument("--budget-s", type=float, default=90, help="max seconds for one batch's N-token run")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    t0 = time.time()
    try:  # straight onto the GPU (needs accelerate on older transformers)
        model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, device_map="cuda")
    except (ImportError, ValueError) as e:
        log(f"device_map='cuda' unavailable ({e}); loading on the host first")
        model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda()
    model.eval()
    load_s = time.time() - t0
    log(f"loaded {a.model} in {load_s:.1f} s ({torch.cuda.get_device_name()})")
    vocab = model.config.vocab_size
    results = []
    with torch.inference_mode():
        for b in [int(x) for x in a.batch.split(",") if x]:
            results.append(bench_batch(model, b, a.input_len, a.output_len, a.budget_s, vocab))
            json.dump({"points": results}, sys.stderr)
            print(file=sys.stderr)
    out = {"tool": "transformers generate", "transformers": transformers.__version__, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(), "model": a.model, "dtype": "bfloat16",
           "attn_implementation": getattr(model.config, "_attn_implementation", None), "load_seconds": load_s,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "points": results}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
