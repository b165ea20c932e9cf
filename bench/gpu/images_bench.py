#!/usr/bin/env python3
"""Image classifiers on the GPU machine (issue 19), run by bench/gpu/images.sh after the gpu test.

  1. Models: torchvision's ResNet-50 and MobileNetV2 with seeded random weights, made to give spread logits
     (BatchNorm running statistics recalibrated on real photos, bench/gpu/photos/, and the classifier scaled
     to logits of standard deviation 4: random initialisation alone gave MobileNetV2 scores of ~1e-8, so top-1
     checks compared noise), exported to ONNX (224x224, 1000 classes, dynamic batch) into --models (kept:
     images.sh hands them to stoke_cnn_cuda_test first), and checked against onnxruntime on the photos.
  2. stoke serve --device cuda (the GPU CNN executor, fp16): FP32 tensors through "<name>-tensor" (KServe v2
     REST, binary tensor extension, urllib only), one request of `batch` rows at a time, batch 1, 8, 32, 64
     (--max-body-bytes 64MiB: a batch of 64 preprocessed images is 38.5 MB whatever the protocol).
     Per point: end-to-end images/s, the mean ledger stages per request (/v1/debug/requests), and
     compute_images_per_s = batch / the ledger's compute (the GPU time of the CNN alone, CUDA events: the figure
     to set beside PyTorch's, whose tensors are already on the device). "best" = the batch with the highest
     compute_images_per_s.
  3. ResNet-50 on PNG bytes (500x375 photos-sized, batch 8): --preprocess cpu against --preprocess gpu, the
     ledger's preprocess / h2d / compute / d2h split for each.
  4. PyTorch eager fp16 channels-last on the GPU, batch 1, 8, 32, 64, cuda.synchronize timing; torch.compile
     (default mode) at batch 1 and 64 while the time budget lasts (--budget-s).
  5. Checks: stoke's GPU scores against PyTorch fp32 on the GPU on the same tensors and weights (max |diff|
     relative to the scores' range, top-1 agreement), and on the real photos against onnxruntime (CPU) on the
     exported file: top-1 identical, max |logit difference|.
  --jpeg-p99 (a separate call from images.sh): ResNet-50 on JPEG photos (bench/gpu/photos/ scaled to
     1920x1280, batch-1 requests), --preprocess cpu vs gpu, `stoke bench --bytes-input` at concurrency 1..256;
     requests/s of each at the highest concurrency whose p99 meets each bound (equal p99), and
     `stoke doctor --bytes-input` against each (host_bound or not).
  --with-cpu adds stoke serve on the host's CPU (batch 1, 8) for the CPU-vs-GPU ledger comparison.

Output: $OUT/images_bench.json; the last line on stdout is the JSON summary (figures by engine/model/batch,
best batches, checks, skipped).
"""
import argparse
import datetime
import json
import os
import pathlib
import re
import struct
import subprocess
import sys
import time
import urllib.request
import zlib

import numpy as np

T0 = time.time()
BATCHES = (1, 8, 32, 64)


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def have(module):
    try:
        __import__(module)
        return True
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False


# --- models --------------------------------------------------------------------------------------------------


PHOTOS = pathlib.Path(__file__).resolve().parent / "photos"
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def photo_tensors():
    """bench/gpu/photos/*.jpg as ImageNet inputs [N, 3, 224, 224] (shorter side 256, centre crop, normalised)
    plus their mirror images: 8 real photos, the same each call."""
    from PIL import Image
    xs = []
    for f in sorted(PHOTOS.glob("*.jpg")):
        im = Image.open(f).convert("RGB")
        w, h = im.size
        k = 256 / min(w, h)
        im = im.resize((max(224, round(w * k)), max(224, round(h * k))), Image.BILINEAR)
        w, h = im.size
        left, top = (w - 224) // 2, (h - 224) // 2
        a = (np.asarray(im.crop((left, top, left + 224, top + 224)), np.float32) / 255 - MEAN) / STD
        xs += [a, a[:, ::-1]]
    return np.ascontiguousarray(np.stack(xs).transpose(0, 3, 1, 2))


