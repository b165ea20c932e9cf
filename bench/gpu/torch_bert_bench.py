#!/usr/bin/env python3
"""BERT on the GPU: stoke's CUDA encoder beside PyTorch fp16 eager, on the same random-weight folders.

Run by bench/gpu/bert_bench.sh on the GPU machine (python3 with torch + transformers; no internet). Per shape
(bert-base at seq 128, bert-large at seq 384):

  1. the folder: `stoke model synth --arch bert` when this stoke has it, else transformers
     BertModel(BertConfig(...)) re-initialised so activations are well conditioned (Linear weights
     N(0, 1/in), embeddings N(0, 0.5), LayerNorm 1 +- 0.05), saved as fp16 safetensors + a vocab.txt;
  2. correctness: 64 sequences of mixed lengths through `stoke embed --device cuda --ids-file` vs transformers
     fp32 on the GPU (mean pooling over the mask + L2 normalisation): min / mean cosine; the mean cosine between
     different sequences is reported beside it so a degenerate model (all embeddings alike) shows;
  3. encoder throughput: `stoke embed --device cuda --bench-batch 1,2,...,256 --seq-len N` (the encoder alone,
     ids already tokenised, h2d + compute + d2h) beside PyTorch fp16 eager (model.half().cuda(),
     torch.inference_mode, same random ids, mean pooling + normalisation included, cuda.synchronize timing);
  4. serving (bert-base only): `stoke serve --device cuda` with dynamic batching off vs on, driven by
     `stoke bench --api openai-embeddings` at a few concurrencies: requests/s and p99 per point, and the best
     requests/s of "on" whose p99 is within each "off" point's p99.

Everything goes to $OUT/bert_bench.json (plus the raw stoke bench reports under $OUT/bert_serve_*).
"""
import argparse
import csv
import datetime
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

SHAPES = {
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "bert-large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}
CLS, SEP = 101, 102


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def write_vocab(d, vocab_size):
    """vocab.txt laid out like bert-base-uncased's specials ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102)."""
    toks = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    toks += [f"w{i}" for i in range(vocab_size - len(toks))]
    (d / "vocab.txt").write_text("\n".join(toks) + "\n")
    (d / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))


def make_folder(stoke, shape, d):
    if (d / "config.json").exists() and (d / "model.safetensors").exists():
        return "existing"
    d.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([stoke, "model", "synth", "--arch", "bert", "--shape", shape, "--out", str(d)],
                       capture_output=True, text=True)
    if p.returncode == 0 and (d / "config.json").exists():
        if not (d / "tokenizer.json").exists() and not (d / "vocab.txt").exists():
            write_vocab(d, json.loads((d / "config.json").read_text())["vocab_size"])
        return "stoke model synth"
    log(f"  stoke model synth unavailable ({(p.stderr or p.stdout).strip()[:200]}); using transformers")
    import torch
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, hidden_act="gelu",
                     layer_norm_eps=1e-12, **SHAPES[shape])
    model = BertModel(cfg, add_pooling_layer=False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.normal_(1.0, 0.05)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.05)
            elif "embeddings" in name:
                p.normal_(0.0, 0.5)
            else:  # Linear [out, in]
                p.normal_(0.0, p.shape[1] ** -0.5)
    model.half().save_pretrained(str(d))  # safetensors
    write_vocab(d, cfg.vocab_size)
    return "transformers (re-initialised)"


def load_torch(d, dtype):
    import torch
    from transformers import BertModel
    try:
        m = BertModel.from_pretrained(str(d), dtype=dtype, add_pooling_layer=False)
    except TypeError:  # older transformers: torch_dtype
        m = BertModel.from_pretrained(str(d), torch_dtype=dtype, add_pooling_layer=False)
    return m.cuda().eval()


