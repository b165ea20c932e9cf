#!/usr/bin/env python3
"""CPU sentences/s of all-MiniLM-L6-v2 through `stoke embed` (BertEncoder), batches of 1, 8 and 32, for short
(~12-token) and ~128-token sentences; optionally sentence-transformers in the same run as the peer.

  .venv/bin/python bench/cpu_minilm.py [--stoke build/release/apps/stoke/stoke] [--threads 2]
        [--st-python /tmp/stvenv/bin/python]      # peer: a venv with sentence-transformers (not needed by CI)

Each point is one `stoke embed --bench-repeat R` process: one untimed warm-up pass, then R timed passes over
the same B texts (tokenisation included, model load excluded); sentences/s = B * R / seconds. The peer is
timed the same way (model.encode of the same texts, batch_size B, after one warm-up call). cpu_seconds next to
seconds shows contention: with T threads, cpu_seconds well below T * seconds means other processes had the
cores (check machine.loadavg_* too); sentences_per_cpu_s is then the steadier figure (an upper bound on
sentences/s per core; stoke's pool threads sleep when idle, torch's OpenMP threads spin, which counts against it).
Writes bench/results/cpu_minilm_<date>.json = {command, commit, machine, date, figures}.
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import random
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODEL_DIR = pathlib.Path(os.environ.get("STOKE_MODEL_DIR", pathlib.Path.home() / ".cache/stoke/models"))

SUBJECTS = ["The old farmer", "A young engineer", "My neighbour", "The tired doctor", "Our new teacher",
            "The small dog", "A famous writer", "The city council", "Her little brother", "The night guard"]
VERBS = ["repaired", "painted", "described", "sold", "carried", "photographed", "measured", "cleaned",
         "borrowed", "discovered"]
OBJECTS = ["the broken fence", "a wooden boat", "the quiet library", "an ancient map", "the red bicycle",
           "a strange machine", "the kitchen table", "a heavy suitcase", "the garden wall", "an empty bottle"]
PLACES = ["near the river", "after lunch", "in the rain", "before sunrise", "at the market",
          "behind the school", "last winter", "on Sunday", "by the station", "in the village"]


def sentences(n_tokens: int, count: int, tokenizer, seed: int) -> list[str]:
    """`count` distinct texts of about `n_tokens` tokens ([CLS]/[SEP] included)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words: list[str] = []
        text = ""
        while True:
            clause = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(PLACES)}."
            cand = (text + " " + clause).strip()
            if len(tokenizer.encode(cand).ids) > n_tokens:
                break
            text = cand
        # Fill up to the target with single words of the next clause.
        for w in clause.split():
            cand = text + " " + w
            if len(tokenizer.encode(cand).ids) > n_tokens:
                break
            text = cand
        out.append(text)
    return out


def run_stoke(stoke: str, model: str, texts: list[str], batch: int, threads: int, min_seconds: float) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write("\n".join(texts) + "\n")
        path = f.name
    try:
        repeat = 2
        while True:
            cmd = [stoke, "embed", "--model", model, "--threads", str(threads), "--batch-size", str(batch),
                   "--bench-repeat", str(repeat), "--file", path]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                sys.exit(f"stoke embed failed: {proc.stderr}")
            timing = json.loads(proc.stderr.strip().splitlines()[-1])
            if timing["seconds"] >= min_seconds or repeat >= 4096:
                return timing
            repeat = max(repeat * 2, int(repeat * min_seconds / max(timing["seconds"], 1e-3) * 1.2))
    finally:
        os.unlink(path)


