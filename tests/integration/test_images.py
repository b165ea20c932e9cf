"""The image model kind (issue 19) through `stoke serve`, driven by tritonclient (KServe v2 HTTP):

  - random-weight ResNet-50, MobileNetV2 and MobileNetV3-small graphs (tests/fixtures/cnn_models.py, torchvision's
    topology at a smaller width and resolution): FP32 tensors through "<name>-tensor"; the scores match
    onnxruntime on the same file (top-1 identical, max |difference| within 2e-5 of the largest |logit|);
  - the real pretrained classifier (PaddleOCR's text-direction classifier, alias ppocr-mobile-v2-cls): scikit-image's
    sample photos, upright and turned 180 degrees, as JPEG and PNG bytes; stoke decodes, resizes, normalises and
    classifies; the reference decodes with Pillow, preprocesses with numpy (the same bilinear resize) and runs
    onnxruntime: top-1 identical on every image, max |difference| of the probabilities within 1e-4;
  - a batch of images gives each image's result alone; bad input is a 400 that names the problem; the ledger of
    an image request has its preprocess, compute and postprocess stages;
  - the image model kind beside a decoder and an encoder in one process (the one model repository), each
    answering its own protocol.
"""
import io
import json
import math
import pathlib
import sys

import numpy as np
import pytest
import requests

from classic_server import ClassicServer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "fixtures"))
import cnn_models  # noqa: E402

httpclient = pytest.importorskip("tritonclient.http")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
skdata = pytest.importorskip("skimage.data")
Image = pytest.importorskip("PIL.Image")

RANDOM_MODELS = {"resnet50": 64, "mobilenet_v2": 96, "mobilenet_v3_small": 96}
PHOTOS = ["astronaut", "camera", "chelsea", "coffee", "text", "page", "coins", "moon", "clock", "rocket"]
PROB_TOL = 1e-4


def infer(client, model, name, array, datatype, outputs=("scores", "top_k_index", "top_k_score", "top_k_label")):
    inp = httpclient.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    res = client.infer(model, [inp], outputs=[httpclient.InferRequestedOutput(o) for o in outputs])
    return {o: res.as_numpy(o) for o in outputs}


@pytest.fixture(scope="module", params=list(RANDOM_MODELS))
def random_model(request, stoke_bin, tmp_path_factory):
    name, size = request.param, RANDOM_MODELS[request.param]
    d = tmp_path_factory.mktemp(name)
    path = d / f"{name}.onnx"
    onnx.save(cnn_models.MODELS[name](), str(path))
    spec = {"type": "image", "name": name, "model": path.name, "preprocess": {"height": size, "width": size},
            "max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 1000}}
    (d / "model.json").write_text(json.dumps(spec))
    server = ClassicServer(stoke_bin, d / "model.json", log_dir=d)
    yield name, size, path, server
    server.stop()


def test_random_cnn_scores_match_onnxruntime(random_model):
    name, size, path, server = random_model
    client = httpclient.InferenceServerClient(url=server.http_url)
    x = np.random.RandomState(7).randn(6, 3, size, size).astype(np.float32)
    ref = ort.InferenceSession(str(path)).run(None, {"input": x})[0]
    got = infer(client, f"{name}-tensor", "input", x, "FP32")["scores"]
    assert got.shape == ref.shape
    diff = np.abs(got - ref).max()
    scale = max(1.0, float(np.abs(ref).max()))
    print(f"{name}: max |stoke - onnxruntime| = {diff:.3g} (largest |score| {scale:.3g})")
    assert diff <= 2e-5 * scale, (diff, scale)
    np.testing.assert_array_equal(got.argmax(1), ref.argmax(1))
    # One row alone gives the row's batched result.
    one = infer(client, f"{name}-tensor", "input", x[2:3], "FP32")["scores"]
    assert np.abs(one[0] - got[2]).max() <= 1e-5 * scale


def test_random_cnn_model_metadata(random_model):
    name, size, _, server = random_model
    meta = requests.get(f"{server.base_url}/v2/models/{name}").json()
    assert meta["platform"] == "stoke_onnx_cnn"
    assert meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1, 1]}]
    meta = requests.get(f"{server.base_url}/v2/models/{name}-tensor").json()
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, size, size]}]
    assert [o["name"] for o in meta["outputs"]] == ["scores", "top_k_index", "top_k_score", "top_k_label"]