def torch_pooled(model, ids, mask):
    import torch
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
    m = mask.unsqueeze(-1).float()
    pooled = (out * m).sum(1) / m.sum(1).clamp(min=1)
    return torch.nn.functional.normalize(pooled, p=2, dim=1, eps=1e-12)


def random_rows(n, lo_len, hi_len, vocab, seed):
    import random
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        L = lo_len + (i * (hi_len - lo_len)) // max(n - 1, 1)  # spread over [lo, hi]
        rows.append([CLS] + [rng.randrange(1000, vocab) for _ in range(L - 2)] + [SEP])
    rng.shuffle(rows)
    return rows


# --quantization int8's calibration text (the gate measures on GPL-3): Debian's base-files installs both.
CALIBRATION_DATA = os.environ.get("CALIBRATION_DATA", "/usr/share/common-licenses/GPL-2")


def quant_flag(q):
    """A variant: QUANT[/EPILOGUES[/GEMM_CANDIDATES[/GRAPHS[/ATTENTION]]]] (none/separate, none/fused-tanh,
    none/fused-tanh/16, none/fused-tanh/1/graphs or /nographs: --encoder-cuda-graphs on / off,
    none/fused-tanh/1/graphs/tensor32: --encoder-attention tensor32, fp8, int8)."""
    quant, _, rest = q.partition("/")
    epilogues, _, rest = rest.partition("/")
    cands, _, rest = rest.partition("/")
    graphs, _, attention = rest.partition("/")
    flags = [] if quant == "none" else ["--quantization", quant]
    flags += ["--encoder-cuda-graphs", {"graphs": "on", "nographs": "off"}[graphs]] if graphs else []
    if quant == "int8":  # calibration samples: one per line (docs/precision.md)
        flags += ["--calibration-data", CALIBRATION_DATA]
    flags += ["--encoder-epilogues", epilogues] if epilogues else []
    flags += ["--encoder-attention", attention] if attention else []
    return flags + (["--gemm-candidates", cands] if cands else [])


