"""stoke tune against an exhaustive grid over the same knobs, in the same test, on a synthetic model whose batch
cost is set by construction: 20 ms + 1 ms per item, slept (not spun) on one "device" that runs one batch at a
time (sleep_exclusive), so a loaded CPU barely changes it. With 16 closed-loop clients that makes batching the
knob that matters (batch 16: 36 ms per 16 requests, vs 21 ms per request alone) and instances useless (they
split the batch and queue for the same device).

What is asserted uses what the tool controls, never this machine's speed: the chosen config's goodput against
the grid's best (both measured here, same windows), and tune's measuring time (warm-up + windows of every point
+ the doctor's warm-up and window, as tune.json records it) against the grid's. Also: stoke.toml round-trips through
`stoke serve --config`, report.html has its charts and renders in headless Chromium, bad flags exit 2.
"""
import json
import pathlib
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import requests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "fixtures"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_helpers import stoke_bin_path  # noqa: E402
from classic_server import ClassicServer  # noqa: E402

# Alone, not beside other tests (pytest.ini's `serial`): the module compares goodputs measured at different
# moments, and parallel tests' load changing between them moved a chosen point below the grid's best by 7 %.
pytestmark = pytest.mark.serial

SYNTH = {"type": "synthetic", "name": "synth", "input_bytes": 16, "output_bytes": 16, "sleep_us": 20000,
         "sleep_us_per_item": 1000, "sleep_exclusive": True, "max_batch_size": 1}
# Short windows keep the whole module near two minutes (1 s holds ~28 batches of 16, so one batch more or
# less is 3.6 %); the knob values are the same for both runs.
COMMON = ["--slo-p99-ms", "150", "--concurrency", "16", "--warmup", "0.3", "--window", "1",
          "--batch-sizes", "1,2,4,8,16", "--queue-delays-us", "2000,0,10000", "--instance-counts", "1,2,4,8",
          "--confirm-rounds", "2", "--budget-min", "10"]


