"""ggml's K-quant reference quantizers (``quantize_row_q{2,3,4,5,6}_K_ref``) in numpy, byte for byte.

These are what llama.cpp's ``quantize`` writes without an importance matrix. Every float32 operation runs in
ggml's order (sums element by element, no fused multiply-add) and rounds with ggml's ``nearest_int``, so the
bytes are identical. The searches (``make_qkx2_quants``, ``make_q3_quants``, ``make_qx_quants``) loop over the
16 or 32 values of a sub-block and over their search steps, vectorised across all sub-blocks at once.
"""

from __future__ import annotations

import numpy as np

from .blocks import F32, f16_bytes, f16_round, first_absmax, nearest_int, running_max, running_min_max, seq_sum
from .kquants import scale_min_runs

GROUP_MAX_EPS = F32(1e-15)


def make_qkx2(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int,
              use_mad: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_qkx2_quants`` for sub-blocks ``x [S, n]`` with weights ``w``: (scale [S], the_min [S], L [S, n])."""
    mn, mx = running_min_max(x)
    sum_w, sum_x = w[:, 0].copy(), w[:, 0] * x[:, 0]
    for i in range(1, x.shape[1]):
        sum_w, sum_x = sum_w + w[:, i], sum_x + w[:, i] * x[:, i]
    mn = np.where(mn > 0, F32(0), mn)
    flat = mx == mn

    def error(scale: np.ndarray, offset: np.ndarray, levels: np.ndarray) -> np.ndarray:
        diff = scale[:, None] * levels + offset[:, None] - x
        return seq_sum(w * (np.abs(diff) if use_mad else diff * diff))

    def levels(iscale: np.ndarray, offset: np.ndarray) -> np.ndarray:
        return np.clip(nearest_int(iscale[:, None] * (x - offset[:, None])), 0, nmax).astype(F32)

    iscale = F32(nmax) / (mx - mn)
    scale = F32(1) / iscale
    L = levels(iscale, mn)
    best = error(scale, mn, L)
    for step in range(nstep + 1):
        la = levels((F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / (mx - mn), mn)
        wl = w * la
        sum_l, sum_l2, sum_xl = seq_sum(wl), seq_sum(wl * la), seq_sum(wl * x)
        det = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        positive = this_min > 0
        this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
        this_min = np.where(positive, F32(0), this_min)
        cur = error(this_scale, this_min, la)
        take = (det > 0) & (cur < best) & ~flat
        L = np.where(take[:, None], la, L)
        best, scale, mn = np.where(take, cur, best), np.where(take, this_scale, scale), np.where(take, this_min, mn)
    return np.where(flat, F32(0), scale), -mn, np.where(flat[:, None], F32(0), L).astype(np.int32)


def make_q3(x: np.ndarray, nmax: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """``make_q3_quants(n, nmax, x, L, do_rmse=true)``: (scale [S], L [S, n] in 0..2*nmax-1)."""
    amax, mx = first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    L = np.clip(nearest_int((F32(-nmax) / mx)[:, None] * x), -nmax, nmax - 1).astype(F32)
    w = x * x
    wx = w * x
    sumlx, suml2 = seq_sum(wx * L), seq_sum(w * L * L)
    for _ in range(5):
        for i in range(x.shape[1]):
            li = L[:, i]
            slx = sumlx - wx[:, i] * li
            sl2 = suml2 - w[:, i] * li * li
            new = np.clip(nearest_int(x[:, i] * sl2 / slx), -nmax, nmax - 1).astype(F32)
            slx = slx + wx[:, i] * new
            sl2 = sl2 + w[:, i] * new * new
            ok = (sumlx - wx[:, i] * li > 0) & (new != li) & (sl2 > 0) & (slx * slx * suml2 > sumlx * sumlx * sl2)
            L[:, i] = np.where(ok, new, li)
            sumlx, suml2 = np.where(ok, slx, sumlx), np.where(ok, sl2, suml2)
    scale = np.where(suml2 > 0, sumlx / suml2, F32(0))
    return np.where(zero, F32(0), scale), np.where(zero[:, None], 0, L.astype(np.int32) + nmax)


def make_qx(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL)``: (scale [S], L [S, n] in 0..2*nmax-1)."""
    amax, mx = first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    w = x * x
    wx = w * x

    def trial(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lv = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1).astype(F32)
        return lv, seq_sum(wx * lv), seq_sum(w * lv * lv)

    L, sumlx, suml2 = trial(F32(-nmax) / mx)
    scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
    best = scale * sumlx
    for step in (*range(-9, 0), *range(1, 10)):
        lv, slx, sl2 = trial(-(F32(nmax) + F32(0.1) * F32(step)) / mx)
        ok = (sl2 > 0) & (slx * slx > best * sl2)
        L = np.where(ok[:, None], lv, L)
        scale = np.where(ok, slx / sl2, scale)
        best = np.where(ok, scale * slx, best)
    return np.where(zero, F32(0), scale), np.where(zero[:, None], 0, L.astype(np.int32) + nmax)


def _requant(x: np.ndarray, d: np.ndarray, dm: np.ndarray | None, lo: int, hi: int, keep: np.ndarray) -> np.ndarray:
    """``if (!d) keep; else L = clamp(nearest_int((x + dm)/d))`` per sub-block (``x [S, n]``, ``d [S]``)."""
    num = x if dm is None else x + dm[:, None]
    q = np.clip(nearest_int(num / d[:, None]), lo, hi)
    return np.where((d == 0)[:, None], keep, q)


def _pack_2bit(L: np.ndarray) -> np.ndarray:
    """``qs[j/4 + l] = L[j+l] | L[j+l+32] << 2 | L[j+l+64] << 4 | L[j+l+96] << 6`` for j in (0, 128)."""
    q = L.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def encode_q2_k(blocks: np.ndarray) -> np.ndarray:
    nb = blocks.shape[0]
    x = blocks.reshape(nb * 16, 16)
    scales, mins, L = make_qkx2(x, np.abs(x), 3, -0.5, 0.1, 15, True)
    scales, mins = scales.reshape(nb, 16), mins.reshape(nb, 16)
    max_scale, max_min = running_max(scales), running_max(mins)
    ls = np.where((max_scale > 0)[:, None], nearest_int((F32(15) / max_scale)[:, None] * scales) & 0xFF, 0)
    lm = np.where((max_min > 0)[:, None], nearest_int((F32(15) / max_min)[:, None] * mins), 0)
    packed = (ls | (lm << 4)) & 0xFF
    d = np.where(max_scale > 0, max_scale / F32(15), F32(0))
    dmin = np.where(max_min > 0, max_min / F32(15), F32(0))
    dl = (f16_round(d)[:, None] * (packed & 0x0F).astype(F32)).reshape(-1)
    ml = (f16_round(dmin)[:, None] * (packed >> 4).astype(F32)).reshape(-1)
    L = _requant(x, dl, ml, 0, 3, L).reshape(nb, 256)
    return np.concatenate([packed.astype(np.uint8), _pack_2bit(L), f16_bytes(d), f16_bytes(dmin)], axis=1)


def encode_q3_k(blocks: np.ndarray) -> np.ndarray:
    nb = blocks.shape[0]
    x = blocks.reshape(nb * 16, 16)
    scales, L = make_q3(x)
    scales = scales.reshape(nb, 16)
    _, max_scale = first_absmax(scales)
    has = max_scale != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(-32) / max_scale
        raw = nearest_int(iscale[:, None] * scales)
    ls = np.where(has[:, None], np.clip(((raw + 128) & 0xFF) - 128, -32, 31) + 32, 0)  # int8_t wrap, clamp
    packed = np.zeros((nb, 12), dtype=np.int32)
    packed[:, :8] = (ls[:, :8] & 0x0F) | ((ls[:, 8:] & 0x0F) << 4)
    for j in range(16):
        packed[:, 8 + j % 4] |= (ls[:, j] >> 4) << (2 * (j // 4))
    d = np.where(has, F32(1) / iscale, F32(0))
    dl = (f16_round(d)[:, None] * (ls - 32).astype(F32)).reshape(-1)
    L = _requant(x, dl, None, -4, 3, L - 4).reshape(nb, 8, 32) + 4
    hmask = sum(((L[:, b] > 3).astype(np.uint8) << b) for b in range(8))
    L = np.where(L > 3, L - 4, L).reshape(nb, 256)
    return np.concatenate([hmask, _pack_2bit(L), packed.astype(np.uint8), f16_bytes(d)], axis=1)


def _encode_q45_k(blocks: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """Shared Q4_K / Q5_K body: (12 header+scale bytes with d and dmin first, L [nb, 256] in 0..nmax)."""
    nb = blocks.shape[0]
    x = blocks.reshape(nb * 8, 32)
    av_x = np.sqrt(seq_sum(x * x) / F32(32))
    scales, mins, L = make_qkx2(x, av_x[:, None] + np.abs(x), nmax, rmin, 0.1, nstep, False)
    scales, mins = scales.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale, max_min = running_max(scales), running_max(mins)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
    ls = np.minimum(nearest_int(inv_scale[:, None] * scales) & 0xFF, 63)
    lm = np.minimum(nearest_int(inv_min[:, None] * mins) & 0xFF, 63)
    packed = np.concatenate(scale_min_runs(ls, lm), axis=1).astype(np.uint8)
    d, dmin = max_scale / F32(63), max_min / F32(63)
    dl = (f16_round(d)[:, None] * ls.astype(F32)).reshape(-1)
    ml = (f16_round(dmin)[:, None] * lm.astype(F32)).reshape(-1)
    L = _requant(x, dl, ml, 0, nmax, L).reshape(nb, 256)
    return np.concatenate([f16_bytes(d), f16_bytes(dmin), packed], axis=1), L


def encode_q4_k(blocks: np.ndarray) -> np.ndarray:
    head, L = _encode_q45_k(blocks, 15, -1.0, 20)
    q = L.reshape(-1, 4, 2, 32).astype(np.uint8)
    return np.concatenate([head, (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)], axis=1)


def encode_q5_k(blocks: np.ndarray) -> np.ndarray:
    head, L = _encode_q45_k(blocks, 31, -0.5, 15)
    sub = L.reshape(-1, 8, 32).astype(np.uint8)
    qh = sum((((sub[:, s] >> 4) & 1) << s) for s in range(8)).astype(np.uint8)
    q = (sub & 0x0F).reshape(-1, 4, 2, 32)
    return np.concatenate([head, qh, (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)], axis=1)


def encode_q6_k(blocks: np.ndarray) -> np.ndarray:
    nb = blocks.shape[0]
    x = blocks.reshape(nb * 16, 16)
    scales, L = make_qx(x, 32)
    scales = scales.reshape(nb, 16)
    max_abs, max_scale = first_absmax(scales)
    live = max_abs >= GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = F32(-128) / max_scale
        sc = np.minimum(127, nearest_int(iscale[:, None] * scales))
    sc = np.where(live[:, None], ((sc + 128) & 0xFF) - 128, 0)  # stored as int8
    d = np.where(live, F32(1) / iscale, F32(0))
    dl = (f16_round(d)[:, None] * sc.astype(F32)).reshape(-1)
    L = _requant(x, dl, None, -32, 31, L - 32).reshape(nb, 2, 4, 32) + 32
    L = np.where(live[:, None, None, None], L, 0).astype(np.uint8)
    ql = np.concatenate([(L[:, :, 0] & 0x0F) | ((L[:, :, 2] & 0x0F) << 4),
                         (L[:, :, 1] & 0x0F) | ((L[:, :, 3] & 0x0F) << 4)], axis=2).reshape(nb, 128)
    qh = sum(((L[:, :, k] >> 4) << (2 * k)) for k in range(4)).astype(np.uint8).reshape(nb, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), f16_bytes(d)], axis=1)
