#!/usr/bin/env python3
"""CPU images/s of the image model kind through `stoke serve` (KServe v2 HTTP, tritonclient), at batch 1 and 8:

  - the real classifier (alias ppocr-mobile-v2-cls, PaddleOCR's MobileNetV3 text-direction classifier, 48x192)
    on JPEG bytes of scikit-image's photos: decode + resize + normalise + CNN + top-k, one server, one client
    thread sending requests of B images back to back;
  - the same model on FP32 tensors ("<name>-tensor"), and onnxruntime (CPU, same thread count) on the same
    tensors as the peer;
  - ResNet-50 at torchvision's size (random weights from tests/fixtures/cnn_models.py: width 64, 224x224,
    1000 classes) on FP32 tensors, beside onnxruntime.

  .venv/bin/python bench/cpu_images.py [--stoke build/release/apps/stoke/stoke] [--threads 2]

images/s = images sent / wall seconds of the timed requests (after warm-up requests). The server's mean
ledger stages per request (GET /v1/debug/requests) show where the time went. cpu_seconds of the server process
over the timed part shows contention (with T threads, well below T * seconds: others had the cores).
Writes bench/results/cpu_images_<date>.json = {command, commit, machine, date, figures}.
"""
import argparse
import datetime
import io
import json
import os
import pathlib
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))


def cpu_seconds(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, stoke, model, threads, extra=()):
        self.log = tempfile.NamedTemporaryFile(prefix="stoke-img-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([stoke, "serve", "--model", str(model), "--port", "0", "--grpc-port", "-1",
                                      "--threads", str(threads), "--max-batch-size", "8", *extra],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 300
        while time.time() < deadline:
            text = pathlib.Path(self.log.name).read_text()
            if "ready on" in text:
                self.port = int(re.search(r"listening on http://[^:]+:(\d+)", text).group(1))
                return
            if self.proc.poll() is not None:
                raise RuntimeError(text)
            time.sleep(0.1)
        raise RuntimeError("server not ready")

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def ledger_means(port, model, n):
    import requests
    reqs = requests.get(f"http://127.0.0.1:{port}/v1/debug/requests",
                        params={"model": model, "limit": n}).json()["requests"]
    keys = ["queue", "preprocess", "compute", "postprocess", "e2e"]
    out = {}
    for k in keys:
        vals = [r["e2e_ms"] if k == "e2e" else r["stages_ms"][k] for r in reqs]
        out[k + "_ms"] = round(float(np.mean(vals)), 3)
    return out


def run_requests(client, model, name, datatype, batches, warmup=3):
    import tritonclient.http as h

    def one(arr):
        inp = h.InferInput(name, list(arr.shape), datatype)
        inp.set_data_from_numpy(arr)
        client.infer(model, [inp], outputs=[h.InferRequestedOutput("top_k_index")])

    for arr in batches[:warmup]:
        one(arr)
    t0 = time.perf_counter()
    for arr in batches:
        one(arr)
    return time.perf_counter() - t0


def bench_server(stoke, model, threads, label, payloads, tensor_inputs, reps):
    import tritonclient.http as h
    server = Server(stoke, model, threads)
    try:
        client = h.InferenceServerClient(f"127.0.0.1:{server.port}")
        name = "ppocr-mobile-v2-cls" if payloads is not None else pathlib.Path(model).stem
        figures = []
        for b in (1, 8):
            for form in (["jpeg"] if payloads is not None else []) + ["tensor"]:
                if form == "jpeg":
                    batches = [np.array([[payloads[(i * b + j) % len(payloads)]] for j in range(b)], dtype=object)
                               for i in range(reps[b])]
                    m, inp, dt = name, "image", "BYTES"
                else:
                    batches = [np.stack([tensor_inputs[(i * b + j) % len(tensor_inputs)] for j in range(b)])
                               for i in range(reps[b])]
                    m, inp, dt = name + "-tensor", "input", "FP32"
                c0 = cpu_seconds(server.proc.pid)
                secs = run_requests(client, m, inp, dt, batches)
                c1 = cpu_seconds(server.proc.pid)
                images = b * len(batches)
                figures.append({"engine": "stoke", "model": label, "input": form, "batch": b, "threads": threads,
                                "images": images, "seconds": round(secs, 3), "images_per_s": round(images / secs, 2),
                                "server_cpu_seconds": round(c1 - c0, 2),
                                "ledger_mean_per_request": ledger_means(server.port, m, len(batches))})
                print(json.dumps(figures[-1]), flush=True)
        return figures
    finally:
        server.stop()


