#!/usr/bin/env python3
"""Emulates, lane by lane, the fragment indexing of decode_tiled.cu's DecodeFragKernel (--decode-attention
tiled over an 8-bit cache) for one warp's 16 keys on the CPU: Q's permuted fp16 A fragments, the K words read as B fragments
(8-bit codes -> fp16 by the kernel's bit moves / magic numbers), S = Q·K^T through an mma.m16n8k16 emulation
with the PTX fragment layouts, P' = P · v_scale · 2^fold, the V words' byte permutes into B fragments, O += P'·V',
and the accumulators' permuted head dimension written back in order. Compares S and O with a plain numpy
computation of the same attention over the dequantised codes. No GPU needed:
    python3 scripts/decode_frag_emu.py        (exit 0 and "ok" lines when every case matches)
(scripts/prefill_flash_emu.py does the same for the prefill kernel.)"""
import sys

import numpy as np

MASK32 = 0xFFFFFFFF


def byte_perm(x, y, s):
    b = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    return sum(b[(s >> (4 * i)) & 7] << (8 * i) for i in range(4))


def f16x2(w):
    """uint32 -> (low, high) fp16 values as float64."""
    h = np.array([w & 0xFFFF, w >> 16], dtype=np.uint16).view(np.float16).astype(np.float64)
    return h[0], h[1]


def pack_f16(lo, hi):
    b = np.array([lo, hi], dtype=np.float16).view(np.uint16).astype(np.uint32)
    return int(b[0]) | (int(b[1]) << 16)


def hsub2_9(w):
    lo, hi = f16x2(w)
    return pack_f16(lo - 9.0, hi - 9.0)


def lo_codes(w, fp8):
    if fp8:
        return (((w << 8) & 0x80008000) | ((w << 7) & 0x3F803F80)) & MASK32
    return hsub2_9(byte_perm(w ^ 0x80808080, 0x48484848, 0x4240))


def hi_codes(w, fp8):
    if fp8:
        return ((w & 0x80008000) | ((w >> 1) & 0x3F803F80)) & MASK32
    return hsub2_9(byte_perm(w ^ 0x80808080, 0x48484848, 0x4341))


def e4m3(b):
    s = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 15, b & 7
    return s * (m * 2.0 ** -9 if e == 0 else 2.0 ** (e - 7) * (1 + m / 8))


def code_value(b, fp8):
    return e4m3(b) if fp8 else float(np.int8(np.uint8(b)))