def torch_model(name):
    """torchvision's model with seeded random weights, the same each call, made to give spread logits: the
    BatchNorm running statistics are recalibrated on the photos (a cumulative average over them, in train
    mode for the BN layers only: the random init's statistics (mean 0, variance 1) shrink MobileNetV2's
    activations layer after layer to scores of ~1e-8), then the last Linear is scaled so the photos' logits
    have a standard deviation of 4 (so top-1 has margins that fp16 cannot flip by chance)."""
    import torch
    import torchvision
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.from_numpy(photo_tensors())
    bns = [b for b in m.modules() if isinstance(b, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for b in bns:
            b.reset_running_stats()
            b.momentum = None  # cumulative average
            b.train()
        m(x)
        m.eval()
        fc = [l for l in m.modules() if isinstance(l, torch.nn.Linear)][-1]
        k = 4.0 / float(m(x).std())
        fc.weight.mul_(k)
        fc.bias.mul_(k)
    return m


def export_models(models_dir, skipped):
    """{name: .onnx path} for resnet50 and mobilenet_v2 at 224x224 (reused when already there)."""
    import torch
    out = {}
    for name in ("resnet50", "mobilenet_v2"):
        p = models_dir / f"{name}.onnx"
        if not p.exists():
            kw = dict(input_names=["input"], output_names=["scores"], opset_version=13,
                      dynamic_axes={"input": {0: "N"}, "scores": {0: "N"}})
            try:
                try:
                    torch.onnx.export(torch_model(name), torch.randn(1, 3, 224, 224), str(p), dynamo=False, **kw)
                except TypeError:  # older torch: no dynamo argument
                    torch.onnx.export(torch_model(name), torch.randn(1, 3, 224, 224), str(p), **kw)
            except Exception as e:  # noqa: BLE001 - e.g. the exporter wants a package this host lacks
                skipped.append(f"torch.onnx.export {name}: {e!r}"[:500])
                continue
        out[name] = p
    return out


# --- stoke serve ---------------------------------------------------------------------------------------------


class Server:
    def __init__(self, stoke, model, log_path, extra):
        self.log_path = log_path
        cmd = [stoke, "serve", "--model", str(model), "--port", "0", "--grpc-port", "-1",
               "--max-batch-size", str(max(BATCHES)), "--max-queue-delay-us", "0"] + extra
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"))
        deadline = time.time() + 180
        while time.time() < deadline:
            text = pathlib.Path(log_path).read_text(errors="replace")
            if "ready on" in text:
                self.url = "http://127.0.0.1:" + re.search(r"listening on http://[^:]+:(\d+)", text).group(1)
                return
            if self.proc.poll() is not None:
                raise RuntimeError(text[-3000:])
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("stoke serve not ready in 180 s")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)

    def infer(self, model, name, datatype, shape, payload):
        """KServe v2 REST with the binary tensor extension; returns scores [N, C]."""
        header = json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": shape,
                                         "parameters": {"binary_data_size": len(payload)}}],
                             "outputs": [{"name": "scores", "parameters": {"binary_data": True}}]}).encode()
        req = urllib.request.Request(f"{self.url}/v2/models/{model}/infer", data=header + payload, method="POST",
                                     headers={"Inference-Header-Content-Length": str(len(header)),
                                              "Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=300) as r:
            hlen = int(r.headers["Inference-Header-Content-Length"])
            data = r.read()
        body = json.loads(data[:hlen])
        shape = body["outputs"][0]["shape"]
        return np.frombuffer(data[hlen:], np.float32).reshape(shape)

    def ledger(self, model, n):
        with urllib.request.urlopen(f"{self.url}/v1/debug/requests?model={model}&limit={n}", timeout=60) as r:
            reqs = json.loads(r.read())["requests"]
        out = {}
        for k in ("queue", "preprocess", "h2d", "compute", "d2h", "postprocess"):
            vals = [q["stages_ms"].get(k, 0.0) for q in reqs]
            out[k + "_ms"] = round(float(np.mean(vals)), 3) if vals else None
        return out


def png_bytes(h, w, seed):
    """An RGB PNG from the standard library only (a smooth pattern plus noise)."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) * 127 // (w + h))], -1)
    img = np.clip(img + rng.randint(-20, 20, img.shape), 0, 255).astype(np.uint8)
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def bytes_tensor(items):
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def tensor(batch):
    return np.random.RandomState(batch).randn(batch, 3, 224, 224).astype(np.float32)


def stoke_tensor_figures(stoke, name, path, out_dir, device, batches, reps, figures, scores, conv_backend=""):
    # A batch of 64 preprocessed 224x224 images is 64 * 3 * 224 * 224 * 4 = 38.5 MB on the wire, over the
    # default 8 MiB --max-body-bytes (413); the limit covers REST bodies and gRPC messages alike, so gRPC would
    # not avoid it. A client that sends preprocessed FP32 batches raises the limit, as here; encoded JPEGs
    # (the image form, --jpeg-p99 below) are ~100x smaller and fit the default.
    extra = ["--device", device, "--max-body-bytes", "64MiB"] + (
        ["--threads", str(os.cpu_count())] if device == "cpu" else [])
    engine = f"stoke serve --device {device}"
    if conv_backend and device == "cuda":  # --conv-backends: one server per backend
        extra += ["--conv-backend", conv_backend]
        engine += f" --conv-backend {conv_backend}"
    server = Server(stoke, path, out_dir / f"serve_{name}_{device}{'_' + conv_backend if conv_backend else ''}.log",
                    extra)
    try:
        for batch in batches:
            x = tensor(batch)
            served = f"{name}-tensor"
            n = max(3, reps // batch)
            server.infer(served, "input", "FP32", list(x.shape), x.tobytes())  # warm-up (plans, buffers)
            t0 = time.perf_counter()
            for _ in range(n):
                got = server.infer(served, "input", "FP32", list(x.shape), x.tobytes())
            secs = time.perf_counter() - t0
            led = server.ledger(served, n)
            fig = {"engine": engine, "model": name, "input": "FP32 tensors over REST",
                   "batch": batch, "images_per_s": round(n * batch / secs, 1), "ledger": led}
            if led.get("compute_ms"):
                fig["compute_images_per_s"] = round(batch / (led["compute_ms"] / 1e3), 1)
            scores[(name, device, batch)] = got
            log(f"  {fig['engine']} {name} b{batch}: {fig['images_per_s']} images/s end to end, "
                f"{fig.get('compute_images_per_s')} images/s compute; {led}")
            figures.append(fig)
        photos = photo_tensors()  # the real photos, for the top-1 checks against onnxruntime and PyTorch
        scores[(name, device, "photos")] = server.infer(f"{name}-tensor", "input", "FP32", list(photos.shape),
                                                        photos.tobytes())
    finally:
        server.stop()


def stoke_png_figures(stoke, name, path, out_dir, reps, figures):
    batch = 8
    imgs = [png_bytes(375, 500, i) for i in range(batch)]
    payload = bytes_tensor(imgs)
    for pre in ("cpu", "gpu"):
        server = Server(stoke, path, out_dir / f"serve_{name}_png_{pre}.log",
                        ["--device", "cuda", "--preprocess", pre, "--threads", str(os.cpu_count())])
        try:
            server.infer(name, "image", "BYTES", [batch, 1], payload)
            n = max(3, reps // batch)
            t0 = time.perf_counter()
            for _ in range(n):
                server.infer(name, "image", "BYTES", [batch, 1], payload)
            secs = time.perf_counter() - t0
            fig = {"engine": f"stoke serve --device cuda --preprocess {pre}", "model": name,
                   "input": "PNG bytes 500x375", "batch": batch, "images_per_s": round(n * batch / secs, 1),
                   "ledger": server.ledger(name, n)}
            log(f"  {fig['engine']} {name} b{batch}: {fig['images_per_s']} images/s {fig['ledger']}")
            figures.append(fig)
        finally:
            server.stop()


# --- PyTorch -------------------------------------------------------------------------------------------------


def torch_time(fn, x, n):
    import torch
    with torch.inference_mode():
        for _ in range(3):
            fn(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn(x)
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def torch_figures(name, reps, budget_s, figures, skipped):
    import torch
    mm = torch_model(name).to(device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    for batch in BATCHES:
        x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        n = max(10, reps * 4 // batch)
        secs = torch_time(mm, x, n)
        fig = {"engine": "pytorch eager cuda fp16", "model": name, "input": "tensors on the device",
               "batch": batch, "images_per_s": round(n * batch / secs, 1)}
        log(f"  {fig['engine']} {name} b{batch}: {fig['images_per_s']} images/s")
        figures.append(fig)
    for batch in (1, 64):
        if time.time() - T0 > budget_s * 0.6:
            skipped.append(f"torch.compile {name} b{batch}: over 60% of the {budget_s} s budget already")
            continue
        try:
            t0 = time.time()
            cm = torch.compile(mm)
            x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16).to(
                memory_format=torch.channels_last)
            with torch.inference_mode():
                cm(x)
            compile_s = time.time() - t0
            n = max(10, reps * 4 // batch)
            secs = torch_time(cm, x, n)
            fig = {"engine": "pytorch torch.compile cuda fp16", "model": name, "input": "tensors on the device",
                   "batch": batch, "images_per_s": round(n * batch / secs, 1), "compile_s": round(compile_s, 1)}
            log(f"  {fig['engine']} {name} b{batch}: {fig['images_per_s']} images/s (compiled in {compile_s:.0f} s)")
            figures.append(fig)
        except Exception as e:  # noqa: BLE001 - inductor may lack a compiler on the host
            skipped.append(f"torch.compile {name}: {e!r}"[:400])
            break
    del mm


def diff_check(got, ref):
    rng = float(ref.max() - ref.min())
    top2 = np.sort(ref, 1)[:, -2:]
    return {"max_abs_diff": round(float(np.abs(got - ref).max()), 5), "score_range": round(rng, 4),
            "relative": round(float(np.abs(got - ref).max()) / max(rng, 1e-6), 5),
            "min_top1_margin": round(float((top2[:, 1] - top2[:, 0]).min()), 4),
            "top1_identical_rows": f"{int((got.argmax(1) == ref.argmax(1)).sum())}/{len(ref)}"}


def check_scores(name, path, scores, checks):
    """stoke (GPU) against PyTorch fp32 on the GPU (same weights, same tensors), and on the real photos against
    onnxruntime (CPU) running the exported file; also onnxruntime against PyTorch (the export itself)."""
    import torch
    m = torch_model(name).cuda()
    photos = photo_tensors()
    with torch.inference_mode():
        torch_photos = m(torch.from_numpy(photos).cuda()).float().cpu().numpy()
    ort_photos = None
    if have("onnxruntime"):
        import onnxruntime
        ort_photos = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
            None, {"input": photos})[0]
        checks[f"{name} photos onnxruntime vs pytorch fp32"] = diff_check(ort_photos, torch_photos)
    else:
        checks[f"{name} photos onnxruntime"] = "skipped: onnxruntime is not importable here"
    for (n, device, batch), got in scores.items():
        if n != name:
            continue
        if batch == "photos":
            checks[f"{name} photos stoke {device} vs pytorch fp32"] = diff_check(got, torch_photos)
            if ort_photos is not None:
                checks[f"{name} photos stoke {device} vs onnxruntime"] = diff_check(got, ort_photos)
            continue
        with torch.inference_mode():
            ref = m(torch.from_numpy(tensor(batch)).cuda()).float().cpu().numpy()
        checks[f"{name} b{batch} stoke {device} vs pytorch fp32"] = diff_check(got, ref)
    del m


# --- JPEG photos: --preprocess cpu vs gpu at equal p99 --------------------------------------------------------

P99_BOUNDS_MS = (10, 25, 50, 100, 200)
SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def large_jpegs(out_dir):
    """The photos scaled to 1920x1280 (a phone-camera-sized upload; JPEG quality 90): decoding and resizing
    one costs milliseconds of CPU, the picture of the issue (a GPU waiting on the host)."""
    from PIL import Image
    d = out_dir / "jpeg_1920x1280"
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in sorted(PHOTOS.glob("*.jpg")):
        p = d / f.name
        Image.open(f).convert("RGB").resize((1920, 1280), Image.BICUBIC).save(p, quality=90)
        paths.append(p)
    return paths


def best_under(points, bound_ms):
    """(requests/s, concurrency) of the highest-throughput error-free point whose p99 is within the bound."""
    ok = [q for q in points if q["errors"] == 0 and q["p99_ms"] is not None and q["p99_ms"] <= bound_ms]
    if not ok:
        return None
    q = max(ok, key=lambda q: q["requests_per_s"])
    return {"requests_per_s": q["requests_per_s"], "concurrency": q["concurrency"], "p99_ms": q["p99_ms"]}


def jpeg_p99(stoke, name, path, out_dir, seconds, result, preprocess=("cpu", "gpu", "nvjpeg")):
    jpegs = large_jpegs(out_dir)
    files = ",".join(str(p) for p in jpegs)
    rows = {}
    for pre in preprocess:
        server = Server(stoke, path, out_dir / f"serve_{name}_jpeg_{pre}.log",
                        ["--device", "cuda", "--preprocess", pre, "--threads", str(os.cpu_count())])
        row = {"points": []}
        try:
            bdir = out_dir / f"bench_jpeg_{pre}"
            cmd = [stoke, "bench", "--url", server.url, "--api", "kserve-http", "--model", name,
                   "--bytes-input", files, "--concurrency", ",".join(map(str, SWEEP)),
                   "--warmup", "1", "--window", str(seconds), "--duration", str(seconds), "--stability", "0",
                   "--max-generator-cpu", "100", "--no-scrape", "--quiet", "--output-dir", str(bdir)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=len(SWEEP) * (seconds + 20))
            if r.returncode != 0:
                raise RuntimeError(f"stoke bench: rc {r.returncode}: {r.stderr[-1500:]}")
            for q in json.loads((bdir / "bench.json").read_text())["points"]:
                row["points"].append({"concurrency": int(q["load"]),
                                      "requests_per_s": round(q["throughput"]["requests_per_s"], 1),
                                      "p50_ms": q["latency_ms"].get("p50"), "p99_ms": q["latency_ms"].get("p99"),
                                      "errors": sum(q["requests"]["errors"].values())
                                      if isinstance(q["requests"]["errors"], dict) else q["requests"]["errors"],
                                      "valid": q["valid"]})
            row["ledger_ms_last_point"] = server.ledger(name, 200)
            dj = out_dir / f"doctor_jpeg_{pre}.json"
            d = subprocess.run([stoke, "doctor", "--url", server.url, "--model", name, "--bytes-input", files,
                                "--concurrency", "1,64", "--duration", "10", "--json", str(dj), "--quiet"],
                               capture_output=True, text=True, timeout=180)
            (out_dir / f"doctor_jpeg_{pre}.txt").write_text(d.stdout + d.stderr)
            if d.returncode == 0:
                rep = json.loads(dj.read_text())
                top = rep["verdicts"][0]
                row["doctor"] = {"verdict": top["bottleneck"],
                                 "all": [v["bottleneck"] for v in rep["verdicts"]],
                                 "host_bound": any(v["bottleneck"] == "host_bound" for v in rep["verdicts"]),
                                 "summary": top["summary"],
                                 "evidence": {e["signal"]: e["value"] for e in top["evidence"]},
                                 "next_step": top["next_step"]}
            else:
                row["doctor"] = {"error": (d.stderr or d.stdout)[-800:]}
        except Exception as e:  # noqa: BLE001 - report and go on with the other configuration
            result["skipped"].append(f"jpeg p99 --preprocess {pre}: {e!r}"[:1500])
        finally:
            server.stop()
        rows[pre] = row
        for q in row["points"]:
            log(f"  --preprocess {pre} c{q['concurrency']}: {q['requests_per_s']} req/s p99 {q['p99_ms']} ms "
                f"errors {q['errors']}")
        log(f"  --preprocess {pre}: ledger {row.get('ledger_ms_last_point')} doctor {row.get('doctor')}")
    equal = {}
    for b in P99_BOUNDS_MS:
        equal[f"p99<={b}ms"] = {pre: best_under(rows[pre]["points"], b) for pre in rows}
    result["jpeg_p99"] = {"model": name, "input": "JPEG 1920x1280 (bench/gpu/photos scaled), batch-1 requests, "
                                                  "dynamic batching up to 64",
                          "configs": rows, "equal_p99": equal}


def print_summary(result):
    """A few lines a person reads (the full JSON is in $OUT/images_bench.json)."""
    lines = []
    by = {}
    for f in result.get("figures", []):
        by.setdefault((f["model"], f["engine"]), {})[f["batch"]] = f.get("compute_images_per_s", f["images_per_s"])
    for (model, engine), v in sorted(by.items()):
        lines.append(f"{model:13s} {engine:42s} " + "  ".join(f"b{b}={x}" for b, x in sorted(v.items())))
    for k, c in result.get("checks", {}).items():
        if isinstance(c, dict):
            lines.append(f"check {k}: top1 {c['top1_identical_rows']} max|d| {c['max_abs_diff']} "
                         f"(range {c['score_range']}, min top-1 margin {c['min_top1_margin']})")
        else:
            lines.append(f"check {k}: {c}")
    jp = result.get("jpeg_p99")
    if jp:
        for pre, row in jp["configs"].items():
            pts = " ".join(f"c{q['concurrency']}:{q['requests_per_s']}/{q['p99_ms']:.0f}ms"
                           for q in row["points"] if q["p99_ms"] is not None)
            lines.append(f"jpeg --preprocess {pre} (req/s / p99): {pts}")
            lines.append(f"jpeg --preprocess {pre} ledger at c{SWEEP[-1]}: {row.get('ledger_ms_last_point')}")
            dr = row.get("doctor", {})
            lines.append(f"jpeg --preprocess {pre} doctor: {dr.get('all', dr.get('error'))} "
                         f"host_bound={dr.get('host_bound')} {dr.get('evidence', '')}")
        for b, v in jp["equal_p99"].items():
            lines.append(f"equal {b}: " + "  ".join(
                f"{pre}={x['requests_per_s']} req/s (c{x['concurrency']})" if x else f"{pre}=none"
                for pre, x in v.items()))
    for sk in result.get("skipped", []):
        lines.append(f"skipped: {sk[:300]}")
    print("\n".join(lines), flush=True)


def summary(result):
    best = {}
    for f in result["figures"]:
        key = f"{f['engine']} | {f['model']}"
        v = f.get("compute_images_per_s", f["images_per_s"])
        if key not in best or v > best[key]["images_per_s"]:
            best[key] = {"batch": f["batch"], "images_per_s": v}
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stoke", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", help="folder for the exported .onnx files (default: $OUT/models)")
    ap.add_argument("--reps", type=int, default=64, help="images per timed point (about)")
    ap.add_argument("--budget-s", type=float, default=240, help="torch.compile only while under 60%% of this")
    ap.add_argument("--with-cpu", action="store_true", help="also stoke serve --device cpu at batch 1 and 8")
    ap.add_argument("--export-only", action="store_true", help="write the .onnx files and stop")
    ap.add_argument("--conv-backends", default="",
                    help="comma-separated --conv-backend values (auto,cudnn,im2col): the GPU tensor figures once "
                         "per backend (default: the server's default only)")
    ap.add_argument("--jpeg-p99", action="store_true",
                    help="only the JPEG comparison: ResNet-50, --preprocess cpu vs gpu, concurrency 1..256, "
                         "equal p99, stoke doctor on each (writes $OUT/images_jpeg_p99.json)")
    ap.add_argument("--point-s", type=float, default=5, help="--jpeg-p99: seconds per concurrency point")
    ap.add_argument("--jpeg-preprocess", default="cpu,gpu,nvjpeg",
                    help="--jpeg-p99: the --preprocess settings to compare (cpu: decode and resize on the CPU; "
                         "gpu: CPU decode, GPU resize; nvjpeg: decode and resize on the GPU)")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models_dir = pathlib.Path(args.models) if args.models else out / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    result = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
              "host": {"cpus": os.cpu_count()}, "figures": [], "checks": {}, "skipped": []}
    try:
        result["host"]["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                               capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    if not have("torchvision"):
        result["skipped"].append("everything: torchvision is not importable here")
        print(json.dumps(result))
        return
    log("export")
    models = export_models(models_dir, result["skipped"])
    if args.export_only:
        return
    if args.jpeg_p99:
        if "resnet50" in models:
            jpeg_p99(args.stoke, "resnet50", models["resnet50"], out, args.point_s, result,
                     tuple(args.jpeg_preprocess.split(",")))
        result["wall_s"] = round(time.time() - T0, 1)
        (out / "images_jpeg_p99.json").write_text(json.dumps(result, indent=1))
        print_summary(result)
        print(json.dumps({"jpeg_p99": result.get("jpeg_p99", {}).get("equal_p99"), "skipped": result["skipped"]}))
        return
    scores = {}
    for name, path in models.items():
        log(f"stoke {name}")
        try:
            for cb in (args.conv_backends.split(",") if args.conv_backends else [""]):
                stoke_tensor_figures(args.stoke, name, path, out, "cuda", BATCHES, args.reps, result["figures"],
                                     scores, cb)
            if name == "resnet50":
                stoke_png_figures(args.stoke, name, path, out, args.reps, result["figures"])
            if args.with_cpu:
                stoke_tensor_figures(args.stoke, name, path, out, "cpu", (1, 8), 16, result["figures"], scores)
        except Exception as e:  # noqa: BLE001 - report and go on with the peers
            result["skipped"].append(f"stoke {name}: {e!r}"[:1500])
        log(f"pytorch {name}")
        torch_figures(name, args.reps, args.budget_s, result["figures"], result["skipped"])
        check_scores(name, path, scores, result["checks"])
    result["best"] = summary(result)
    result["wall_s"] = round(time.time() - T0, 1)
    (out / "images_bench.json").write_text(json.dumps(result, indent=1))
    print_summary(result)
    print(json.dumps({"best": result["best"], "skipped": result["skipped"]}))


if __name__ == "__main__":
    main()
