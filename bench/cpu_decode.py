#!/usr/bin/env python3
"""CPU prefill and decode tokens/s of SmolLM2-135M-Instruct (Q4_1 GGUF): stoke (`stoke generate`) against
llama.cpp (llama-cpp-python) on the same machine, in the same run, both with the same thread count.

  .venv/bin/python bench/cpu_decode.py [--stoke build/release/apps/stoke/stoke] [--threads 2]
        [--prompt-tokens 256] [--decode-tokens 128] [--repeats 3]

Workload: a fixed prompt of exactly --prompt-tokens ids (tests/golden/smollm2_texts/prose.txt tokenised by
llama.cpp, cut), then --decode-tokens greedy tokens with EOS ignored. Both sides take the ids directly, so no
tokenizer is timed.
  stoke:     `stoke generate --ids @f --temperature 0 --ignore-eos --max-tokens N --threads T --verbose`; the
             timing line gives prefill (start -> first token sampled) and decode (the other N-1 tokens), wall
             and process CPU time. Model load is excluded.
  llama.cpp: Llama(n_ctx=2048, n_threads=T, n_threads_batch=T, n_batch=512); prefill = eval(prompt) + argmax
             of the last row; decode = N-1 eval([token]) + argmax. process_time() gives CPU time. Each run is
             a fresh worker process (model load excluded), once with OpenMP's default wait policy (threads
             spin between ops) and once with OMP_WAIT_POLICY=PASSIVE (they sleep); the peer's figure is the
             better of the two, both are recorded.
Runs alternate (stoke, llama.cpp default, llama.cpp passive) --repeats times after one warm-up each; the
median run (by decode rate) per side is reported. The development machine is shared: machine.loadavg_* and the cpu_* figures show contention (with T
threads, cpu well below T x wall means other processes had the cores; llama.cpp's OpenMP threads spin while
waiting, stoke's pool threads sleep, so llama.cpp degrades much more under oversubscription).
Writes bench/results/cpu_smollm2_decode.json = {command, commit, machine, date, config, figures, ratio, runs}
and appends a line to bench/results/README.md.
"""
import argparse
import datetime
import json
import os
import pathlib
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL_DIR = pathlib.Path(os.environ.get("STOKE_MODEL_DIR", pathlib.Path.home() / ".cache/stoke/models"))
DEFAULT_MODEL = MODEL_DIR / "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = ROOT / "tests/golden/smollm2_texts/prose.txt"

TIMING = re.compile(r"generate: prompt (\d+) tokens, prefill ([\d.]+) ms .*decode (\d+) tokens in ([\d.]+) ms .*"
                    r"cpu prefill ([\d.]+) ms decode ([\d.]+) ms")


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "loadavg_start": os.getloadavg()}


def run_stoke(stoke: str, model: str, ids_file: str, n_decode: int, threads: int) -> dict:
    cmd = [stoke, "generate", "--model", model, "--ids", f"@{ids_file}", "--temperature", "0", "--ignore-eos",
           "--max-tokens", str(n_decode), "--threads", str(threads), "--verbose"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"stoke failed: {r.stderr}")
    m = TIMING.search(r.stderr)
    if not m:
        sys.exit(f"no timing line in stoke's stderr: {r.stderr}")
    n_prompt, prefill_ms, n_dec, decode_ms, cpu_prefill_ms, cpu_decode_ms = m.groups()
    return {"prompt_tokens": int(n_prompt), "prefill_s": float(prefill_ms) / 1e3, "decode_tokens": int(n_dec),
            "decode_s": float(decode_ms) / 1e3, "cpu_prefill_s": float(cpu_prefill_ms) / 1e3,
            "cpu_decode_s": float(cpu_decode_ms) / 1e3}


def run_llama_cpp(llm, ids: list[int], n_decode: int) -> dict:
    llm.reset()
    w0, c0 = time.perf_counter(), time.process_time()
    llm.eval(ids)
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    w1, c1 = time.perf_counter(), time.process_time()
    for _ in range(n_decode - 1):
        llm.eval([tok])
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    w2, c2 = time.perf_counter(), time.process_time()
    return {"prompt_tokens": len(ids), "prefill_s": w1 - w0, "decode_tokens": n_decode - 1, "decode_s": w2 - w1,
            "cpu_prefill_s": c1 - c0, "cpu_decode_s": c2 - c1}