def correctness(stoke, d, seq_len, env, tmp, quantization="none"):
    import torch
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    rows = random_rows(64, 3, seq_len, vocab, seed=7)
    f = pathlib.Path(tmp) / "ids.json"
    f.write_text(json.dumps(rows))
    p = subprocess.run([stoke, "embed", "--model", str(d), "--device", "cuda", "--ids-file", str(f),
                        "--batch-size", "64", "--max-seq-length", str(seq_len)] + quant_flag(quantization),
                       capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        return {"error": p.stderr[-2000:]}
    got = torch.tensor(json.loads(p.stdout), dtype=torch.float64)
    model = load_torch(d, torch.float32)
    L = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    with torch.inference_mode():
        want32 = torch_pooled(model, ids.cuda(), mask.cuda()).double().cpu()
        want16 = torch_pooled(model.half(), ids.cuda(), mask.cuda()).double().cpu()
    del model
    torch.cuda.empty_cache()
    cos = (got * want32).sum(1) / (got.norm(dim=1) * want32.norm(dim=1))
    cos16 = (want16 * want32).sum(1) / (want16.norm(dim=1) * want32.norm(dim=1))
    sims = want32 @ want32.T
    off = sims[~torch.eye(len(rows), dtype=torch.bool)]
    return {"sequences": len(rows), "lengths": [min(map(len, rows)), max(map(len, rows))],
            "stoke_vs_torch_fp32_min_cosine": cos.min().item(),
            "stoke_vs_torch_fp32_mean_cosine": cos.mean().item(),
            "torch_fp16_vs_fp32_min_cosine": cos16.min().item(),
            "between_sequences_mean_cosine": off.mean().item(),
            "reference": "transformers BertModel fp32 on the GPU, mean pooling over the mask, L2 normalised"}


def stoke_encoder(stoke, d, seq_len, batches, seconds, env, tmp, quantization="none"):
    out = pathlib.Path(tmp) / "enc.json"
    p = subprocess.run([stoke, "embed", "--model", str(d), "--device", "cuda", "--bench-batch",
                        ",".join(map(str, batches)), "--seq-len", str(seq_len), "--max-seq-length", str(seq_len),
                        "--bench-seconds", str(seconds), "--json", str(out)] + quant_flag(quantization),
                       capture_output=True, text=True, env=env, timeout=900)
    log(p.stderr[-3000:])
    if p.returncode != 0:
        return {"error": p.stderr[-2000:]}
    return json.loads(out.read_text())


def time_torch(model, ids, mask, seconds):
    """Two warm-up forwards, then forwards (pooled result copied to the host, as stoke's) for `seconds`, at
    least 3: (iterations, seconds)."""
    import torch
    with torch.inference_mode():
        for _ in range(2):
            torch_pooled(model, ids, mask)
        torch.cuda.synchronize()
        n, t0 = 0, time.perf_counter()
        while n < 3 or (time.perf_counter() - t0 < seconds and n < 10000):
            torch_pooled(model, ids, mask).cpu()
            n += 1
        torch.cuda.synchronize()
        return n, time.perf_counter() - t0


def torch_encoder(d, seq_len, batches, seconds):
    import torch
    model = load_torch(d, torch.float16)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    res = []
    for b in batches:
        ids = torch.randint(min(1000, vocab // 2), vocab, (b, seq_len), generator=g).cuda()
        n, secs = time_torch(model, ids, torch.ones_like(ids), seconds)
        res.append({"batch": b, "iters": n, "ms_per_batch": secs * 1e3 / n, "seqs_per_s": b * n / secs})
        log(f"  torch fp16 batch {b:4d}: {b * n / secs:9.1f} seq/s, {secs * 1e3 / n:8.3f} ms/batch")
    impl = getattr(model.config, "_attn_implementation", "?")
    del model
    torch.cuda.empty_cache()
    return {"framework": f"torch {torch.__version__} fp16 eager", "attn_implementation": impl, "results": res}


def squad_like_lengths(n, max_len, seed=5):
    """n sequence lengths shaped like SQuAD v1.1 at max_seq_length 384 (question + context windows): a normal
    around 170 tokens (sd 80), clipped to [24, max_len] (about 0.4 % reach max_len at 384). Synthetic: the
    shape of the distribution, not SQuAD's text."""
    import random
    rng = random.Random(seed)
    return [max(24, min(max_len, int(round(rng.gauss(170, 80))))) for _ in range(n)]


def stoke_varlen(stoke, d, lengths, batches, seconds, env, tmp, variant="none"):
    """stoke's encoder on packed variable-length batches (--bench-lengths: no padding)."""
    out = pathlib.Path(tmp) / "varlen.json"
    p = subprocess.run([stoke, "embed", "--model", str(d), "--device", "cuda", "--bench-batch",
                        ",".join(map(str, batches)), "--bench-lengths", ",".join(map(str, lengths)),
                        "--max-seq-length", str(max(lengths)), "--bench-seconds", str(seconds), "--json",
                        str(out)] + quant_flag(variant), capture_output=True, text=True, env=env, timeout=900)
    log(p.stderr[-1500:])
    if p.returncode != 0:
        return {"error": p.stderr[-2000:]}
    return json.loads(out.read_text())


def torch_varlen(d, lengths, batches, seconds):
    """PyTorch fp16 eager on the same lengths, padded to the batch's longest with an attention mask (what a
    framework without packed sequences runs)."""
    import torch
    model = load_torch(d, torch.float16)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(2)
    res = []
    for b in batches:
        lens = [lengths[i % len(lengths)] for i in range(b)]
        L = max(lens)
        ids = torch.randint(min(1000, vocab // 2), vocab, (b, L), generator=g)
        mask = torch.zeros(b, L, dtype=torch.long)
        for i, n in enumerate(lens):
            mask[i, :n] = 1
        n, secs = time_torch(model, (ids * mask).cuda(), mask.cuda(), seconds)
        res.append({"batch": b, "padded_to": L, "tokens": sum(lens), "iters": n, "seqs_per_s": b * n / secs})
        log(f"  torch fp16 varlen batch {b:4d} (padded to {L}): {b * n / secs:9.1f} seq/s")
    del model
    torch.cuda.empty_cache()
    return {"framework": f"torch {torch.__version__} fp16 eager, padded + attention mask", "results": res}


def get_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


class Server:
    def __init__(self, stoke, model_file, env, log_path, device="cuda"):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([stoke, "serve", "--model", str(model_file), "--host", "127.0.0.1",
                                      "--port", "0", "--grpc-port", "0", "--device", device],
                                     stdout=subprocess.DEVNULL, stderr=self._log, env=env)
        deadline = time.time() + 180
        self.url = None
        self.grpc = None
        while time.time() < deadline:
            text = pathlib.Path(log_path).read_text(errors="replace")
            m = re.search(r"listening on (http://[^ ]+) ", text)
            if m and self.url is None:
                self.url = m.group(1)
            g = re.search(r"gRPC listening on (\S+)", text)
            if g:
                self.grpc = g.group(1)
            if self.url and "ready on" in text:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"stoke serve exited {self.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("stoke serve not ready in 180 s:\n" + pathlib.Path(log_path).read_text()[-3000:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def perf_analyzer_points(pa, grpc, out_csv, concurrency, env):
    """Triton's perf_analyzer over KServe v2 gRPC on the model `bert` (text input, random 32-character strings):
    [{concurrency, infer_per_s, p50_ms, p99_ms, server_queue_us, server_compute_us}] or {"error"}."""
    pa_env = dict(env)
    lib = pathlib.Path(pa).resolve().parent
    pa_env["LD_LIBRARY_PATH"] = str(lib) + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    args = [pa, "-m", "bert", "-u", grpc, "-i", "grpc", "--concurrency-range", concurrency,
            "--string-length", "32", "--measurement-interval", "1500", "--stability-percentage", "50",
            "--max-trials", "8", "--percentile", "99", "-f", str(out_csv)]
    p = subprocess.run(args, capture_output=True, text=True, env=pa_env, timeout=600)
    if p.returncode != 0 or not out_csv.exists():
        return {"error": (p.stdout + p.stderr)[-2000:], "command": " ".join(args)}
    rows = sorted(csv.DictReader(out_csv.open()), key=lambda r: int(r["Concurrency"]))
    return {"command": " ".join(args), "points": [{
        "concurrency": int(r["Concurrency"]), "infer_per_s": float(r["Inferences/Second"]),
        "p50_ms": float(r["p50 latency"]) / 1e3, "p99_ms": float(r["p99 latency"]) / 1e3,
        "server_queue_us": int(r["Server Queue"]), "server_compute_us": int(r["Server Compute Infer"])}
        for r in rows]}


def at_equal_p99(off, on, rate):
    """For each batching-off point: the best batching-on rate whose p99 is within the off point's p99."""
    return [{"p99_budget_ms": o["p99_ms"], "off": o[rate],
             "on_best": max([q[rate] for q in on if q["p99_ms"] <= o["p99_ms"]], default=None)} for o in off]


def serving(stoke, d, out_dir, env, concurrency, duration, input_len, device="cuda", perf_analyzer=None,
            pa_concurrency="1:65:32"):
    configs = {
        "batching_off": {"max_batch_size": 64},
        "batching_on": {"max_batch_size": 64, "dynamic_batching": {"max_queue_delay_microseconds": 0}},
        "batching_on_2_instances": {"max_batch_size": 64, "dynamic_batching": {"max_queue_delay_microseconds": 0},
                                    "instance_group": [{"count": 2}]},
    }
    res = {}
    for name, cfg in configs.items():
        mf = out_dir / f"bert_serve_{name}.json"
        mf.write_text(json.dumps({"type": "bert", "model": str(d), "name": "bert", "device": device, **cfg}))
        try:
            srv = Server(stoke, mf, env, out_dir / f"bert_serve_{name}.log", device)
        except RuntimeError as e:
            res[name] = {"error": str(e)[-2000:]}
            continue
        try:
            rep_dir = out_dir / f"bert_serve_{name}"
            p = subprocess.run([stoke, "bench", "--url", srv.url, "--api", "openai-embeddings", "--model", "bert",
                                "--input-len", str(input_len), "--concurrency", ",".join(map(str, concurrency)),
                                "--warmup", "2", "--window", "2", "--duration", str(duration), "--quiet",
                                "--output-dir", str(rep_dir)],
                               capture_output=True, text=True, env=env, timeout=900)
            if p.returncode not in (0, 3) or not (rep_dir / "bench.json").exists():
                res[name] = {"error": (p.stdout + p.stderr)[-2000:]}
                continue
            rep = json.loads((rep_dir / "bench.json").read_text())
            res[name] = {"config": cfg, "points": [{
                "concurrency": pt["load"], "valid": pt["valid"], "stable": pt["stable"],
                "requests_per_s": pt["throughput"]["requests_per_s"],
                "mean_input_tokens": pt["throughput"]["mean_input_tokens"],
                "p50_ms": pt["latency_ms"]["p50"], "p99_ms": pt["latency_ms"]["p99"],
                "errors": pt["requests"]["errors"]} for pt in rep["points"]]}
            log(f"  serve {name}: " + ", ".join(f"c={q['concurrency']}: {q['requests_per_s']:.0f} req/s "
                                                f"p99 {q['p99_ms']:.1f} ms" for q in res[name]["points"]))
            if perf_analyzer and srv.grpc and name in ("batching_off", "batching_on"):
                pa = perf_analyzer_points(perf_analyzer, srv.grpc, out_dir / f"pa_{name}.csv", pa_concurrency, env)
                res[name]["perf_analyzer_grpc"] = pa
                log(f"  perf_analyzer {name}: " + (pa.get("error", "")[-300:] or ", ".join(
                    f"c={q['concurrency']}: {q['infer_per_s']:.0f}/s p99 {q['p99_ms']:.2f} ms"
                    for q in pa["points"])))
        finally:
            srv.stop()
    off, on = res.get("batching_off", {}).get("points"), res.get("batching_on", {}).get("points")
    if off and on:
        res["at_equal_p99"] = at_equal_p99(off, on, "requests_per_s")
    pa_off = res.get("batching_off", {}).get("perf_analyzer_grpc", {}).get("points")
    pa_on = res.get("batching_on", {}).get("perf_analyzer_grpc", {}).get("points")
    if pa_off and pa_on:
        res["perf_analyzer_at_equal_p99"] = at_equal_p99(pa_off, pa_on, "infer_per_s")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stoke", default=".bundle/bin/stoke")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/stoke_gpu_out"))
    ap.add_argument("--work", default=None, help="where the random model folders go (default: a temp dir)")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--seconds", type=float, default=0.6, help="timed seconds per batch size and framework")
    ap.add_argument("--shapes", default="bert-base:128,bert-large:384")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--serve-duration", type=float, default=8)
    ap.add_argument("--no-serve", action="store_true")
    ap.add_argument("--perf-analyzer", default="",
                    help="perf_analyzer binary (bench/gpu/pack_perf_analyzer.sh puts one in the bundle): the "
                         "serving comparison also runs it over KServe gRPC, batching off vs on")
    ap.add_argument("--pa-concurrency", default="1:65:32", help="perf_analyzer --concurrency-range")
    ap.add_argument("--varlen", default="",
                    help="batch sizes for a SQuAD-like variable-length run on the seq-384 shape (e.g. 64,256): "
                         "stoke packed vs stoke padded (its fixed seq-384 rows) vs PyTorch padded + mask")
    ap.add_argument("--quantization", default="none",
                    help="stoke variants to measure, comma-separated: a weight precision (none, fp8, int8: calibrated on "
                         "$CALIBRATION_DATA, default Debian's GPL-2), optionally "
                         "with /EPILOGUES (none/separate, none/fused-tanh: --encoder-epilogues); each gets its "
                         "own correctness and encoder rows (stoke_fp8, correctness_fp8, stoke_fp8_over_torch; "
                         "none/separate -> stoke_none_separate)")
    args = ap.parse_args()
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stoke = str(pathlib.Path(args.stoke).resolve())
    env = dict(os.environ)
    if os.path.isdir("/usr/local/cuda/lib64"):
        env["LD_LIBRARY_PATH"] = "/usr/local/cuda/lib64" + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    batches = [int(x) for x in args.batches.split(",")]
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="stoke-bert-"))
    result = {"command": " ".join(sys.argv), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "stoke": stoke, "shapes": {}}
    try:
        import torch
        result["gpu"] = torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001
        result["gpu"] = f"unknown ({e})"
    with tempfile.TemporaryDirectory() as tmp:
        for item in args.shapes.split(","):
            shape, seq = item.split(":")
            seq = int(seq)
            d = work / shape
            t0 = time.time()
            log(f"=== {shape} seq {seq}")
            r = {"seq_len": seq, "folder": str(d), "made_by": make_folder(stoke, shape, d)}
            r["folder_seconds"] = time.time() - t0
            quants = args.quantization.split(",")
            sfx = {q: "" if q == "none" else "_" + q.replace("/", "_") for q in quants}
            for q in quants:
                log(f"  correctness ({q})")
                r["correctness" + sfx[q]] = correctness(stoke, d, seq, env, tmp, q)
                log(f"  {r['correctness' + sfx[q]]}")
                log(f"  stoke encoder ({q})")
                r["stoke" + sfx[q]] = stoke_encoder(stoke, d, seq, batches, args.seconds, env, tmp, q)
            log("  torch encoder")
            r["torch"] = torch_encoder(d, seq, batches, args.seconds)
            ts = {x["batch"]: x["seqs_per_s"] for x in r["torch"]["results"]}
            for q in quants:
                if "results" in r["stoke" + sfx[q]]:
                    key = "stoke_over_torch" if q == "none" else f"stoke{sfx[q]}_over_torch"
                    r[key] = {x["batch"]: x["seqs_per_s"] / ts[x["batch"]]
                              for x in r["stoke" + sfx[q]]["results"] if x["batch"] in ts}
            if args.varlen and seq == 384:
                vb = [int(x) for x in args.varlen.split(",")]
                lengths = squad_like_lengths(max(vb), seq)
                r["varlen_lengths"] = {"n": len(lengths), "mean": sum(lengths) / len(lengths),
                                       "max": max(lengths), "at_max": sum(1 for x in lengths if x == seq),
                                       "distribution": squad_like_lengths.__doc__.split("(")[0].strip()}
                log(f"  varlen: {r['varlen_lengths']}")
                r["stoke_varlen_packed"] = stoke_varlen(stoke, d, lengths, vb, args.seconds, env, tmp)
                r["torch_varlen_padded"] = torch_varlen(d, lengths, vb, args.seconds)
            if shape == "bert-base" and not args.no_serve:
                log("  serving")
                r["serving"] = serving(stoke, d, out_dir, env, [int(c) for c in args.concurrency.split(",")],
                                       args.serve_duration, seq - 2, perf_analyzer=args.perf_analyzer or None,
                                       pa_concurrency=args.pa_concurrency)
            result["shapes"][shape] = r
            (out_dir / "bert_bench.json").write_text(json.dumps(result, indent=1))
    log(f"wrote {out_dir / 'bert_bench.json'}")


if __name__ == "__main__":
    main()
