"""Shared pytest fixtures: where the stoke binary and the real models are.

Environment:
  STOKE_BIN        path to the stoke binary (default: build/release/apps/stoke/stoke)
  STOKE_BUILD_DIR  build folder holding test tools (default: build/release)
  STOKE_MODEL_DIR  model folder (default: ~/.cache/stoke/models); CI fetches the models there first
"""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("STOKE_BUILD_DIR", ROOT / "build" / "release"))


def stoke_bin_path() -> pathlib.Path:
    return pathlib.Path(os.environ.get("STOKE_BIN", build_dir() / "apps" / "stoke" / "stoke"))


def model_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("STOKE_MODEL_DIR", pathlib.Path.home() / ".cache" / "stoke" / "models"))


SMOLLM2_GGUF = "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_DIR = "all-minilm-l6-v2"
PPOCR_CLS_ONNX = "ppocr-mobile-v2-cls/ch_ppocr_mobile_v2.0_cls_infer.onnx"


@pytest.fixture(scope="session")
def stoke_bin() -> pathlib.Path:
    p = stoke_bin_path()
    if not p.exists():
        pytest.fail(f"stoke binary not found at {p}; build first (scripts/test.sh does)")
    return p


@pytest.fixture(scope="session")
def smollm2_path() -> pathlib.Path:
    p = model_dir() / SMOLLM2_GGUF
    if not p.exists():
        pytest.skip(f"{p} missing: run `stoke model fetch smollm2-135m-instruct`")
    return p


@pytest.fixture(scope="session")
def minilm_path() -> pathlib.Path:
    p = model_dir() / MINILM_DIR
    if not (p / "model.safetensors").exists():
        pytest.skip(f"{p} missing: run `stoke model fetch all-minilm-l6-v2`")
    return p


@pytest.fixture(scope="session")
def ppocr_cls_path() -> pathlib.Path:
    p = model_dir() / PPOCR_CLS_ONNX
    if not p.exists():
        pytest.skip(f"{p} missing: run `stoke model fetch ppocr-mobile-v2-cls`")
    return p