PEER = r"""
import json, sys, time, os, resource
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from sentence_transformers import SentenceTransformer
cfg = json.loads(sys.stdin.read())
torch.set_num_threads(cfg["threads"])
m = SentenceTransformer(cfg["model"], device="cpu", local_files_only=True)
res = []
for job in cfg["jobs"]:
    texts, b = job["texts"], job["batch"]
    with torch.inference_mode():
        m.encode(texts, batch_size=b, normalize_embeddings=True)
        repeat = 2
        while True:
            u0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            for _ in range(repeat):
                m.encode(texts, batch_size=b, normalize_embeddings=True)
            dt = time.perf_counter() - t0
            u1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)
            if dt >= cfg["min_seconds"] or repeat >= 4096:
                break
            repeat = max(repeat * 2, int(repeat * cfg["min_seconds"] / max(dt, 1e-3) * 1.2))
    res.append({"seconds": dt, "cpu_seconds": cpu, "repeat": repeat, "sentences_per_s": len(texts) * repeat / dt})
import sentence_transformers
print(json.dumps({"version": f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}",
                  "results": res}))
"""


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(),
            "loadavg_before": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stoke", default=os.environ.get("STOKE_BIN", str(ROOT / "build/release/apps/stoke/stoke")))
    ap.add_argument("--model", default=str(MODEL_DIR / "all-minilm-l6-v2"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--min-seconds", type=float, default=3.0, help="timed seconds per point")
    ap.add_argument("--st-python", help="python of a venv with sentence-transformers: measure it as the peer")
    ap.add_argument("--out", help="result file (default bench/results/cpu_minilm_<date>.json)")
    args = ap.parse_args()

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(pathlib.Path(args.model) / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    batches = [int(b) for b in args.batches.split(",")]
    shapes = {"short": 12, "long": 128}
    jobs = []
    for kind, n_tok in shapes.items():
        texts = sentences(n_tok, max(batches), tok, seed=n_tok)
        for b in batches:
            jobs.append({"kind": kind, "target_tokens": n_tok, "batch": b, "texts": texts[:b]})

    started = datetime.datetime.now(datetime.timezone.utc)
    mach = machine()
    figures = []
    for job in jobs:
        t = run_stoke(args.stoke, args.model, job["texts"], job["batch"], args.threads, args.min_seconds)
        fig = {"engine": "stoke", "kind": job["kind"], "batch": job["batch"],
               "tokens_per_sentence": t["tokens"] / len(job["texts"]), "threads": t["threads"],
               "repeat": t["repeat"], "seconds": round(t["seconds"], 4),
               "cpu_seconds": round(t["cpu_seconds"], 4),
               "sentences_per_cpu_s": round(len(job["texts"]) * t["repeat"] / t["cpu_seconds"], 2),
               "sentences_per_s": round(t["sentences_per_s"], 2),
               "tokens_per_s": round(t["tokens"] * t["repeat"] / t["seconds"], 1)}
        figures.append(fig)
        print(json.dumps(fig), flush=True)
    peer_version = None
    if args.st_python:
        cfg = {"model": args.model, "threads": args.threads, "min_seconds": args.min_seconds,
               "jobs": [{"texts": j["texts"], "batch": j["batch"]} for j in jobs]}
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
        proc = subprocess.run([args.st_python, "-c", PEER], input=json.dumps(cfg), capture_output=True,
                              text=True, env=env, timeout=3600)
        if proc.returncode != 0:
            sys.exit(f"peer failed: {proc.stderr[-2000:]}")
        peer = json.loads(proc.stdout.strip().splitlines()[-1])
        peer_version = peer["version"]
        for job, r, own in zip(jobs, peer["results"], list(figures)):
            fig = {"engine": "sentence-transformers", "kind": job["kind"], "batch": job["batch"],
                   "tokens_per_sentence": own["tokens_per_sentence"], "threads": args.threads,
                   "repeat": r["repeat"], "seconds": round(r["seconds"], 4),
                   "cpu_seconds": round(r["cpu_seconds"], 4),
                   "sentences_per_cpu_s": round(len(job["texts"]) * r["repeat"] / r["cpu_seconds"], 2),
                   "sentences_per_s": round(r["sentences_per_s"], 2)}
            figures.append(fig)
            print(json.dumps(fig), flush=True)

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    mach["loadavg_after"] = os.getloadavg()
    result = {
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "commit": commit,
        "machine": mach,
        "date": started.isoformat(timespec="seconds"),
        "model": "all-MiniLM-L6-v2 (fp32)",
        "peer": peer_version,
        "method": "one process per point; one untimed warm-up pass, then R timed passes over the same B texts; "
                  "tokenisation included, model load excluded",
        "figures": figures,
    }
    out = pathlib.Path(args.out) if args.out else ROOT / "bench/results" / f"cpu_minilm_{started:%Y-%m-%d}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
