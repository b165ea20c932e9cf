#!/usr/bin/env python3
"""JPEG inputs served three ways on one GPU (issue 19): `stoke serve --device cuda --preprocess cpu | gpu | nvjpeg`
(decode + resize on the CPU; decode on the CPU, resize on the GPU; decode with nvJPEG and resize on the GPU), each
driven by Triton's perf_analyzer over KServe v2 gRPC at a few concurrencies with real photos
(tests/fixtures/photos, baseline JPEGs of 451x300 to 600x400). Per point: requests/s, p50/p99 and the ledger's
mean stages of the last requests (/v1/debug/requests). Then, for each cpu point, the best gpu / nvjpeg rate within
its p99, and each photo's scores (REST, one at a time) with gpu and nvjpeg against cpu (top-1, max |difference|). Writes $OUT/images_nvjpeg.json; its summary is the last line on stdout.

  python3 bench/gpu/images_nvjpeg.py --stoke .bundle/bin/stoke --model resnet50.onnx \
      --perf-analyzer .bundle/peers/perf_analyzer/perf_analyzer --out /tmp/out
"""
import argparse
import array
import base64
import csv
import json
import os
import pathlib
import re
import struct
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def input_data(path):
    """perf_analyzer --input-data: one JPEG per request, cycling over the baseline photos. perf_analyzer sends b64
    content of a BYTES input as the serialized tensor, so each element carries its 4-byte little-endian length."""
    photos = sorted(p for p in (ROOT / "tests/fixtures/photos").glob("*.jpg") if "progressive" not in p.name)
    rows = []
    for p in photos:
        raw = p.read_bytes()
        rows.append({"image": {"content": {"b64": base64.b64encode(struct.pack("<I", len(raw)) + raw).decode()},
                               "shape": [1]}})
    path.write_text(json.dumps({"data": rows}))
    return [p.name for p in photos]


