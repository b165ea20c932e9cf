#!/usr/bin/env python3
"""Image classifiers on the GPU machine (issue 19), run by bench/gpu/images.sh. stoke has no GPU path for image
models yet (docs/images.md, "Not yet"), so this measures what exists there and the peer it will be judged by:

  1. stoke serve on that host's CPU: ResNet-50 and MobileNetV2 at torchvision's shapes (224x224, 1000 classes,
     random weights: exported from torchvision with torch.onnx when torchvision is there, else built by
     tests/fixtures/cnn_models.py when the onnx package is there), FP32 tensors through "<name>-tensor" (KServe
     v2 REST, binary tensor extension, urllib only), batch 1 and 8, `--threads` = the host's cores; the
     classifier ppocr-mobile-v2-cls on PNG bytes when its .onnx is in $STOKE_MODEL_DIR (the host has no
     internet: copy ~/.cache/stoke/models/ppocr-mobile-v2-cls there). The mean ledger stages per request come
     from /v1/debug/requests.
  2. `--device cuda` for stoke: recorded as not supported (image models run on the CPU only so far).
  3. PyTorch (torchvision's models, when importable): eager on the GPU in fp32 and fp16 channels-last, and on the
     CPU, batch 1 / 8 / 64, cuda.synchronize timing; and onnxruntime (CPU, and CUDA when its provider is there)
     on the same .onnx files, when importable.
  4. stoke vs onnxruntime / torch scores on the same tensors (max |difference|, top-1 agreement), when either is
     there.

Output: $OUT/images_bench.json ({host, figures: [...], checks: {...}, skipped: [...]}), progress on stdout.
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
import tempfile
import time
import urllib.request
import zlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def log(msg):
    print(msg, flush=True)


def have(module):
    try:
        __import__(module)
        return True
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False


# --- models --------------------------------------------------------------------------------------------------


def export_models(tmp, skipped):
    """{name: .onnx path} for resnet50 and mobilenet_v2 at 224x224."""
    out = {}
    if have("torchvision"):
        import torch
        try:
            for name in ("resnet50", "mobilenet_v2"):
                p = tmp / f"{name}.onnx"
                kw = dict(input_names=["input"], output_names=["scores"], opset_version=13,
                          dynamic_axes={"input": {0: "N"}, "scores": {0: "N"}})
                try:
                    torch.onnx.export(torch_model(name), torch.randn(1, 3, 224, 224), str(p), dynamo=False, **kw)
                except TypeError:  # older torch: no dynamo argument
                    torch.onnx.export(torch_model(name), torch.randn(1, 3, 224, 224), str(p), **kw)
                out[name] = p
            return out, "torchvision (random weights)"
        except Exception as e:  # noqa: BLE001 - e.g. the exporter wants a package this host lacks
            skipped.append(f"torch.onnx.export: {e!r}"[:500])
            out = {}
    if have("onnx"):
        sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
        import cnn_models
        import onnx
        for name, kw in (("resnet50", {"width": 64}), ("mobilenet_v2", {"width": 1.0})):
            p = tmp / f"{name}.onnx"
            onnx.save(cnn_models.MODELS[name](classes=1000, size=224, **kw), str(p))
            out[name] = p
        return out, "tests/fixtures/cnn_models.py (random weights)"
    skipped.append("resnet50/mobilenet_v2: neither torchvision nor onnx is importable here")
    return out, None


def torch_model(name):
    """torchvision's model with seeded random weights: the same weights each call."""
    import torch
    import torchvision
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None).eval()


# --- stoke serve ---------------------------------------------------------------------------------------------