def bench_ort(path, input_name, tensors, threads, label, reps):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so)
    out = []
    for b in (1, 8):
        batches = [np.stack([tensors[(i * b + j) % len(tensors)] for j in range(b)]) for i in range(reps[b])]
        for arr in batches[:3]:
            sess.run(None, {input_name: arr})
        t0 = time.perf_counter()
        for arr in batches:
            sess.run(None, {input_name: arr})
        secs = time.perf_counter() - t0
        images = b * len(batches)
        out.append({"engine": f"onnxruntime {ort.__version__}", "model": label, "input": "tensor", "batch": b,
                    "threads": threads, "images": images, "seconds": round(secs, 3),
                    "images_per_s": round(images / secs, 2)})
        print(json.dumps(out[-1]), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stoke", default=str(ROOT / "build/release/apps/stoke/stoke"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-resnet", action="store_true")
    args = ap.parse_args()

    from PIL import Image
    from skimage import data as skdata
    import onnx
    import cnn_models
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from test_images import ppocr_reference_input  # the numpy reference preprocessing

    load_before = os.getloadavg()
    payloads = []
    for name in ["astronaut", "camera", "chelsea", "coffee", "text", "coins", "moon", "clock", "rocket"]:
        img = getattr(skdata, name)()
        if img.ndim == 2:
            img = np.stack([img] * 3, axis=-1)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=95)
        payloads.append(buf.getvalue())
    tensors = [ppocr_reference_input(p) for p in payloads]
    model_dir = pathlib.Path(os.environ.get("STOKE_MODEL_DIR", pathlib.Path.home() / ".cache/stoke/models"))
    cls_path = model_dir / "ppocr-mobile-v2-cls/ch_ppocr_mobile_v2.0_cls_infer.onnx"
    figures = bench_server(args.stoke, "ppocr-mobile-v2-cls", args.threads, "ppocr-mobile-v2-cls", payloads,
                           tensors, {1: 300, 8: 60})
    figures += bench_ort(cls_path, "x", tensors, args.threads, "ppocr-mobile-v2-cls", {1: 300, 8: 60})
    if not args.skip_resnet:
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="stoke-resnet-"))
        onnx.save(cnn_models.resnet50(width=64, classes=1000, size=224), str(tmp / "resnet50.onnx"))
        (tmp / "resnet50.json").write_text(json.dumps({"type": "image", "name": "resnet50", "model": "resnet50.onnx",
                                                       "max_batch_size": 8,
                                                       "dynamic_batching": {"max_queue_delay_microseconds": 0}}))
        rng = np.random.RandomState(0)
        rt = [rng.randn(3, 224, 224).astype(np.float32) for _ in range(8)]
        figures += bench_server(args.stoke, tmp / "resnet50.json", args.threads, "resnet50 (random, 224)", None, rt,
                                {1: 12, 8: 3})
        figures += bench_ort(tmp / "resnet50.onnx", "input", rt, args.threads, "resnet50 (random, 224)", {1: 12, 8: 3})

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
    result = {
        "command": "bench/cpu_images.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "commit": commit,
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "method": "one server per model (--threads T --max-batch-size 8), one client sending requests of B images "
                  "back to back after 3 warm-up requests; images/s = images / wall seconds; onnxruntime: "
                  "InferenceSession.run on the same tensors, intra_op_num_threads = T",
        "figures": figures,
    }
    out = ROOT / "bench/results" / f"cpu_images_{datetime.date.today().isoformat()}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