def run_peer(model: str, ids_file: str, n_decode: int, threads: int, wait_policy: str) -> dict:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if wait_policy != "default":
        env["OMP_WAIT_POLICY"] = wait_policy
    r = subprocess.run([sys.executable, __file__, "--peer-worker", "--model", model, "--ids-file", ids_file,
                        "--decode-tokens", str(n_decode), "--threads", str(threads)],
                       capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode != 0:
        sys.exit(f"llama.cpp worker failed: {r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def peer_worker(args) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=args.model, n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                          n_batch=512, verbose=False)
    ids = json.loads(pathlib.Path(args.ids_file).read_text())
    print(json.dumps(run_llama_cpp(llm, ids, args.decode_tokens)))


def rates(run: dict) -> dict:
    return {"prefill_tok_s": run["prompt_tokens"] / run["prefill_s"],
            "decode_tok_s": run["decode_tokens"] / run["decode_s"],
            "prefill_tok_per_cpu_s": run["prompt_tokens"] / max(run["cpu_prefill_s"], 1e-9),
            "decode_tok_per_cpu_s": run["decode_tokens"] / max(run["cpu_decode_s"], 1e-9)}


def median_run(runs: list[dict]) -> dict:
    """The run with the median decode rate (prefill and decode reported from the same run)."""
    ordered = sorted(runs, key=lambda r: r["decode_tokens"] / r["decode_s"])
    return ordered[len(ordered) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stoke", default=os.environ.get("STOKE_BIN", str(ROOT / "build/release/apps/stoke/stoke")))
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench/results/cpu_smollm2_decode.json"))
    ap.add_argument("--no-readme", action="store_true", help="do not append to bench/results/README.md")
    ap.add_argument("--peer-worker", action="store_true", help=argparse.SUPPRESS)  # one llama.cpp run
    ap.add_argument("--ids-file", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.peer_worker:
        peer_worker(args)
        return
    import llama_cpp

    # The prompt ids, from llama.cpp's tokenizer (vocab only: no weights loaded).
    vocab = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    ids = vocab.tokenize(TEXT.read_text(encoding="utf-8").encode("utf-8"), add_bos=False, special=False)
    if len(ids) < args.prompt_tokens:
        sys.exit(f"{TEXT} has only {len(ids)} tokens")
    ids = ids[: args.prompt_tokens]
    info = machine()
    policies = ["default", "PASSIVE"]
    with tempfile.TemporaryDirectory() as tmp:
        ids_file = str(pathlib.Path(tmp) / "prompt.json")
        pathlib.Path(ids_file).write_text(json.dumps(ids))
        run_stoke(args.stoke, args.model, ids_file, 8, args.threads)  # warm-up (page cache, CPU clocks)
        run_peer(args.model, ids_file, 8, args.threads, "default")
        stoke_runs, peer_runs = [], {p: [] for p in policies}
        for i in range(args.repeats):
            stoke_runs.append(run_stoke(args.stoke, args.model, ids_file, args.decode_tokens, args.threads))
            print(f"run {i}: stoke {json.dumps(rates(stoke_runs[-1]))}", file=sys.stderr)
            for pol in policies:
                peer_runs[pol].append(run_peer(args.model, ids_file, args.decode_tokens, args.threads, pol))
                print(f"run {i}: llama.cpp ({pol}) {json.dumps(rates(peer_runs[pol][-1]))}", file=sys.stderr)
    info["loadavg_end"] = os.getloadavg()
    s = rates(median_run(stoke_runs))
    peer_by_policy = {pol: rates(median_run(runs)) for pol, runs in peer_runs.items()}
    best_policy = max(policies, key=lambda pol: peer_by_policy[pol]["decode_tok_s"])
    p = peer_by_policy[best_policy]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        "commit": commit,
        "machine": info,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": {"model": pathlib.Path(args.model).name, "threads": args.threads,
                   "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens,
                   "repeats": args.repeats, "peer": f"llama-cpp-python {llama_cpp.__version__}",
                   "peer_system_info": llama_cpp.llama_print_system_info().decode().strip(),
                   "peer_omp_wait_policy": best_policy},
        "figures": {"stoke": s, "llama_cpp": p, "llama_cpp_by_omp_wait_policy": peer_by_policy},
        "ratio": {k.replace("_tok", "").replace("_s", ""): s[k] / p[k] for k in s},
        "runs": {"stoke": stoke_runs, "llama_cpp": peer_runs},
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"figures": result["figures"], "ratio": result["ratio"], "loadavg": [
        info["loadavg_start"], info["loadavg_end"]]}, indent=2))
    if not args.no_readme:
        readme = out.parent / "README.md"
        line = (f"| `{out.name}` | SmolLM2-135M Q4_1, {args.threads} threads, {args.prompt_tokens}-token prompt + "
                f"{args.decode_tokens} greedy tokens: `stoke generate` vs llama-cpp-python {llama_cpp.__version__} "
                f"(`bench/cpu_decode.py`, {result['date'][:10]}, load {info['loadavg_start'][0]:.1f}, peer OMP wait "
                f"{best_policy}) | decode "
                f"{s['decode_tok_s']:.1f} vs {p['decode_tok_s']:.1f} tok/s ({result['ratio']['decode']:.2f}x), "
                f"prefill {s['prefill_tok_s']:.0f} vs {p['prefill_tok_s']:.0f} tok/s "
                f"({result['ratio']['prefill']:.2f}x) |\n")
        with readme.open("a", encoding="utf-8") as f:
            f.write(line)


if __name__ == "__main__":
    main()
