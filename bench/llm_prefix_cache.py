#!/usr/bin/env python3
"""Prefix cache on CPU: time to first token of SmolLM2 requests that share a ~1,000-token system prompt, with
`stoke serve`'s prefix cache on versus off (`--no-prefix-cache`), both servers in one run.

  .venv/bin/python bench/llm_prefix_cache.py [--stoke-bin build/release/apps/stoke/stoke] [--out FILE]
        [--system-tokens 1000] [--requests 20] [--max-tokens 4] [--max-load 3]

Both servers run side by side (an idle server uses no CPU). Each request is the shared system prompt plus a
different short user question, sent as a streaming chat completion with the real `openai` client, exactly
--max-tokens output tokens (ignore_eos + min_tokens), greedy. After one untimed warm-up request per server
(which puts the system prompt into the cache-on server's prefix cache), the timed requests run one at a time,
alternating servers (off/on, then on/off, ...) so that load from other processes drifts into both sides alike.
TTFT = request sent -> first content chunk, measured by the client. The cache-on server's
stoke:prefix_cache_hits_total / stoke:prefix_cache_queries_total (prompt tokens) are read from /metrics, and
each response's usage.prompt_tokens_details.cached_tokens is recorded.
Writes bench/results/cpu_llm_prefix_cache.json = {command, commit, machine, date, settings, figures, ...}.
"""
import argparse
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import llm_server as ls  # noqa: E402

DEPARTMENTS = ["billing", "shipping", "returns", "warranty", "accounts", "security", "privacy", "repairs",
               "subscriptions", "gift cards", "business orders", "accessibility"]
ACTIONS = ["must confirm the customer's order number before discussing", "should never promise a refund for",
           "may offer a ten percent voucher when a customer complains about",
           "must escalate to a human supervisor any dispute about",
           "should summarise the company's policy in two sentences before answering questions on",
           "must not share internal ticket notes about", "should ask for a photo when a customer reports damage in",
           "may extend the deadline by fourteen days for"]
QUESTIONS = [
    "My parcel arrived with a cracked screen. What should I do?", "How long does a refund take?",
    "Can I change the delivery address after ordering?", "Is my warranty still valid after two years?",
    "How do I close my account?", "Someone used my card on your site. Help!",
    "Do you sell my personal data?", "Where is the nearest repair centre?", "How do I cancel my subscription?",
    "My gift card code does not work.", "Can my company pay by invoice?",
    "Is your website usable with a screen reader?", "Why was I charged twice this month?",
    "Can I return an item without the box?", "What does the extended warranty cover?",
    "How do I reset my password?", "Can I pause my subscription for a month?",
    "The courier left my parcel outside in the rain.", "Do gift cards expire?",
    "Can you repair a phone I bought elsewhere?", "How do I download my invoices?",
    "What happens to my data when I delete my account?", "Can I order fifty laptops at a discount?",
    "Why is my order still processing after a week?", "Can I exchange a jumper for a larger size?",
    "My replacement part is the wrong colour.", "Do you ship to Norway?", "How do I add a second user?",
    "Is there a student discount?", "Can I get a paper receipt?", "What is your phone number?",
    "The app logs me out every day.",
]


def rules(n: int) -> list[str]:
    return [f"Rule {i + 1}: an agent in {DEPARTMENTS[i % len(DEPARTMENTS)]} "
            f"{ACTIONS[(i // len(DEPARTMENTS) + i) % len(ACTIONS)]} "
            f"{DEPARTMENTS[(i * 5 + 3) % len(DEPARTMENTS)]} matters (policy {100 + i * 7})."
            for i in range(n)]


def system_prompt(n_rules: int) -> str:
    return ("You are the customer support assistant of Northwind Supplies. Follow every rule below when you "
            "answer; answer briefly and politely.\n" + "\n".join(rules(n_rules)))


