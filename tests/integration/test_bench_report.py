"""The HTML report is self-contained and draws its charts: checked as text, as XML, and in headless Chromium."""
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "fixtures"))
from bench_helpers import DelayServer, run_bench, stoke_bin_path  # noqa: E402


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    if not stoke_bin_path().exists():
        pytest.fail(f"stoke binary not found at {stoke_bin_path()}")
    out = tmp_path_factory.mktemp("bench_report")
    with DelayServer("--ttft-ms", 30, "--itl-ms", 8, "--workers", 2) as srv:
        run_bench(srv.url, out, "--api", "openai-completions", "--concurrency", "1,2,4", "--input-len", 16,
                  "--output-len", 8, "--slo", "ttft=80ms,tpot=20ms", "--warmup", 0.5, "--window", 1,
                  "--duration", 2, "--stability", 0)
    return out


def test_html_is_self_contained_with_well_formed_svg_charts(report_dir):
    html = (report_dir / "report.html").read_text()
    assert "<script" not in html and "<link" not in html and " src=" not in html
    svgs = re.findall(r"<svg.*?</svg>", html, flags=re.S)
    # throughput, tokens/s, latency, TTFT, TPOT vs load; TTFT, ITL, latency CDFs; server running/waiting
    # and stage charts.
    assert len(svgs) >= 10
    for svg in svgs:
        root = ET.fromstring(svg)  # well-formed XML
        assert root.tag.endswith("svg")
    titles = re.findall(r'font-weight="bold" text-anchor="middle">([^<]+)<', html)
    for t in ("Throughput vs load", "End-to-end latency vs load", "TTFT distribution (CDF)",
              "Inter-token latency distribution (CDF)", "Requests in the server"):
        assert t in titles, titles
    # Every chart drew at least one series line.
    assert all('class="series"' in s for s in svgs)
    for f in ("bench.json", "bench.csv"):
        assert (report_dir / f).stat().st_size > 0


def png_filtered_bytes(path):
    """The filtered scanline bytes of a PNG (no filter reversal): a blank page filters to almost all zeros."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    return width, height, zlib.decompress(idat)


def test_report_renders_in_headless_chromium(report_dir, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium not installed (Debian package `chromium`)")
    shot = tmp_path / "report.png"
    r = subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                        f"--screenshot={shot}", "--window-size=1400,3000", (report_dir / "report.html").as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert shot.exists(), r.stderr
    width, height, raw = png_filtered_bytes(shot)
    assert (width, height) == (1400, 3000)
    nonzero = sum(1 for b in raw[::7] if b) / len(raw[::7])
    assert nonzero > 0.01, f"screenshot looks blank ({nonzero:.4f} of sampled bytes non-zero)"
    # Keep it for a human to look at when run with --basetemp.
    shutil.copy(shot, report_dir / "report.png")


def test_render_subcommand_redraws_the_report(report_dir, tmp_path):
    r = subprocess.run([str(stoke_bin_path()), "bench", "render", str(report_dir / "bench.json"), "--output-dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "report.html").read_text() == (report_dir / "report.html").read_text()
    assert "c=4" in r.stdout
