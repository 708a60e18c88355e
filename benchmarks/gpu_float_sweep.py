"""The ``--sweep`` half of ``gpu_float.py``: a handful of tile configs per variant near each M's crossover, timed
side by side, the best printed as a pasteable ``FConfig``.
"""

from __future__ import annotations

import argparse

import torch

from gpu_float_common import bind, const, fp4_weight, fp8_scales, fp8_weight, point, say, timer

# ---- sweep --------------------------------------------------------------------------------------------------------

def candidates(family: str, variant: str, m: int, n: int, k: int, bk: int) -> list:
    """A handful of tile configs around the heuristic one (each is a compile: keep it short). GEMV tiles keep the
    float32 accumulators (one ``[BN, BK]`` tile a row; FP4: ``[BN, BK/8]`` plus eight decoded tiles) within
    about 64 registers a thread (offline SASS: more spills); ``STEP`` scales (``bk < K``) skip the
    ``mma`` tiles that spill with their second accumulator."""
    from qlinear.kernels.triton import fp4mm, fp8_w8a8, fp8mm
    from qlinear.kernels.triton.fp_common import FConfig, split_for

    if family == "fp8":
        base = fp8mm.fp8_config(variant, m, n, k, bk=bk)
    elif family == "w8a8":
        base = fp8_w8a8.w8a8_config(variant, m, n, k, bk=bk)
    else:
        base = fp4mm.fp4_config(variant, m, n, k)
    out = [base]
    bm = base.block_m

    def cfg(bn: int, bkk: int, warps: int, stages: int, bmm: int | None = None, **kw) -> FConfig:
        b = bmm or bm
        tiles = -(-n // bn) * -(-m // b)
        split = split_for(tiles, k, bkk, 132, 8 if variant == "gemv" else 3) if variant != "mma" or m <= 64 else 1
        return FConfig(variant, b, bn, bkk, split, warps, stages, **kw)

    if variant == "gemv":
        fp4 = family in ("nvfp4", "mxfp4")
        for bn, bkk, w in ((32, 512, 8), (16, 512, 4), (32, 256, 4), (64, 256, 8), (16, 256, 4), (8, 512, 4),
                           (16, 128, 4), (32, 128, 8), (8, 256, 4), (32, 1024, 8), (16, 1024, 4)):
            live = (bm + 8) * bn * bkk // 8 if fp4 else bm * bn * bkk
            if live // (32 * w) <= (128 if fp4 else 64):
                out.append(cfg(bn, bkk, w, 3))
        out += [FConfig(**{**base.as_dict(), "split_k": max(1, int(base.split_k * f))}) for f in (0.5, 2)]
    elif variant == "skinny":
        bkk = 256 if family == "w8a8" else 128
        for bn, b, w, st in ((64, bkk, 4, 4), (64, 2 * bkk, 4, 3), (128, bkk, 4, 3), (128, bkk, 8, 3), (64, bkk, 4, 2),
                             (64, bkk, 4, 1)):
            out.append(cfg(bn, b, w, st))
        out += [FConfig(**{**base.as_dict(), "split_k": max(1, int(base.split_k * f))}) for f in (0.5, 2)]
        if family in ("fp8", "w8a8") and k % 16 == 0:
            out.append(FConfig(**{**base.as_dict(), "tma": True}))
    elif variant == "mma":
        bkk = 128 if family == "w8a8" else 64
        step = family in ("fp8", "w8a8") and bk < k
        tiles = ((16, 64, 2 * bkk, 4, 3), (16, 128, bkk, 4, 3), (32, 64, 2 * bkk, 4, 3)) if m <= 32 else ()
        tiles += ((64, 128, bkk, 4, 4), (128, 128, bkk, 8, 4), (128, 256, bkk, 8, 3), (128, 128, 2 * bkk, 8, 3),
                  (64, 256, bkk, 8, 3), (256, 128, bkk, 8, 3))
        for bmm, bn, b, w, st in tiles:
            if not (step and bmm * bn > 128 * 128):
                out.append(cfg(bn, b, w, st, bmm))
        if family in ("fp8", "w8a8") and k % 16 == 0:
            out += [FConfig(**{**c.as_dict(), "tma": True}) for c in out[:3]]
    elif variant == "dense":
        out += [FConfig("dense", 1, bn, b, 1, w, 1) for bn, b, w in ((32, 256, 4), (128, 64, 4), (64, 256, 8))]
    return list(dict.fromkeys(out))


def near(m: int) -> tuple[str, ...]:
    """The variants worth sweeping at M: the heuristic one and its neighbour across the crossover."""
    if m <= 4:
        return ("gemv", "skinny")
    if m <= 64:
        return ("skinny", "mma")
    return ("mma", "dense") if m >= 256 else ("mma",)


def sweep(args: argparse.Namespace, dev: torch.device) -> None:
    from qlinear.kernels.triton import fp4mm, fp8_w8a8, fp8mm

    timed, copies = timer(args)
    gen = torch.Generator(device=dev).manual_seed(3)
    dtype = torch.bfloat16
    for k, n in args.shapes:
        blk = (1, k) if args.granularity == "channel" else (128, 128)
        w = fp8_weight(n, k, torch.float8_e4m3fn, gen, dev)
        s = fp8_scales(n, k, blk, gen, dev)
        ws = [(w.clone(), s.clone()) for _ in range(copies(n * k))]
        fp4 = {kind: [fp4_weight(n, k, kind, gen, dev) for _ in range(copies(n * k // 2))]
               for kind in ("nvfp4", "mxfp4") if kind in args.families}
        lock = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
        for m in args.ms:
            x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
            xq, sx = fp8_w8a8.quantize_fp8_per_token(x)
            for family in args.families:
                variants = {"fp8": fp8mm.VARIANTS, "w8a8": fp8_w8a8.VARIANTS}.get(family, fp4mm.VARIANTS)
                for variant in args.variants or near(m):
                    if variant not in variants:
                        continue
                    found = []
                    for c in candidates(family, variant, m, n, k, blk[1]):
                        if family == "fp8":
                            fns = [bind(fp8mm.fp8_linear, a, b, blk, config=c, lock=lock) for a, b in ws]
                        elif family == "w8a8":
                            fns = [const(fp8_w8a8.fp8_w8a8_mm, xq, sx, a, b, blk, None, dtype, config=c, lock=lock)
                                   for a, b in ws]
                        else:
                            fns = [bind(fp4mm.fp4_linear, p, sc, family, g, config=c, lock=lock)
                                   for p, sc, g in fp4[family]]
                        us = point(timed, fns, x, max(5, args.reps // 2))
                        if us is not None:
                            found.append((us, c))
                    found.sort(key=lambda t: t[0])
                    say(f"\n{family} {variant} {k}x{n} M={m}: " + "; ".join(f"{c.short()} {us:.1f}"
                                                                            for us, c in found))
                    if found:
                        say(f"  best: {found[0][1]!r} ({found[0][0]:.1f} us)")