# --- the real classifier on real photos --------------------------------------------------------------------


def photo(name, turned):
    img = getattr(skdata, name)()
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    if turned:
        img = np.ascontiguousarray(img[::-1, ::-1])
    return img


def encode(img, fmt):
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def taps(n_in, n_out):
    """Bilinear with half-pixel centres, no antialiasing (engine/image/preprocess.cc, OpenCV's INTER_LINEAR)."""
    src = np.maximum((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    return i0, np.minimum(i0 + 1, n_in - 1), (src - i0).astype(np.float32)


def resize(img, oh, ow):
    y0, y1, wy = taps(img.shape[0], oh)
    x0, x1, wx = taps(img.shape[1], ow)
    f = img.astype(np.float32)
    wx = wx[None, :, None]
    top = f[y0][:, x0] * (1 - wx) + f[y0][:, x1] * wx
    bot = f[y1][:, x0] * (1 - wx) + f[y1][:, x1] * wx
    return top * (1 - wy[:, None, None]) + bot * wy[:, None, None]


def ppocr_reference_input(encoded):
    """RapidOCR's TextClassifier.resize_norm_img: BGR, height 48, width in proportion (<= 192), (x/255-0.5)/0.5,
    zero padding on the right."""
    rgb = np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"))
    h, w = rgb.shape[:2]
    rw = min(192, math.ceil(48 * w / h))
    x = resize(rgb, 48, rw)[:, :, ::-1]  # BGR
    x = (x / 255.0 - 0.5) / 0.5
    out = np.zeros((3, 48, 192), np.float32)
    out[:, :, :rw] = x.transpose(2, 0, 1)
    return out


@pytest.fixture(scope="module")
def ppocr(stoke_bin, ppocr_cls_path, tmp_path_factory):
    server = ClassicServer(stoke_bin, "ppocr-mobile-v2-cls", "--max-batch-size", 8,
                           log_dir=tmp_path_factory.mktemp("ppocr"))
    yield server, ort.InferenceSession(str(ppocr_cls_path))
    server.stop()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_pretrained_classifier_on_photos(ppocr, fmt):
    server, sess = ppocr
    client = httpclient.InferenceServerClient(url=server.http_url)
    worst = 0.0
    for name in PHOTOS:
        for turned in (False, True):
            data = encode(photo(name, turned), fmt)
            got = infer(client, "ppocr-mobile-v2-cls", "image", np.array([[data]], dtype=object), "BYTES")
            ref = sess.run(None, {"x": ppocr_reference_input(data)[None]})[0][0]
            diff = float(np.abs(got["scores"][0] - ref).max())
            worst = max(worst, diff)
            assert got["top_k_index"][0][0] == ref.argmax(), (name, turned, got["scores"], ref)
            assert got["top_k_label"][0][0].decode() == ["0", "180"][ref.argmax()]
            np.testing.assert_allclose(got["top_k_score"][0], np.sort(got["scores"][0])[::-1], rtol=1e-6)
    print(f"ppocr-mobile-v2-cls, {fmt}: {2 * len(PHOTOS)} photos, max |stoke - onnxruntime| = {worst:.3g}")
    assert worst <= PROB_TOL


def test_pretrained_classifier_reads_text_direction(ppocr):
    """The model's job on text lines: scikit-image's photo of text and three lines cut from its scanned page read
    as upright ("0"), and turned over as "180"."""
    server, _ = ppocr
    client = httpclient.InferenceServerClient(url=server.http_url)
    page = photo("page", False)
    lines = [photo("text", False)] + [np.ascontiguousarray(page[top:top + 24]) for top in (0, 16, 48)]
    for i, line in enumerate(lines):
        for turned, label in ((False, "0"), (True, "180")):
            img = np.ascontiguousarray(line[::-1, ::-1]) if turned else line
            got = infer(client, "ppocr-mobile-v2-cls", "image", np.array([[encode(img, "PNG")]], dtype=object),
                        "BYTES")
            assert got["top_k_label"][0][0].decode() == label, (i, turned, got["scores"])


def test_batch_of_images_equals_each_alone(ppocr):
    server, _ = ppocr
    client = httpclient.InferenceServerClient(url=server.http_url)
    images = [encode(photo(n, t), "JPEG") for n in PHOTOS[:4] for t in (False, True)]
    batch = infer(client, "ppocr-mobile-v2-cls", "image", np.array([[b] for b in images], dtype=object), "BYTES")
    assert batch["scores"].shape == (8, 2) and batch["top_k_label"].shape == (8, 2)
    for i, data in enumerate(images):
        one = infer(client, "ppocr-mobile-v2-cls", "image", np.array([[data]], dtype=object), "BYTES")
        np.testing.assert_allclose(one["scores"][0], batch["scores"][i], atol=1e-6)


def test_bad_inputs_are_400s_naming_the_problem(ppocr):
    server, _ = ppocr
    url = f"{server.base_url}/v2/models/ppocr-mobile-v2-cls/infer"
    body = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1, 1], "data": ["not an image"]}]}
    r = requests.post(url, json=body)
    assert r.status_code == 400 and "not a JPEG or PNG" in r.json()["error"], r.text
    truncated = encode(photo("coffee", False), "PNG")[:40]
    r = requests.post(url, json={"inputs": [{**body["inputs"][0], "data": [truncated.decode("latin-1")]}]})
    assert r.status_code == 400, r.text
    r = requests.post(f"{server.base_url}/v2/models/ppocr-mobile-v2-cls-tensor/infer",
                      json={"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 48, 100],
                                        "data": [0.0] * (3 * 48 * 100)}]})
    assert r.status_code == 400 and "dim 3 is 100 but the model needs 192" in r.json()["error"], r.text


