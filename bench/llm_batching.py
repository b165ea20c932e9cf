#!/usr/bin/env python3
"""Continuous batching on CPU: SmolLM2 output tokens/s of `stoke serve` at 1, 4, 16 and 64 concurrent streams,
and the batching gain over one stream at a time, all in one run against one server.

  .venv/bin/python bench/llm_batching.py [--stoke-bin build/release/apps/stoke/stoke] [--out FILE]
        [--levels 1,4,16,64] [--max-tokens 64] [--min-seconds 20] [--max-load 3]

Clients: the real `openai` package, one thread per stream, each thread sending streaming chat completions back
to back (closed loop). Every request asks for exactly N output tokens (`max_tokens` N plus the vLLM extensions
`ignore_eos: true, min_tokens: N`), greedy, with a distinct short user prompt. A level keeps starting requests
until it has run --min-seconds AND started --min-requests-factor x concurrency requests, then waits for the
ones in flight. Output tokens/s = completion tokens (from `usage`) / (first request sent -> last response
done). TTFT = request sent -> first content chunk; ITL = gap between consecutive content chunks (one chunk per
engine step that produced text: one token unless text was held back). Each level also records the server's
and this client's CPU seconds (on a 2-core machine the Python client competes with the server) and the mean
decode batch from stoke:step_decode_tokens.
Writes bench/results/cpu_llm_batching.json = {command, commit, machine, date, settings, figures, ...}.
"""
import argparse
import json
import os
import pathlib
import resource
import shlex
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import llm_server as ls  # noqa: E402

TOPICS = ["the history of bread", "how bridges carry weight", "why the sky is blue", "the life of bees",
          "how a bicycle stays upright", "the water cycle", "how volcanoes form", "the rules of chess",
          "how vaccines work", "the first computers", "why leaves change colour", "how tides happen",
          "the Roman road network", "how a refrigerator cools", "the migration of birds", "how paper is made"]
STYLES = ["Write a short story about", "Explain to a child", "Give me a long essay on", "Describe in detail",
          "Write a poem about", "List many facts about", "Tell me everything you know about",
          "Write a lesson plan on"]


def prompt(i: int) -> str:
    return f"{STYLES[i % len(STYLES)]} {TOPICS[(i // len(STYLES)) % len(TOPICS)]} (request {i})."