class Server:
    def __init__(self, stoke, model, threads, log_path):
        self.log_path = log_path
        self.proc = subprocess.Popen([stoke, "serve", "--model", str(model), "--port", "0", "--grpc-port", "-1",
                                      "--threads", str(threads), "--max-batch-size", "8",
                                      "--max-queue-delay-us", "0"],
                                     stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"))
        deadline = time.time() + 300
        while time.time() < deadline:
            text = pathlib.Path(log_path).read_text(errors="replace")
            if "ready on" in text:
                self.url = "http://127.0.0.1:" + re.search(r"listening on http://[^:]+:(\d+)", text).group(1)
                return
            if self.proc.poll() is not None:
                raise RuntimeError(text[-3000:])
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("stoke serve not ready in 300 s")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)

    def infer(self, model, name, datatype, shape, payload):
        """KServe v2 REST with the binary tensor extension; returns (scores [N, C], top-1 [N])."""
        header = json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": shape,
                                         "parameters": {"binary_data_size": len(payload)}}],
                             "outputs": [{"name": "scores", "parameters": {"binary_data": False}},
                                         {"name": "top_k_index", "parameters": {"binary_data": False}}]}).encode()
        req = urllib.request.Request(f"{self.url}/v2/models/{model}/infer", data=header + payload, method="POST",
                                     headers={"Inference-Header-Content-Length": str(len(header)),
                                              "Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=300) as r:
            body = json.loads(r.read())
        outs = {o["name"]: o for o in body["outputs"]}
        scores = np.array(outs["scores"]["data"], np.float32).reshape(outs["scores"]["shape"])
        top = np.array(outs["top_k_index"]["data"]).reshape(outs["top_k_index"]["shape"])[:, 0]
        return scores, top

    def ledger(self, model, n):
        with urllib.request.urlopen(f"{self.url}/v1/debug/requests?model={model}&limit={n}", timeout=60) as r:
            reqs = json.loads(r.read())["requests"]
        out = {}
        for k in ("queue", "preprocess", "compute", "postprocess"):
            out[k + "_ms"] = round(float(np.mean([q["stages_ms"][k] for q in reqs])), 3) if reqs else None
        return out


def timed(fn, batches, warmup=2):
    for b in batches[:warmup]:
        fn(b)
    t0 = time.perf_counter()
    for b in batches:
        fn(b)
    return time.perf_counter() - t0


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


def stoke_figures(stoke, models, ppocr, threads, reps, out_dir, figures, tensors):
    for name, path in list(models.items()) + ([("ppocr-mobile-v2-cls", "ppocr-mobile-v2-cls")] if ppocr else []):
        server = Server(stoke, path, threads, out_dir / f"serve_{name}.log")
        try:
            served = name
            for batch in (1, 8):
                if name == "ppocr-mobile-v2-cls":
                    imgs = [png_bytes(64 + 8 * i, 256 + 16 * i, i) for i in range(batch)]
                    payload, shape, inp, dt, form = bytes_tensor(imgs), [batch, 1], "image", "BYTES", "PNG bytes"
                else:
                    x = np.random.RandomState(batch).randn(batch, 3, 224, 224).astype(np.float32)
                    tensors.setdefault(name, {})[batch] = x
                    payload, shape, inp, dt, form = x.tobytes(), list(x.shape), "input", "FP32", "FP32 tensors"
                    served = f"{name}-tensor"
                n = max(4, reps // batch)
                secs = timed(lambda _: server.infer(served, inp, dt, shape, payload), [None] * n)
                fig = {"engine": "stoke serve (CPU)", "model": name, "input": form, "batch": batch,
                       "threads": threads, "images_per_s": round(n * batch / secs, 2),
                       "ledger": server.ledger(served, n)}
                if name != "ppocr-mobile-v2-cls":
                    fig["scores"], _ = server.infer(served, inp, dt, shape, payload)
                log(f"  {fig['engine']} {name} b{batch} ({form}): {fig['images_per_s']} images/s {fig['ledger']}")
                figures.append(fig)
        finally:
            server.stop()


def torch_figures(models, same_weights, reps, figures, checks):
    import torch
    for name in models:
        for device, dtype in (("cuda", torch.float32), ("cuda", torch.float16), ("cpu", torch.float32)):
            if device == "cuda" and not torch.cuda.is_available():
                continue
            mm = torch_model(name).to(device=device, dtype=dtype)
            if device == "cuda":
                mm = mm.to(memory_format=torch.channels_last)
            for batch in (1, 8, 64):
                if device == "cpu" and batch == 64:
                    continue
                x = torch.randn(batch, 3, 224, 224, device=device, dtype=dtype)
                if device == "cuda":
                    x = x.to(memory_format=torch.channels_last)
                n = max(5, (reps * 4 if device == "cuda" else reps) // batch)
                with torch.inference_mode():
                    for _ in range(3):
                        mm(x)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(n):
                        mm(x)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    secs = time.perf_counter() - t0
                fig = {"engine": f"pytorch eager {device} {str(dtype).replace('torch.', '')}", "model": name,
                       "input": "tensors on the device" if device == "cuda" else "tensors", "batch": batch,
                       "images_per_s": round(n * batch / secs, 2)}
                log(f"  {fig['engine']} {name} b{batch}: {fig['images_per_s']} images/s")
                figures.append(fig)
            del mm
        if not same_weights:  # the .onnx files came from cnn_models.py: other weights
            continue
        m = torch_model(name)
        for fig in figures:
            if fig["engine"].startswith("stoke") and fig["model"] == name and "scores" in fig:
                x = TENSORS[name][fig["batch"]]
                with torch.inference_mode():
                    ref = m(torch.from_numpy(x)).numpy()
                checks[f"{name} b{fig['batch']} stoke vs pytorch cpu fp32"] = compare(fig["scores"], ref)


def ort_figures(models, reps, figures, checks):
    import onnxruntime as ort
    providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
    for name, path in models.items():
        for prov in providers:
            sess = ort.InferenceSession(str(path), providers=[prov])
            for batch in (1, 8):
                x = TENSORS.get(name, {}).get(batch)
                if x is None:
                    x = np.random.RandomState(batch).randn(batch, 3, 224, 224).astype(np.float32)
                n = max(4, reps // batch)
                secs = timed(lambda _: sess.run(None, {"input": x}), [None] * n)
                fig = {"engine": f"onnxruntime {prov}", "model": name, "input": "tensors", "batch": batch,
                       "images_per_s": round(n * batch / secs, 2)}
                log(f"  {fig['engine']} {name} b{batch}: {fig['images_per_s']} images/s")
                figures.append(fig)
                if prov == "CPUExecutionProvider":
                    for f in figures:
                        if f["engine"].startswith("stoke") and f["model"] == name and f["batch"] == batch:
                            checks[f"{name} b{batch} stoke vs onnxruntime cpu"] = compare(
                                f["scores"], sess.run(None, {"input": x})[0])


def compare(got, ref):
    scale = max(1.0, float(np.abs(ref).max()))
    return {"max_abs_diff": float(np.abs(got - ref).max()), "largest_abs_score": scale,
            "top1_identical": bool((got.argmax(1) == ref.argmax(1)).all())}


TENSORS = {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stoke", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=32, help="images per timed point (about)")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
              "host": {"cpus": os.cpu_count()}, "figures": [], "checks": {}, "skipped": [],
              "stoke_device_cuda": "not supported: image models run on the CPU only so far (docs/images.md)"}
    try:
        result["host"]["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                               capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    model_dir = pathlib.Path(os.environ.get("STOKE_MODEL_DIR", pathlib.Path.home() / ".cache/stoke/models"))
    ppocr = (model_dir / "ppocr-mobile-v2-cls" / "ch_ppocr_mobile_v2.0_cls_infer.onnx").exists()
    if not ppocr:
        result["skipped"].append(f"ppocr-mobile-v2-cls: not in {model_dir} (no internet to fetch it)")
    with tempfile.TemporaryDirectory() as tmp:
        log("models")
        models, origin = export_models(pathlib.Path(tmp), result["skipped"])
        result["models_from"] = origin
        log("stoke serve on the CPU")
        stoke_figures(args.stoke, models, ppocr, args.threads, args.reps, out, result["figures"], TENSORS)
        if have("torchvision") and models:
            log("pytorch")
            torch_figures(models, (origin or "").startswith("torchvision"), args.reps, result["figures"],
                          result["checks"])
        else:
            result["skipped"].append("pytorch: torchvision not importable")
        if have("onnxruntime") and models:
            log("onnxruntime")
            ort_figures(models, args.reps, result["figures"], result["checks"])
        else:
            result["skipped"].append("onnxruntime: not importable")
    for f in result["figures"]:
        f.pop("scores", None)
    (out / "images_bench.json").write_text(json.dumps(result, indent=1))
    log(json.dumps({"checks": result["checks"], "skipped": result["skipped"]}, indent=1))


if __name__ == "__main__":
    main()