def count_tokens(stoke_bin: str, model: str, text: str) -> int:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(text)
        path = f.name
    try:
        out = subprocess.run([stoke_bin, "tokenize", "--model", model, "--no-special", "--file", path],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            sys.exit(f"stoke tokenize failed: {out.stderr}")
        return len(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        os.unlink(path)


def fit_system_prompt(stoke_bin: str, model: str, target: int) -> tuple[str, int]:
    """The shortest rule list whose system prompt has at least `target` tokens (bisection on the count)."""
    lo, hi = 1, 8
    while count_tokens(stoke_bin, model, system_prompt(hi)) < target:
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if count_tokens(stoke_bin, model, system_prompt(mid)) < target:
            lo = mid + 1
        else:
            hi = mid
    text = system_prompt(lo)
    return text, count_tokens(stoke_bin, model, text)


def summary(rs: list[dict]) -> dict:
    ttft = [r["ttft"] for r in rs]
    e2e = [r["end"] - r["start"] for r in rs]
    return {"requests": len(rs),
            "ttft_s": {"p50": round(ls.percentile(ttft, 50), 4), "mean": round(sum(ttft) / len(ttft), 4),
                       "min": round(min(ttft), 4), "max": round(max(ttft), 4)},
            "e2e_s": {"p50": round(ls.percentile(e2e, 50), 4), "mean": round(sum(e2e) / len(e2e), 4)},
            "prompt_tokens": sorted({r["prompt_tokens"] for r in rs}),
            "cached_tokens_per_request": [r["cached_tokens"] for r in rs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stoke-bin", default=ls.DEFAULT_BIN)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--system-tokens", type=int, default=1000, help="target length of the shared system prompt")
    ap.add_argument("--requests", type=int, default=20, help="timed requests per server")
    ap.add_argument("--max-tokens", type=int, default=4, help="output tokens per request (exact)")
    ap.add_argument("--max-load", type=float, default=3.0, help="wait until the 1-min load average is below")
    ap.add_argument("--load-wait", type=float, default=900.0, help="... for at most this many seconds")
    ap.add_argument("--serve-args", default="", help="extra `stoke serve` flags for both servers")
    ap.add_argument("--out", default=str(ls.ROOT / "bench/results/cpu_llm_prefix_cache.json"))
    args = ap.parse_args()
    if args.requests + 1 > len(QUESTIONS):
        sys.exit(f"--requests: at most {len(QUESTIONS) - 1} (distinct questions)")

    system, system_tokens = fit_system_prompt(args.stoke_bin, args.model, args.system_tokens)
    mach = ls.machine()
    quiet = ls.wait_for_quiet(args.max_load, args.load_wait)
    date = ls.now_iso()
    extra = shlex.split(args.serve_args)
    servers = {}
    runs = {"on": [], "off": []}
    try:
        servers["on"] = ls.StokeServer(args.stoke_bin, args.model, extra)
        servers["off"] = ls.StokeServer(args.stoke_bin, args.model, ["--no-prefix-cache", *extra])
        clients = {k: ls.openai_client(s.url) for k, s in servers.items()}

        def ask(which: str, question: str, seed: int) -> dict:
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
            return ls.stream_chat(clients[which], args.model, msgs, args.max_tokens, seed)

        warm = {k: ask(k, QUESTIONS[-1], 0) for k in ("off", "on")}
        before = {k: s.metrics() for k, s in servers.items()}
        cpu0 = {k: s.cpu_seconds() for k, s in servers.items()}
        for i, q in enumerate(QUESTIONS[:args.requests]):
            for which in (("off", "on") if i % 2 == 0 else ("on", "off")):
                runs[which].append(ask(which, q, i + 1))
        after = {k: s.metrics() for k, s in servers.items()}
        cpu = {k: round(s.cpu_seconds() - cpu0[k], 2) for k, s in servers.items()}
        ready = {k: s.ready_line for k, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop()

    figures = {}
    for k in ("on", "off"):
        f = summary(runs[k])
        m0, m1 = before[k], after[k]
        f["warmup_ttft_s"] = round(warm[k]["ttft"], 4)
        f["server_cpu_s"] = cpu[k]
        f["metrics_timed_requests"] = {
            n: m1.get(f"stoke:{n}", 0.0) - m0.get(f"stoke:{n}", 0.0)
            for n in ("prefix_cache_queries_total", "prefix_cache_hits_total", "prompt_tokens_total")}
        f["metrics_total"] = {n: m1.get(f"stoke:{n}", 0.0)
                              for n in ("prefix_cache_queries_total", "prefix_cache_hits_total")}
        figures["prefix_cache_" + k] = f
        print(k, json.dumps(f), flush=True)
    on, off = figures["prefix_cache_on"], figures["prefix_cache_off"]
    ratio = {"ttft_p50_off_over_on": round(off["ttft_s"]["p50"] / on["ttft_s"]["p50"], 2),
             "ttft_mean_off_over_on": round(off["ttft_s"]["mean"] / on["ttft_s"]["mean"], 2)}
    print(json.dumps(ratio))

    mach["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        **ls.git_commit(),
        "stoke_bin": args.stoke_bin,
        "servers": ready,
        "machine": mach,
        "load_wait": quiet,
        "date": date,
        "settings": {"model": args.model,
                     "api": "streaming chat completions, openai " + __import__("openai").__version__,
                     "system_prompt_tokens": system_tokens, "requests_per_server": args.requests,
                     "max_tokens": args.max_tokens, "ignore_eos": True, "min_tokens": args.max_tokens,
                     "temperature": 0, "serve_args": extra},
        "method": __doc__.split("\n\n", 2)[2].split("Writes")[0].strip(),
        "speedup": ratio,
        "figures": figures,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