class Server:
    def __init__(self, stoke, model, mode, args, log_path):
        cmd = [stoke, "serve", "--model", f"r50={model}", "--device", args.device, "--preprocess", mode, "--port", "0",
               "--grpc-port", "0", "--max-batch-size", str(args.max_batch_size), "--max-queue-delay-us",
               str(args.max_queue_delay_us), "--instances", str(args.instances), "--threads", str(args.threads)]
        self.cmd = " ".join(cmd)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"))
        deadline = time.time() + 180
        while time.time() < deadline:
            text = pathlib.Path(log_path).read_text(errors="replace")
            if "ready on" in text:
                self.url = "http://127.0.0.1:" + re.search(r"listening on http://[^:]+:(\d+)", text).group(1)
                m = re.search(r"gRPC[^\n]*?:(\d+)", text)
                self.grpc = f"127.0.0.1:{m.group(1)}" if m else None
                return
            if self.proc.poll() is not None:
                raise RuntimeError(text[-3000:])
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("stoke serve not ready in 180 s")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)

    def scores(self, jpeg):
        """One photo over KServe v2 REST with the binary tensor extension: its scores as a list of floats."""
        elem = struct.pack("<I", len(jpeg)) + jpeg
        header = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1],
                                         "parameters": {"binary_data_size": len(elem)}}],
                             "outputs": [{"name": "scores", "parameters": {"binary_data": True}}]}).encode()
        req = urllib.request.Request(f"{self.url}/v2/models/r50/infer", data=header + elem, method="POST",
                                     headers={"Inference-Header-Content-Length": str(len(header)),
                                              "Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=120) as r:
            hlen = int(r.headers["Inference-Header-Content-Length"])
            data = r.read()
        return list(array.array("f", data[hlen:]))

    def ledger(self, n):
        with urllib.request.urlopen(f"{self.url}/v1/debug/requests?model=r50&limit={n}", timeout=60) as r:
            reqs = json.loads(r.read())["requests"]
        out = {"requests": len(reqs)}
        for k in ("queue", "preprocess", "h2d", "compute", "d2h", "postprocess"):
            vals = [q["stages_ms"].get(k, 0.0) for q in reqs]
            out[k + "_ms"] = round(sum(vals) / len(vals), 3) if vals else None
        return out


def perf_analyzer(pa, grpc, data, concurrency, out_csv, interval_ms, stability=50):
    """One point; when the windows do not settle within 50 %, the point again with any spread (marked unstable)."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(pathlib.Path(pa).resolve().parent) + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    args = [pa, "-m", "r50", "-u", grpc, "-i", "grpc", "--input-data", str(data), "--concurrency-range",
            f"{concurrency}:{concurrency}", "--measurement-interval", str(interval_ms), "--stability-percentage",
            str(stability), "--max-trials", "6", "--percentile", "99", "-f", str(out_csv)]
    out_csv.unlink(missing_ok=True)
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    if p.returncode != 0 or not out_csv.exists():
        if "stable measurement" in p.stdout + p.stderr and stability < 1000:
            return perf_analyzer(pa, grpc, data, concurrency, out_csv, interval_ms, stability=1000)
        return {"error": (p.stdout + p.stderr)[-2000:], "command": " ".join(args)}
    r = next(csv.DictReader(out_csv.open()))
    return {"concurrency": concurrency, "infer_per_s": float(r["Inferences/Second"]),
            "p50_ms": float(r["p50 latency"]) / 1e3, "p99_ms": float(r["p99 latency"]) / 1e3,
            "unstable": stability > 100}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stoke", required=True)
    ap.add_argument("--model", required=True, help="ResNet-50 .onnx (bench/gpu/images_bench.py --export-only)")
    ap.add_argument("--perf-analyzer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="cpu,gpu,nvjpeg")
    ap.add_argument("--device", default="cuda", help="stoke serve --device (cpu: a dry run of the script anywhere)")
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--max-queue-delay-us", type=int, default=500)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="stoke serve --threads (all instances)")
    ap.add_argument("--interval-ms", type=int, default=2000, help="perf_analyzer --measurement-interval")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "nvjpeg_input.json"
    result = {"photos": input_data(data), "settings": vars(args), "modes": {}}
    # Every photo (the progressive one too) scored once per mode: nvjpeg and gpu against cpu.
    all_photos = sorted(p.name for p in (ROOT / "tests/fixtures/photos").glob("*.jpg"))
    scores = {}
    for mode in args.modes.split(","):
        try:
            srv = Server(args.stoke, args.model, mode, args, out / f"serve_{mode}.log")
        except RuntimeError as e:
            result["modes"][mode] = {"error": str(e)[-2000:]}
            log(f"{mode}: did not start: {str(e)[-400:]}")
            continue
        res = {"command": srv.cmd, "points": []}
        try:
            try:
                scores[mode] = [srv.scores((ROOT / "tests/fixtures/photos" / n).read_bytes()) for n in all_photos]
            except Exception as e:  # noqa: BLE001 - a failed request is a result here
                res["scores_error"] = str(e)[-1000:]
                log(f"{mode}: scoring the photos failed: {e}")
            for c in (int(x) for x in args.concurrency.split(",")):
                pt = perf_analyzer(args.perf_analyzer, srv.grpc, data, c, out / f"pa_{mode}_{c}.csv", args.interval_ms)
                if "error" not in pt:
                    pt["ledger"] = srv.ledger(200)
                    log(f"{mode} c={c}: {pt['infer_per_s']:.0f} req/s, p50 {pt['p50_ms']:.2f} ms, p99 "
                        f"{pt['p99_ms']:.2f} ms, ledger {pt['ledger']}")
                else:
                    log(f"{mode} c={c}: {pt['error'][-400:]}")
                res["points"].append(pt)
        finally:
            srv.stop()
        result["modes"][mode] = res
        (out / "images_nvjpeg.json").write_text(json.dumps(result, indent=1))
    base = [p for p in result["modes"].get("cpu", {}).get("points", []) if "error" not in p]
    summary = {}
    for mode in ("gpu", "nvjpeg"):
        pts = [p for p in result["modes"].get(mode, {}).get("points", []) if "error" not in p]
        summary[mode] = [{"p99_budget_ms": round(b["p99_ms"], 2), "cpu_req_s": round(b["infer_per_s"]),
                          f"{mode}_best_req_s": max([round(q["infer_per_s"]) for q in pts if q["p99_ms"] <= b["p99_ms"]],
                                                    default=None)} for b in base]
    result["at_equal_p99"] = summary
    agree = {}
    for mode in ("gpu", "nvjpeg"):
        if "cpu" not in scores or mode not in scores:
            continue
        diffs, same, rng = 0.0, 0, 0.0
        for a, b in zip(scores["cpu"], scores[mode]):
            diffs = max(diffs, max(abs(x - y) for x, y in zip(a, b)))
            rng = max(rng, max(a) - min(a))
            same += a.index(max(a)) == b.index(max(b))
        agree[mode] = {"photos": len(all_photos), "top1_equal": same, "max_abs_score_diff": round(diffs, 5),
                       "cpu_score_range": round(rng, 3)}
    result["scores_vs_cpu"] = agree
    log(f"scores against --preprocess cpu: {agree}")
    (out / "images_nvjpeg.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({"at_equal_p99": summary, "scores_vs_cpu": agree, "points": {
        m: [(p.get("concurrency"), round(p.get("infer_per_s", 0)), round(p.get("p99_ms", 0), 2),
             (p.get("ledger") or {}).get("preprocess_ms")) for p in r.get("points", [])]
        for m, r in result["modes"].items()}}))


if __name__ == "__main__":
    main()