def start_tune(model, out, *extra):
    return subprocess.Popen([str(stoke_bin_path()), "tune", "--model", str(model), "--out", str(out), *COMMON,
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_tune(proc, out):
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout + stderr
    return json.loads((out / "tune.json").read_text()), stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune")
    model = d / "synth.json"
    model.write_text(json.dumps(SYNTH))
    # The walk and the grid at the same time (the grid's ~100 s bound the module's time): each point is its own
    # server process whose "device" is slept, not spun, so the two runs barely touch each other's figures.
    walk_proc, grid_proc = start_tune(model, d / "walk"), start_tune(model, d / "grid", "--grid")
    walk, walk_stderr = finish_tune(walk_proc, d / "walk")
    grid, _ = finish_tune(grid_proc, d / "grid")
    return {"dir": d, "model": model, "walk": walk, "grid": grid, "walk_stderr": walk_stderr}


def knobs_key(k):
    return (k["max_batch_size"], k["max_queue_delay_us"], k["instances"])


def test_chosen_config_is_near_the_grid_best_at_a_quarter_of_its_measuring_time(runs):
    walk, grid = runs["walk"], runs["grid"]
    n_grid = 5 * 3 * 4
    assert sum(1 for m in grid["measurements"] if m["step"] == "grid") == n_grid
    best_grid = max(m["goodput_rps"] for m in grid["measurements"] if m["accepted"])
    chosen = knobs_key(walk["chosen"])
    # The chosen config, as both runs measured it: the best of its measurements against the best of the grid's
    # (a maximum against a maximum; one short window of each point).
    seen = [m["goodput_rps"] for run in (walk, grid) for m in run["measurements"]
            if knobs_key(m["knobs"]) == chosen and m["accepted"]]
    print(f"tune chose {chosen}: goodput {seen}; grid best {best_grid:.1f} req/s; "
          f"measuring {walk['measuring_s']:.1f} s ({walk['measurement_count']} points) vs grid "
          f"{grid['measuring_s']:.1f} s ({grid['measurement_count']} points)")
    assert seen, "the chosen config was never accepted"
    assert max(seen) >= 0.95 * best_grid
    assert walk["measuring_s"] <= 0.25 * grid["measuring_s"]
    assert walk["measurement_count"] <= 0.25 * grid["measurement_count"]


def test_walk_moves_one_knob_at_a_time_and_says_why_each_step_stopped(runs):
    walk = runs["walk"]
    steps = {s["knob"]: s for s in walk["steps"]}
    assert list(steps) == ["max_batch_size", "max_queue_delay_us", "instances", "precision"]
    assert steps["precision"]["skipped"] and "no lower precision" in steps["precision"]["stopped"]
    for s in walk["steps"]:
        assert s["stopped"]
    # Batching is what this model needs: the walk keeps a batch size > 1.
    assert walk["chosen"]["max_batch_size"] not in ("own", 1)
    by_index = {m["index"]: m for m in walk["measurements"]}
    for s in walk["steps"]:
        for i in s["points"]:
            m = by_index[i]
            assert m["step"] == s["knob"]
            if not m["accepted"]:
                assert m["why"]
    # Rejected points are the ones over the SLO (or failed).
    for m in walk["measurements"]:
        if m["ok"] and m["p99_ms"] > 150:
            assert not m["accepted"]
    assert walk["doctor"] and walk["doctor"][0]["bottleneck"]
    assert walk["confirmation"]["verdict"]
    # One progress line per measurement on stderr.
    assert len(re.findall(r"^tune #\d+", runs["walk_stderr"], flags=re.M)) == walk["measurement_count"]


def test_stoke_toml_round_trips_through_serve_config(runs):
    toml = runs["dir"] / "walk" / "stoke.toml"
    text = toml.read_text()
    assert re.search(r"^model = ", text, flags=re.M)
    chosen = runs["walk"]["chosen"]
    srv = ClassicServer(stoke_bin_path(), runs["model"], "--config", toml)
    try:
        cfg = requests.get(srv.base_url + "/v2/models/synth/config", timeout=10).json()
    finally:
        srv.stop()
    if chosen["max_batch_size"] != "own":
        assert cfg["max_batch_size"] == chosen["max_batch_size"]
    if chosen["max_queue_delay_us"] != "own":
        assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == chosen["max_queue_delay_us"]
    if chosen["instances"] != "own":
        assert cfg["instance_group"][0]["count"] == chosen["instances"]
    # The file alone names the model: serve --config needs no --model.
    r = subprocess.run([str(stoke_bin_path()), "serve", "--config", str(toml), "--port", "-5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--port" in r.stderr


def test_report_has_charts_and_renders_in_headless_chromium(runs, tmp_path):
    html = (runs["dir"] / "walk" / "report.html").read_text()
    assert "<script" not in html and " src=" not in html
    svgs = re.findall(r"<svg.*?</svg>", html, flags=re.S)
    for svg in svgs:
        ET.fromstring(svg)
    titles = re.findall(r'font-weight="bold" text-anchor="middle">([^<]+)<', html)
    assert any(t.startswith("goodput vs max_batch_size") for t in titles), titles
    assert "p99 vs max_batch_size" in titles
    assert 'id="chosen"' in html and "Stopped:" in html and "Skipped:" in html
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium not installed (Debian package `chromium`)")
    shot = tmp_path / "report.png"
    r = subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                        f"--screenshot={shot}", "--window-size=1200,2400",
                        (runs["dir"] / "walk" / "report.html").as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert shot.exists(), r.stderr
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000


@pytest.mark.parametrize("args,needle", [
    (["--slo-p99-ms", "0"], "--slo-p99-ms"),
    (["--slo-p99-ms", "50", "--batch-sizes", "1,x"], "--batch-sizes"),
    (["--slo-p99-ms", "50", "--concurrency", "4", "--rate", "3"], "--rate"),
])
def test_bad_flags_exit_2(tmp_path, args, needle):
    r = subprocess.run([str(stoke_bin_path()), "tune", "--model", "x.json", "--out", str(tmp_path), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and needle in r.stderr, r.stderr


def test_serve_toml_config_and_batching_flags(tmp_path):
    model = tmp_path / "synth.json"
    model.write_text(json.dumps(SYNTH))
    cfg = tmp_path / "serve.toml"
    cfg.write_text('max-batch-size = 8\nmax_queue_delay_us = 3000\ninstances = 2\n')
    # A flag on the command line wins over the file.
    srv = ClassicServer(stoke_bin_path(), model, "--config", cfg, "--instances", "3")
    try:
        c = requests.get(srv.base_url + "/v2/models/synth/config", timeout=10).json()
    finally:
        srv.stop()
    assert c["max_batch_size"] == 8
    assert c["dynamic_batching"]["max_queue_delay_microseconds"] == 3000
    assert c["instance_group"][0]["count"] == 3
    bad = tmp_path / "bad.toml"
    bad.write_text("max-batch-size = [1, 2]\n")
    for args, needle in (([ "--config", str(bad)], "max-batch-size"), (["--max-batch-size", "-1"], "--max-batch-size"),
                         (["--max-queue-delay-us", "-2"], "--max-queue-delay-us")):
        r = subprocess.run([str(stoke_bin_path()), "serve", "--model", str(model), *args], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and needle in r.stderr, r.stderr


# ---- decoders: a tiny random Llama-family model from `stoke model synth`, on the CPU ----------------------------
# A real encoder, with every knob list pinned to what the baseline already has (batch 32, delay 0, 1 instance): the
# walk's only points besides the baseline are the precision step's fp8 weights and, with --calibration-data, int8
# weights calibrated on Debian's GPL-2, which the server gates at load against the CPU's fp32 encoder
# (docs/precision.md: on the CPU the gate rejects MiniLM's fp8 weights, narrowly, and passes its int8 ones).
ENCODER = ["--device", "cpu", "--slo-p99-ms", "30000", "--concurrency", "2", "--warmup", "0.3", "--window", "1",
           "--batch-sizes", "32", "--queue-delays-us", "0", "--instance-counts", "1", "--confirm-rounds", "1",
           "--budget-min", "4", "--serve-args", "--threads 2"]
CALIBRATION = "/usr/share/common-licenses/GPL-2"


def test_encoder_precision_step_measures_fp8_and_int8_weights_or_records_the_gate_refusal(minilm_path, tmp_path):
    out = tmp_path / "enc"
    r = subprocess.run([str(stoke_bin_path()), "tune", "--model", str(minilm_path), "--out", str(out), *ENCODER,
                        "--calibration-data", CALIBRATION], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    walk = json.loads((out / "tune.json").read_text())
    assert walk["kind"] == "batched"
    steps = {s["knob"]: s for s in walk["steps"]}
    assert list(steps) == ["max_batch_size", "max_queue_delay_us", "instances", "precision"]
    by_index = {m["index"]: m for m in walk["measurements"]}
    p = steps["precision"]
    assert not p["skipped"] and len(p["points"]) == 2, p
    points = {by_index[i]["knobs"]["quantization"]: by_index[i] for i in p["points"]}
    assert sorted(points) == ["fp8", "int8"], points
    for q, m in points.items():
        assert m["step"] == "precision", m
        # Either the server passed its gate and the point was measured, or the gate refused it at load; a refused
        # point is reported as failed, never kept.
        assert m["ok"] or "consistency gate" in m["why"], m
        assert not (m["accepted"] and not m["ok"]), m
        failed = p["stopped"].split("failed (no figure): ", 1)[1] if "failed (no figure)" in p["stopped"] else ""
        assert (f"weights {q}" in failed) == (not m["ok"]), p
        log = (out / "logs" / f"serve-{m['index']:03d}.log").read_text()
        if not m["ok"]:
            assert "the consistency gate rejects this precision" in log, log[-2000:]
        else:  # the server that measured it served these weights (int8: calibrated on the file tune passed)
            assert f"weights {q}, consistency gate passed" in log, log[-2000:]
    chosen = walk["chosen"]["quantization"]
    toml = (out / "stoke.toml").read_text()
    for q in ("fp8", "int8"):
        assert (f'quantization = "{q}"' in toml) == (chosen == q), toml
    assert ("calibration-data = " in toml) == (chosen == "int8"), toml
    if chosen != "own":  # only a measured point can be kept
        assert points[chosen]["ok"], points[chosen]


# 16-token prompts, 8 generated tokens, 4 closed-loop clients: a point is a few dozen requests. The SLOs are loose
# (the walk's decisions are not what is asserted here, the files are): every step with the doctor's verdict and
# reason, stoke.toml read by `stoke serve --config` unchanged, the report in headless Chromium, --url's advice,
# and the SLO options' validation.
DECODER = ["--device", "cpu", "--slo-tpot-ms", "1000", "--slo-p99-ms", "20000", "--concurrency", "4",
           "--input-len", "16", "--output-len", "8", "--warmup", "0.3", "--window", "1.2",
           "--max-num-seqs-values", "1,2,4", "--max-num-batched-tokens-values", "32,64", "--confirm-rounds", "2",
           "--budget-min", "5"]
DECODER_STEPS = ["max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "target_step_ms", "cuda_graphs",
                 "async_output", "kv_cache_dtype", "weight_precision"]


def start_decoder(model, *extra, log):
    from conftest import StokeServer
    return StokeServer([str(stoke_bin_path()), "serve", "--model", str(model), "--host", "127.0.0.1", "--port", "0",
                        "--threads", "1", *map(str, extra)], log)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune_decoder")
    model = d / "tiny-llama"
    r = subprocess.run([str(stoke_bin_path()), "model", "synth", "--shape", "smollm2-135m", "--layers", "1",
                        "--seed", "5", "--out", str(model), "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # --serve-args reach every point and stoke.toml (prompts are unique: no prefix cache changes nothing here).
    # --calibration-data is for encoders: a decoder's walk says it is unused and never tries int8 weights.
    r = subprocess.run([str(stoke_bin_path()), "tune", "--model", str(model), "--out", str(d / "walk"), *DECODER,
                        "--serve-args", "--no-prefix-cache --max-waiting 512", "--calibration-data", CALIBRATION],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return {"dir": d, "model": model, "walk": json.loads((d / "walk" / "tune.json").read_text()),
            "stdout": r.stdout, "stderr": r.stderr}


def test_decoder_walk_records_every_step_with_the_doctors_verdict(decoder):
    walk = decoder["walk"]
    assert walk["kind"] == "decoder" and walk["mode"] == "walk"
    assert [s["knob"] for s in walk["steps"]] == DECODER_STEPS
    by_index = {m["index"]: m for m in walk["measurements"]}
    for m in walk["measurements"]:  # the doctor watched every point that served
        if not m["ok"] and "consistency gate" in m["why"]:
            # Refused at load by the precision gate (which KV dtype the walk kept, and so which weight point it
            # tries, depends on measured timings): no server ran, nothing to watch.
            assert m["doctor"] is None, m
            continue
        assert m["doctor"] and m["doctor"][0]["bottleneck"], m
        if m["ok"] and m["succeeded"] > 0:  # streamed: TTFT and TPOT measured
            assert m["tpot_p99_ms"] > 0 and m["ttft_p99_ms"] > 0, m
    for s in walk["steps"]:
        assert s["stopped"], s
        # The verdict the step started from, and its reason, recorded with the step.
        assert s["doctor_verdict"] and s["doctor_reason"], s
        assert s["doctor"] == by_index[s["doctor_point"]]["doctor"]
        for i in s["points"]:
            assert by_index[i]["step"] == s["knob"]
    steps = {s["knob"]: s for s in walk["steps"]}
    assert steps["cuda_graphs"]["skipped"] and steps["cuda_graphs"]["stopped"] == "CPU"
    assert steps["async_output"]["skipped"] and steps["async_output"]["stopped"].startswith("CPU")
    # The step-time target aims at 0.8 of the TPOT SLO (1000 ms): one point, served with --target-step-ms 800.
    st = steps["target_step_ms"]
    assert not st["skipped"] and len(st["points"]) == 1, st
    assert by_index[st["points"][0]]["knobs"]["target_step_ms"] == 800
    # The KV-cache step tries the 8-bit caches; each server ran the consistency gate at load (a failing
    # precision would not start, so it could not be kept).
    kv = steps["kv_cache_dtype"]
    assert not kv["skipped"] and kv["points"], kv
    assert sorted(by_index[i]["knobs"]["kv_cache_dtype"] for i in kv["points"]) == ["fp8", "int8"]
    for i in kv["points"]:
        m = by_index[i]
        # Either the server passed its gate and the point was measured, or the gate refused it at load.
        assert m["ok"] or "consistency gate" in m["why"], m
        assert not (m["accepted"] and not m["ok"]), m
    # The weight step tries fp8 weights, gated at load the same way: measured, or refused by the gate.
    wp = steps["weight_precision"]
    assert not wp["skipped"] and len(wp["points"]) == 1, wp
    m = by_index[wp["points"][0]]
    assert m["knobs"]["quantization"] == "fp8", m
    assert m["ok"] or "consistency gate" in m["why"], m
    assert not (m["accepted"] and not m["ok"]), m
    # A refused point is reported as failed in the step's summary, not as a measured value.
    assert ("failed (no figure): fp8" in wp["stopped"]) == (not m["ok"]), wp
    for i in kv["points"]:
        if not by_index[i]["ok"]:
            assert "failed (no figure)" in kv["stopped"], kv
    assert not steps["max_num_seqs"]["skipped"] and steps["max_num_seqs"]["points"]
    for m in walk["measurements"]:  # rejected exactly when a p99 is over its SLO (or it failed)
        if m["ok"] and m["errors"] == 0 and m["valid"]:
            assert m["accepted"] == (m["tpot_p99_ms"] <= 1000 and m["p99_ms"] <= 20000), m
    assert walk["slo"]["tpot_p99_ms"] == 1000
    assert walk["confirmation"]["verdict"]
    assert len(re.findall(r"^tune #\d+", decoder["stderr"], flags=re.M)) == walk["measurement_count"]
    assert "--calibration-data" in decoder["stderr"] and "is not used" in decoder["stderr"], decoder["stderr"]


def test_decoder_toml_is_read_by_serve_config_unchanged(decoder, tmp_path):
    toml = decoder["dir"] / "walk" / "stoke.toml"
    text = toml.read_text()
    chosen = decoder["walk"]["chosen"]
    if chosen["max_num_seqs"] != "own":
        assert f"max-num-seqs = {chosen['max_num_seqs']}" in text
    assert 'no-prefix-cache = true\nmax-waiting = "512"\n' in text, text
    assert decoder["walk"]["serve_args"] == ["--no-prefix-cache", "--max-waiting", "512"]
    srv = start_decoder(decoder["model"], "--config", toml, log=tmp_path / "serve.log")
    try:
        assert srv.get("/v1/models").status_code == 200
    finally:
        srv.stop()
    # Every decoder key tune can write, in the form it writes them (allow-inconsistent: the keys are the point
    # here, not the gate's verdict on a random one-layer model at two lower precisions).
    every = tmp_path / "every.toml"
    every.write_text(f'model = "{decoder["model"]}"\ndevice = "cpu"\nmax-num-seqs = 4\nmax-num-batched-tokens = 64\n'
                     'no-chunked-prefill = true\ncuda-graphs = "off"\nkv-cache-dtype = "int8"\n'
                     'quantization = "fp8"\nallow-inconsistent = true\n')
    srv = start_decoder(decoder["model"], "--config", every, log=tmp_path / "serve2.log")
    srv.stop()


def test_decoder_report_renders_in_headless_chromium(decoder, tmp_path):
    path = decoder["dir"] / "walk" / "report.html"
    html = path.read_text()
    assert "<script" not in html
    for svg in re.findall(r"<svg.*?</svg>", html, flags=re.S):
        ET.fromstring(svg)
    titles = re.findall(r'font-weight="bold" text-anchor="middle">([^<]+)<', html)
    assert any(t.startswith("goodput vs max_num_seqs") for t in titles), titles
    assert "TPOT p99 vs max_num_seqs" in titles
    assert html.count("Doctor before this step") >= len(DECODER_STEPS)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium not installed (Debian package `chromium`)")
    shot = tmp_path / "report.png"
    r = subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                        f"--screenshot={shot}", "--window-size=1200,2400", path.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert shot.exists(), r.stderr
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_url_measures_a_running_server_and_names_the_next_flag(decoder, tmp_path):
    srv = start_decoder(decoder["model"], log=tmp_path / "serve.log")
    try:
        r = subprocess.run([str(stoke_bin_path()), "tune", "--url", srv.base_url, "--out", str(tmp_path / "url"),
                            "--slo-tpot-ms", "1000", "--concurrency", "4", "--input-len", "16", "--output-len", "8",
                            "--warmup", "0.3", "--window", "1.2", "--max-num-seqs-values", "2,4,8"],
                           capture_output=True, text=True, timeout=120)
    finally:
        srv.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    j = json.loads((tmp_path / "url" / "tune.json").read_text())
    assert j["mode"] == "url" and j["kind"] == "decoder" and j["measurement_count"] == 1
    assert j["measurements"][0]["doctor"][0]["bottleneck"]
    assert j["advice"]["flag"].startswith("--"), j["advice"]
    assert "starts itself" in j["advice"]["note"] and "starts itself" in r.stdout
    assert not (tmp_path / "url" / "stoke.toml").exists()  # nothing to serve: the model is the other server's


@pytest.mark.parametrize("args,needle", [
    (["--slo-tpot-ms", "-1"], "--slo-tpot-ms"),
    (["--slo-ttft-ms", "abc"], "--slo-ttft-ms"),
    (["--slo-ttft-ms", "nan"], "--slo-ttft-ms"),
    ([], "give an SLO"),
    (["--slo-tpot-ms", "50", "--max-num-seqs-values", "0,8"], "--max-num-seqs-values"),
    (["--slo-tpot-ms", "50", "--url", "ftp://x"], "--url"),
    (["--slo-tpot-ms", "50", "--serve-args", "--threads 2 --max-num-seqs 8"], "--max-num-seqs"),
])
def test_slo_options_are_validated(tmp_path, args, needle):
    r = subprocess.run([str(stoke_bin_path()), "tune", "--model", "x", "--out", str(tmp_path), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and needle in r.stderr, r.stderr


def test_ttft_slo_on_a_batched_model_exits_2(tmp_path):
    model = tmp_path / "synth.json"
    model.write_text(json.dumps(SYNTH))
    r = subprocess.run([str(stoke_bin_path()), "tune", "--model", str(model), "--out", str(tmp_path / "o"),
                        "--slo-ttft-ms", "100", "--warmup", "0.1", "--window", "0.3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--slo-ttft-ms" in r.stderr and "batched" in r.stderr, r.stderr