def mma(acc, a, b0, b1):
    """acc[lane] (4 floats) += A·B with A from a[lane][0..3], B from b0[lane], b1[lane] (fp16 pairs)."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        A[g, 2 * t:2 * t + 2] = f16x2(a[lane][0])
        A[g + 8, 2 * t:2 * t + 2] = f16x2(a[lane][1])
        A[g, 2 * t + 8:2 * t + 10] = f16x2(a[lane][2])
        A[g + 8, 2 * t + 8:2 * t + 10] = f16x2(a[lane][3])
        B[2 * t:2 * t + 2, g] = f16x2(b0[lane])
        B[2 * t + 8:2 * t + 10, g] = f16x2(b1[lane])
    C = A @ B
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        acc[lane][0] += C[g, 2 * t]
        acc[lane][1] += C[g, 2 * t + 1]
        acc[lane][2] += C[g + 8, 2 * t]
        acc[lane][3] += C[g + 8, 2 * t + 1]


def word(row_bytes, off):
    return int(row_bytes[off]) | int(row_bytes[off + 1]) << 8 | int(row_bytes[off + 2]) << 16 | int(row_bytes[off + 3]) << 24


def run(hd, fp8, group, seed):
    rng = np.random.default_rng(seed)
    fold = 8 if fp8 else 7
    q = rng.uniform(-2, 2, (16, hd)).astype(np.float32)
    q = (q.view(np.uint32) & 0xFFFF0000).view(np.float32).astype(np.float64)  # bf16 values
    q[group:] = 0
    if fp8:
        kc = rng.integers(0, 256, (16, hd), dtype=np.uint8)
        vc = rng.integers(0, 256, (16, hd), dtype=np.uint8)
        for c in (kc, vc):  # no NaN codes (the quantiser saturates)
            c[(c & 0x7F) == 0x7F] ^= 1
    else:
        kc = rng.integers(-127, 128, (16, hd)).astype(np.int8).view(np.uint8)
        vc = rng.integers(-127, 128, (16, hd)).astype(np.int8).view(np.uint8)
    kscale = rng.uniform(0.001, 0.02, 16)
    vscale = rng.uniform(0.001, 0.02, 16)
    scale_log2 = 1 / np.sqrt(hd) * 1.4426950408889634
    K = np.vectorize(lambda b: code_value(int(b), fp8))(kc) * kscale[:, None]
    V = np.vectorize(lambda b: code_value(int(b), fp8))(vc) * vscale[:, None]
    S_ref = (q @ K.T) * scale_log2  # [16 rows, 16 keys]

    # Q fragments: logical (2t, 2t+1) = physical 4t+0, 4t+2; (2t+8, 2t+9) = 4t+1, 4t+3; times 2^-4.
    ksteps = hd // 16
    qa = [[[0] * 4 for _ in range(32)] for _ in range(ksteps)]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for ks in range(ksteps):
            for half, row in ((0, g), (1, g + 8)):
                p = q[row, 16 * ks + 4 * t:16 * ks + 4 * t + 4] * 0.0625
                qa[ks][lane][half] = pack_f16(p[0], p[2])
                qa[ks][lane][half + 2] = pack_f16(p[1], p[3])
    s = [[[0.0] * 4 for _ in range(32)] for _ in range(2)]
    for n in range(2):
        for ks in range(ksteps):
            b0, b1 = [], []
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                w = word(kc[n * 8 + g], 16 * ks + 4 * t)
                b0.append(lo_codes(w, fp8))
                b1.append(hi_codes(w, fp8))
            mma(s[n], [qa[ks][lane] for lane in range(32)], b0, b1)
    s_mult = scale_log2 * 2.0 ** (4 + fold)
    S = np.zeros((16, 16))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for n in range(2):
            for e in range(4):
                k = n * 8 + 2 * t + (e & 1)
                row = g + (8 if e >= 2 else 0)
                s[n][lane][e] *= s_mult * kscale[k]
                S[row, k] = s[n][lane][e]
    err_s = np.abs(S - S_ref).max() / max(1e-9, np.abs(S_ref).max())

    # P = exp2(S - row max) (one tile: no online correction), P' = P · v_scale · 2^fold.
    mx = S.max(axis=1, keepdims=True)
    P = np.exp2(S - mx)
    P[group:] = 0  # rows past the group: Q zeros give S = 0 rows; their P is ignored
    O_ref = P @ V
    pa = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        pm = [vscale[k] * 2.0 ** fold for k in range(16)]
        pa.append([pack_f16(P[g, 2 * t] * pm[2 * t], P[g, 2 * t + 1] * pm[2 * t + 1]),
                   pack_f16(P[g + 8, 2 * t] * pm[2 * t], P[g + 8, 2 * t + 1] * pm[2 * t + 1]),
                   pack_f16(P[g, 2 * t + 8] * pm[2 * t + 8], P[g, 2 * t + 9] * pm[2 * t + 9]),
                   pack_f16(P[g + 8, 2 * t + 8] * pm[2 * t + 8], P[g + 8, 2 * t + 9] * pm[2 * t + 9])])
    dtiles = hd // 8
    o = [[[0.0] * 4 for _ in range(32)] for _ in range(dtiles)]
    for G in range(hd // 32):
        bl = {j: ([], []) for j in range(4)}
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            w0, w1 = word(vc[2 * t], 32 * G + 4 * g), word(vc[2 * t + 1], 32 * G + 4 * g)
            w8, w9 = word(vc[2 * t + 8], 32 * G + 4 * g), word(vc[2 * t + 9], 32 * G + 4 * g)
            a01, b01 = byte_perm(w0, w1, 0x5410), byte_perm(w0, w1, 0x7632)
            a89, b89 = byte_perm(w8, w9, 0x5410), byte_perm(w8, w9, 0x7632)
            for j, (x, y, f) in enumerate(((a01, a89, lo_codes), (a01, a89, hi_codes), (b01, b89, lo_codes),
                                           (b01, b89, hi_codes))):
                bl[j][0].append(f(x, fp8))
                bl[j][1].append(f(y, fp8))
        for j in range(4):
            mma(o[4 * G + j], pa, bl[j][0], bl[j][1])
    O = np.zeros((16, hd))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for nt in range(dtiles):
            d = 32 * (nt >> 2) + (nt & 3)
            O[g, 8 * t + d] = o[nt][lane][0]
            O[g, 8 * t + d + 4] = o[nt][lane][1]
            O[g + 8, 8 * t + d] = o[nt][lane][2]
            O[g + 8, 8 * t + d + 4] = o[nt][lane][3]
    err_o = np.abs(O[:group] - O_ref[:group]).max() / max(1e-9, np.abs(O_ref[:group]).max())
    return err_s, err_o


def main():
    bad = 0
    for hd in (64, 128):
        for fp8 in (True, False):
            for group, seed in ((4, 1), (16, 2), (7, 3)):
                es, eo = run(hd, fp8, group, seed)
                ok = es < 2e-3 and eo < 2e-3
                bad += not ok
                print(f"{'ok ' if ok else 'BAD'} hd={hd} {'fp8' if fp8 else 'int8'} group={group}: "
                      f"S rel err {es:.2e}, O rel err {eo:.2e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