def client_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_level(server, client, model: str, conc: int, n_tokens: int, min_seconds: float, min_requests: int,
              max_seconds: float, first_id: int) -> dict:
    lock = threading.Lock()
    state = {"started": 0}
    results: list[dict] = []
    errors: list[str] = []
    m0 = server.metrics()
    cpu_s0, cpu_c0 = server.cpu_seconds(), client_cpu()
    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()

    def worker():
        while True:
            with lock:
                elapsed = time.perf_counter() - t_start
                done_enough = elapsed >= min_seconds and state["started"] >= min_requests
                if done_enough or elapsed >= max_seconds or errors:
                    return
                rid = first_id + state["started"]
                state["started"] += 1
            try:
                r = ls.stream_chat(client, model, [{"role": "user", "content": prompt(rid)}], n_tokens, seed=rid)
            except Exception as e:  # noqa: BLE001 - reported, and the level stops
                with lock:
                    errors.append(f"{e!r} (cause: {e.__cause__!r}, {time.perf_counter() - t_start:.2f} s into the level)")
                return
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        server.stop()
        sys.exit(f"level {conc}: {len(errors)} request(s) failed, first: {errors[0]}\n--- stoke serve stderr ---\n"
                 + "\n".join(server.lines[-20:]))
    t_end = max(r["end"] for r in results)
    wall = t_end - t_start
    cpu_s, cpu_c = server.cpu_seconds() - cpu_s0, client_cpu() - cpu_c0
    m1 = server.metrics()

    def delta(name):
        return m1.get(name, 0.0) - m0.get(name, 0.0)

    tokens = sum(r["completion_tokens"] for r in results)
    ttft = [r["ttft"] for r in results]
    gaps = [g for r in results for g in r["gaps"]]
    decode_steps = delta("stoke:step_decode_tokens_count")
    fig = {
        "concurrency": conc,
        "requests": len(results),
        "output_tokens": tokens,
        "all_requests_exact_length": all(r["completion_tokens"] == n_tokens for r in results),
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2),
        "requests_per_s": round(len(results) / wall, 3),
        "ttft_s": {"p50": round(ls.percentile(ttft, 50), 4), "p99": round(ls.percentile(ttft, 99), 4),
                   "mean": round(sum(ttft) / len(ttft), 4)},
        "itl_s": {"p50": round(ls.percentile(gaps, 50), 4), "p99": round(ls.percentile(gaps, 99), 4),
                  "mean": round(sum(gaps) / len(gaps), 4), "samples": len(gaps)},
        "tokens_per_content_chunk": round(tokens / sum(r["chunks"] for r in results), 3),
        "server_cpu_s": round(cpu_s, 2),
        "client_cpu_s": round(cpu_c, 2),
        "engine_steps": int(delta("stoke:step_duration_seconds_count")),
        "mean_decode_batch": round(delta("stoke:step_decode_tokens_sum") / decode_steps, 2) if decode_steps else None,
        "preemptions": int(delta("stoke:num_preemptions_total")),
        "loadavg_1m_before": round(load0, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stoke-bin", default=ls.DEFAULT_BIN)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--levels", default="1,4,16,64", help="concurrent streams; the first is the baseline")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (exact)")
    ap.add_argument("--min-seconds", type=float, default=20.0, help="a level starts requests at least this long")
    ap.add_argument("--min-requests-factor", type=int, default=3, help="... and at least this x concurrency")
    ap.add_argument("--max-level-seconds", type=float, default=150.0, help="stop starting requests after this")
    ap.add_argument("--max-load", type=float, default=3.0, help="wait until the 1-min load average is below")
    ap.add_argument("--load-wait", type=float, default=900.0, help="... for at most this many seconds")
    ap.add_argument("--serve-args", default="", help="extra `stoke serve` flags, e.g. '--threads 2'")
    ap.add_argument("--out", default=str(ls.ROOT / "bench/results/cpu_llm_batching.json"))
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    mach = ls.machine()
    quiet = ls.wait_for_quiet(args.max_load, args.load_wait)
    date = ls.now_iso()
    extra = ["--max-num-seqs", str(max(64, max(levels)))] + shlex.split(args.serve_args)
    server = ls.StokeServer(args.stoke_bin, args.model, extra)
    figures = []
    try:
        client = ls.openai_client(server.url)
        # Untimed warm-up: first-touch of weights and buffers, the client's connection pool.
        for i in range(2):
            ls.stream_chat(client, args.model, [{"role": "user", "content": prompt(10_000 + i)}], args.max_tokens, i)
        next_id = 0
        for conc in levels:
            fig = run_level(server, client, args.model, conc, args.max_tokens, args.min_seconds,
                            args.min_requests_factor * conc, args.max_level_seconds, next_id)
            next_id += fig["requests"]
            fig["batching_gain"] = round(fig["output_tokens_per_s"] / figures[0]["output_tokens_per_s"], 2) \
                if figures else 1.0
            figures.append(fig)
            print(json.dumps(fig), flush=True)
    finally:
        server.stop()

    mach["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        **ls.git_commit(),
        "stoke_bin": args.stoke_bin,
        "server": server.ready_line,
        "machine": mach,
        "load_wait": quiet,
        "date": date,
        "settings": {"model": args.model, "api": "streaming chat completions, openai " + __import__("openai").__version__,
                     "max_tokens": args.max_tokens, "ignore_eos": True, "min_tokens": args.max_tokens,
                     "temperature": 0, "levels": levels, "min_seconds": args.min_seconds,
                     "min_requests_factor": args.min_requests_factor,
                     "serve_args": extra},
        "method": __doc__.split("\n\n", 2)[2].split("Writes")[0].strip(),
        "batching_gain": {str(f["concurrency"]): f["batching_gain"] for f in figures},
        "figures": figures,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
