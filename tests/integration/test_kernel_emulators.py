"""The CPU emulations of the tiled CUDA kernels' fragment indexing (scripts/*_emu.py): the tensor-core kernels
cannot run here, but the index arithmetic that a wrong byte permute or fragment mapping would break can.

decode_frag_emu.py follows decode_tiled.cu's DecodeFragKernel (--decode-attention tiled over an 8-bit cache) lane by lane for
fp8 and int8 codes, head_dim 64 and 128, GQA groups of 4, 16 and 7, and exits non-zero when S or O differ from
numpy's attention over the dequantised codes (a mutated byte permute or output column fails it: checked by
hand when it was written)."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_decode_fragments_kernel_indexing_matches_numpy():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "decode_frag_emu.py")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ok ") == 12, r.stdout
