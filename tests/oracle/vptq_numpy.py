"""Independent numpy/float64 oracle for VPTQ dequantization, written from the format as VPTQ documents it (its
``VQuantLinear`` docstring and tensor shapes) and docs/formats.md "VPTQ". Plain Python loops over weights; small
shapes only. Shares no code with qlinear.

As read here: output row ``n`` is element ``n % v`` of vector ``n // v``; decoded input column ``d`` is an outlier
column when ``d < os``, else column ``(d - os) % gs`` of group ``(d - os) // gs``. The code of (group g, vector j,
column t) is the ``b``-bit field at bit ``t * b`` of row ``(g, j)``'s little-endian int32 word stream; its low
``log2 C`` bits pick the main codebook vector, the rest the residual one. Final column ``c`` holds decoded column
``argsort(perm)[c]``, then ``w * scale[c] + shift[c]``. Every float operation rounds to the codebook dtype.
"""

from __future__ import annotations

import numpy as np


def round_to(x: float, dtype: str) -> float:
    """``x`` rounded to float16 / bfloat16 / float32 (nearest, ties to even)."""
    if dtype == "float16":
        return float(np.float16(x))
    f = np.float32(x)
    if dtype == "float32":
        return float(f)
    u = int(np.array(f).view(np.uint32))
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return float(np.array(u, dtype=np.uint32).view(np.float32))


def field(words: list[int], bit: int, width: int) -> int:
    stream = 0
    for i, w in enumerate(words):
        stream |= (w & 0xFFFFFFFF) << (32 * i)
    return (stream >> bit) & ((1 << width) - 1)


def dequantize(meta: dict, t: dict[str, np.ndarray], packed: np.ndarray) -> np.ndarray:
    """The weight ``[N, K]`` as float64 values of the codebook dtype."""
    k, n, v, gs, os_, dt = meta["K"], meta["N"], meta["v"], meta["gs"], meta["os"], meta["dtype"]
    ib = int(np.log2(meta["C"]))
    rb = int(np.log2(meta["R"])) if meta["R"] > 0 else 0
    cb = t["centroids"].astype(np.float64)
    dec = np.zeros((n, k))
    for row in range(n):
        j, e = divmod(row, v)
        for d in range(k):
            if d < os_:
                vo = meta["vo"]
                jo, eo = divmod(row, vo)
                dec[row, d] = t["ocentroids"][0, int(t["oidx"][0, jo, d]) * vo + eo]
                continue
            g, col = divmod(d - os_, gs)
            code = field([int(w) for w in packed[g, j]], col * (ib + rb), ib + rb)
            val = cb[g, (code & ((1 << ib) - 1)) * v + e]
            if rb:
                val = round_to(val + float(t["rcentroids"][g, (code >> ib) * v + e]), dt)
            dec[row, d] = val
    w = dec
    if meta["perm"]:
        inv = np.argsort(np.asarray(t["perm"]))
        w = dec[:, inv]
    if meta["norm"]:
        out = np.zeros_like(w)
        for row in range(n):
            for c in range(k):
                i = c if meta["norm_dim"] == 0 else row
                out[row, c] = round_to(round_to(w[row, c] * float(t["scale"][i]), dt) + float(t["shift"][i]), dt)
        w = out
    return w