def test_image_request_ledger(ppocr):
    server, _ = ppocr
    client = httpclient.InferenceServerClient(url=server.http_url)
    inp = httpclient.InferInput("image", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[encode(photo("chelsea", False), "JPEG")]], dtype=object))
    res = client.infer("ppocr-mobile-v2-cls", [inp], headers={"X-Stoke-Ledger": "1"})
    stages = res.get_response()["ledger"]["stages_ms"]
    # Decode + resize is preprocess, the CNN is compute, top-k is postprocess; nothing is copied on the CPU.
    # (postprocess is a few microseconds: present, but it may print as 0.000 ms)
    assert stages["preprocess"] > 0 and stages["compute"] > 0 and stages["postprocess"] >= 0, stages
    assert stages["h2d"] == 0 and stages["d2h"] == 0, stages


def test_grpc_carries_images_too(ppocr):
    """The same model over KServe v2 gRPC (tritonclient.grpc): JPEG bytes in, the HTTP path's answer out."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    server, _ = ppocr
    data = encode(photo("text", True), "JPEG")
    inp = grpcclient.InferInput("image", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[data]], dtype=object))
    res = grpcclient.InferenceServerClient(url=server.grpc_url).infer("ppocr-mobile-v2-cls", [inp])
    http = infer(httpclient.InferenceServerClient(url=server.http_url), "ppocr-mobile-v2-cls", "image",
                 np.array([[data]], dtype=object), "BYTES")
    np.testing.assert_allclose(res.as_numpy("scores"), http["scores"], atol=1e-6)
    assert res.as_numpy("top_k_label")[0][0] == b"180"


# --- one process, three kinds ------------------------------------------------------------------------------


def test_image_model_beside_a_decoder_and_an_encoder(stoke_bin, smollm2_path, minilm_path, ppocr_cls_path,
                                                     tmp_path):
    """A decoder and an encoder from --model, the image classifier from a --model-repository folder (kind = "image"
    in its stoke.toml): each answers its own protocol, at the same time, and refuses the others' routes."""
    import concurrent.futures

    grpcclient = pytest.importorskip("tritonclient.grpc")
    repo = tmp_path / "models"
    (repo / "cls").mkdir(parents=True)
    (repo / "cls" / "stoke.toml").write_text('source = "ppocr-mobile-v2-cls"\nkind = "image"\nmax_batch_size = 4\n')
    s = ClassicServer(stoke_bin, None, "--model", f"chat={smollm2_path}", "--model", f"minilm={minilm_path}",
                      "--model-repository", repo, "--threads", "2", log_dir=tmp_path)
    try:
        assert [m["id"] for m in s.get("/v1/models").json()["data"]] == [
            "chat", "minilm", "minilm-ids", "cls", "cls-tensor"]
        idx = {m["name"]: m["state"] for m in s.post("/v2/repository/index").json()}
        assert idx == dict.fromkeys(["chat", "minilm", "minilm-ids", "cls", "cls-tensor"], "READY"), idx
        assert httpclient.InferenceServerClient(url=s.http_url).get_model_config("cls")["max_batch_size"] == 4
        turned = encode(photo("text", True), "JPEG")

        def chat(_):
            r = s.post("/v1/chat/completions", json={"model": "chat", "max_tokens": 8,
                                                     "messages": [{"role": "user", "content": "Say hello."}]})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"]

        def embed(_):
            r = s.post("/v1/embeddings", json={"model": "minilm", "input": ["two models", "one process"]})
            assert r.status_code == 200, r.text
            return [len(d["embedding"]) for d in r.json()["data"]]

        def classify(module, url):
            inp = module.InferInput("image", [1, 1], "BYTES")
            inp.set_data_from_numpy(np.array([[turned]], dtype=object))
            res = module.InferenceServerClient(url=url).infer("cls", [inp])
            return res.as_numpy("top_k_label")[0][0]

        # job -> what it must answer (None: any non-empty text)
        jobs = {chat: None, embed: [384, 384], lambda _: classify(httpclient, s.http_url): b"180",
                lambda _: classify(grpcclient, s.grpc_url): b"180"}
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(lambda f: (f, f(None)), list(jobs) * 2))
        for f, res in results:
            assert res if jobs[f] is None else res == jobs[f], (f, res)

        # Each route refuses the other kinds, naming the kind.
        r = s.post("/v1/chat/completions", json={"model": "cls", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and "image model" in r.json()["error"]["message"], r.text
        r = s.post("/v1/embeddings", json={"model": "cls", "input": "x"})
        assert r.status_code == 400 and "image model" in r.json()["error"]["message"], r.text
        assert s.post("/v2/models/chat/infer", json={"inputs": []}).status_code == 404
        assert "cls" in {dict(labels).get("model_name") for (_, labels) in s.metrics()}
        # The image model unloads and loads again; the others never notice.
        assert s.post("/v2/repository/models/cls/unload").status_code == 200
        assert s.get("/v2/models/cls-tensor/ready").status_code == 400
        assert chat(None) and embed(None) == [384, 384]
        assert s.post("/v2/repository/models/cls/load").status_code == 200
        assert classify(grpcclient, s.grpc_url) == b"180"
    finally:
        assert s.stop() == 0, s.log()


def test_gpu_flags_refused_clearly_where_they_cannot_run(stoke_bin, tmp_path):
    """--preprocess gpu (or nvjpeg) with the model on the CPU (device auto keeps image models there) is refused at load naming
    --device cuda, as is --conv-backend cudnn or im2col; --device cuda without CUDA in the build or without a GPU is refused saying which (on a GPU host
    with a CUDA build it serves: that case is bench/gpu/images.sh's)."""
    import subprocess

    path = tmp_path / "tiny.onnx"
    onnx.save(cnn_models.MODELS["tiny"](), str(path))

    def serve(*flags):
        try:
            r = subprocess.run([str(stoke_bin), "serve", "--model", str(path), "--port", "0", "--grpc-port", "-1",
                                *flags], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None  # it loaded and served
        return r

    r = serve("--preprocess", "gpu")
    assert r is not None and r.returncode != 0
    assert "GPU preprocessing needs the model on the GPU too (--device cuda)" in r.stderr, r.stderr[-2000:]
    r = serve("--preprocess", "nvjpeg")
    assert r is not None and r.returncode != 0
    assert "--preprocess nvjpeg: the model runs on the CPU" in r.stderr, r.stderr[-2000:]
    # --conv-backend is the GPU executor's choice: other than auto on a CPU model is a usage error, not ignored.
    for backend in ("cudnn", "im2col"):
        r = serve("--device", "cpu", "--conv-backend", backend)
        assert r is not None and r.returncode != 0
        assert f"--conv-backend {backend}: the image model runs on the CPU" in r.stderr, r.stderr[-2000:]
        assert "--device cuda" in r.stderr, r.stderr[-2000:]
    r = serve("--conv-backend", "winograd")  # CLI11 refuses it before anything loads
    assert r is not None and r.returncode != 0
    assert "--conv-backend" in r.stderr, r.stderr[-2000:]
    r = serve("--device", "cuda")
    if r is None:
        pytest.skip("this stoke has CUDA and sees a GPU: --device cuda serves")
    assert r.returncode != 0
    assert "built without CUDA" in r.stderr or "no CUDA GPU is visible" in r.stderr, r.stderr[-2000:]
