"""The numerics half of ``gpu_float.py``: every variant of every float kernel against float64 references (every
code of every format, odd shapes, split-K repeatability, the per-token quantizer bit for bit against torch).
"""

from __future__ import annotations

import argparse

import torch

from gpu_float_common import (
    TOL,
    Fn,
    bind,
    fp4_dense,
    fp4_weight,
    fp8_dense,
    fp8_scales,
    fp8_weight,
    rel,
    say,
    sync,
)

# ---- numerics ---------------------------------------------------------------------------------------------------

def check(name: str, fn: Fn, x: torch.Tensor, ref: torch.Tensor, tol: float, lock: torch.Tensor | None = None,
          results: list | None = None) -> bool:
    try:
        y1 = fn(x)
        y2 = fn(x)
        sync()
        err = rel(y1, ref)
        same = torch.equal(y1, y2)
        locked = lock is None or int(lock.abs().sum()) == 0
        ok = err < tol and same and locked and bool(torch.isfinite(y1).all())
        extra = ("" if same else " NONDETERMINISTIC") + ("" if locked else " LOCK-NOT-RESET")
        say(f"| {name} | {err:.2e} | {'pass' if ok else 'FAIL'}{extra} |")
    except Exception as err:  # a compile or launch failure is a failed check, the rest still runs
        ok = False
        say(f"| {name} | - | FAIL {type(err).__name__}: {str(err)[:160]} |")
    if results is not None:
        results.append(ok)
    return ok


def code_checks(dev: torch.device, lock: torch.Tensor, res: list[bool], quick: bool) -> None:
    """Every code of every format through every variant, bit for bit: one-hot activation rows pick single
    weights, so ``y`` must equal the code's value times a power-of-two scale (torch's own FP8 conversion and the
    E2M1 table are the oracle). Catches a decode that flushes subnormals or saturates, which a random
    layer's relative error would hide. Each (format, dtype, variant) is a compile, so the rarer pairs get
    fewer variants (``quick``: bfloat16 only)."""
    from qlinear.kernels.triton import fp4mm, fp8mm
    from qlinear.kernels.triton.fp_common import FConfig

    n, k = 256, 64
    ms = {"gemv": 4, "skinny": 16, "mma": 64, "dense": 64}
    for fmt in (torch.float8_e4m3fn, torch.float8_e5m2):
        codes = torch.arange(256, dtype=torch.uint8, device=dev)
        codes = codes[torch.isfinite(codes.view(fmt).float())]
        w = torch.zeros(n, k, dtype=torch.uint8, device=dev)
        w[:, :4] = codes.repeat(-(-4 * n // codes.numel()))[: 4 * n].reshape(n, 4)
        w = w.view(fmt)
        for dtype in (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16):
            for v, m in ms.items():
                if fmt == torch.float8_e5m2 and v in ("skinny", "dense") and dtype == torch.float16:
                    continue
                x = torch.zeros(m, k, dtype=dtype, device=dev)
                x[torch.arange(m), torch.arange(m) % 4] = 1
                want = (w.view(torch.uint8)[:, torch.arange(m, device=dev) % 4].t().contiguous().view(fmt)
                        .double() * 0.125).to(dtype)
                bit_decode = v != "dense" and fmt == torch.float8_e4m3fn and dtype == torch.bfloat16
                for bits in (False, True) if bit_decode else (False,):
                    cfg = FConfig(**{**fp8mm.fp8_config(v, m, n, k).as_dict(), "fp8_bits": bits})
                    f = "e4m3" if fmt == torch.float8_e4m3fn else "e5m2"
                    name = f"every {f} code, {str(dtype)[6:]}, {cfg.short()}"
                    try:
                        y = fp8mm.fp8_linear(x, w, torch.full((1, 1), 0.125, device=dev), (n, k), config=cfg,
                                             lock=lock)
                        ok = torch.equal(y, want)
                        bad = int((y != want).sum())
                        say(f"| {name} | {bad} differ | {'pass' if ok else 'FAIL'} |")
                    except Exception as err:
                        ok = False
                        say(f"| {name} | - | FAIL {type(err).__name__}: {str(err)[:160]} |")
                    res.append(ok)
    table = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64,
                         device=dev)
    kf = 128
    packed = torch.zeros(n, kf // 2, dtype=torch.uint8, device=dev)
    packed[:, :1] = torch.arange(256, dtype=torch.uint8, device=dev).reshape(n, 1)  # every nibble pair
    for kind in ("nvfp4", "mxfp4"):
        if kind == "nvfp4":
            sc = torch.randint(1, 0x7F, (n, kf // 16), dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
            sv = sc.double()
        else:
            sc = torch.randint(112, 138, (n, kf // 32), dtype=torch.uint8, device=dev)
            sv = torch.exp2(sc.double() - 127)
        for dtype in (torch.bfloat16,) if quick or kind == "mxfp4" else (torch.bfloat16, torch.float16):
            for v, m in ms.items():
                x = torch.zeros(m, kf, dtype=dtype, device=dev)
                x[torch.arange(m), torch.arange(m) % 2] = 1
                col = torch.arange(m, device=dev) % 2
                code = ((packed[:, 0:1].long() >> (4 * col[None, :])) & 15)  # [N, M]
                want = (table[code] * sv[:, 0:1] * 0.5).t().to(dtype)
                cfg = fp4mm.fp4_config(v, m, n, kf)
                name = f"every e2m1 pair, {kind} scales, {str(dtype)[6:]}, {cfg.short()}"
                try:
                    y = fp4mm.fp4_linear(x, packed, sc, kind, 0.5, config=cfg, lock=lock)
                    ok = torch.equal(y, want)
                    say(f"| {name} | {int((y != want).sum())} differ | {'pass' if ok else 'FAIL'} |")
                except Exception as err:
                    ok = False
                    say(f"| {name} | - | FAIL {type(err).__name__}: {str(err)[:160]} |")
                res.append(ok)


def run_checks(args: argparse.Namespace, dev: torch.device) -> bool:
    from qlinear.kernels.triton import fp4mm, fp8_w8a8, fp8mm
    from qlinear.kernels.triton.fp_common import FConfig

    gen = torch.Generator(device=dev).manual_seed(1)
    lock = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
    res: list[bool] = []
    say("| check | rel err | result |\n| --- | --- | --- |")
    shapes = args.check_shapes
    first = {"gemv": (1, 3), "skinny": (5, 16), "mma": (100, 333), "dense": (1030,)}
    odd = {"gemv": (3,), "skinny": (5,), "mma": (100,), "dense": (1030,)}
    if args.interpret:
        first = odd = {"gemv": (1, 3), "skinny": (5,), "mma": (40,), "dense": (20,)}
    code_checks(dev, lock, res, args.quick)
    for k, n in shapes:
        ms = first if (k, n) == shapes[0] else odd
        for gran in ("channel", "block"):
            blk = (1, k) if gran == "channel" else (128, 128)
            for fmt, dtype in ((torch.float8_e4m3fn, torch.bfloat16), (torch.float8_e5m2, torch.float16)):
                if fmt == torch.float8_e5m2 and (gran == "block" or (k, n) != shapes[0]):
                    continue
                w = fp8_weight(n, k, fmt, gen, dev)
                s = fp8_scales(n, k, blk, gen, dev, fmt)
                wd = fp8_dense(w, s, blk)
                for v, mlist in ms.items():
                    for m in mlist:
                        x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
                        cfg = fp8mm.fp8_config(v, m, n, k, bk=blk[1])
                        f = "e4m3" if fmt == torch.float8_e4m3fn else "e5m2"
                        check(f"fp8 {f} {str(dtype)[6:]} {gran} {k}x{n} M={m} {cfg.short()}",
                              bind(fp8mm.fp8_linear, w, s, blk, config=cfg, lock=lock), x,
                              x.double() @ wd.t(), TOL[dtype], lock, res)
                if gran == "block" and (k, n) == shapes[0]:  # bit decode and TMA, once each
                    x = torch.randn(16, k, device=dev, generator=gen).to(dtype)
                    for cfg in (FConfig(**{**fp8mm.fp8_config("gemv", 1, n, k).as_dict(), "fp8_bits": True}),
                                FConfig(**{**fp8mm.fp8_config("mma", 16, n, k).as_dict(), "fp8_bits": True}),
                                FConfig(**{**fp8mm.fp8_config("skinny", 16, n, k).as_dict(), "tma": True}),
                                FConfig(**{**fp8mm.fp8_config("mma", 16, n, k).as_dict(), "tma": True})):
                        xm = x[:1] if cfg.variant == "gemv" else x
                        check(f"fp8 e4m3 bf16 block {k}x{n} M={xm.shape[0]} {cfg.short()}",
                              bind(fp8mm.fp8_linear, w, s, blk, config=cfg, lock=lock), xm,
                              xm.double() @ wd.t(), TOL[dtype], lock, res)
        # W8A8: the reference multiplies OUR quantized activations (checked bit-exactly below) in float64
        for gran in ("tensor", "channel", "block"):
            blk = {"tensor": (n, k), "channel": (1, k), "block": (128, 128)}[gran]
            if gran == "block" and k % 32:
                continue
            w = fp8_weight(n, k, torch.float8_e4m3fn, gen, dev)
            s = fp8_scales(n, k, blk, gen, dev)
            wd = fp8_dense(w, s, blk)
            wms = ((1, 16, 100, 1030) if (k, n) == shapes[0] else (5, 100)) if not args.interpret else (1, 5, 40)
            for m in wms:
                x = torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16)
                xq, sx = fp8_w8a8.quantize_fp8_per_token(x)
                ref = (xq.double() * sx.double()[:, None]) @ wd.t()
                cfgs = [fp8_w8a8.w8a8_config(fp8_w8a8.choose_w8a8_variant(m, n, k), m, n, k, bk=blk[1])]
                if gran == "channel" and (k, n) == shapes[0] and k % 16 == 0:
                    cfgs.append(FConfig(**{**cfgs[0].as_dict(), "tma": True}))
                for cfg in cfgs:
                    check(f"w8a8 bf16 {gran} {k}x{n} M={m} {cfg.short()}",
                          bind(fp8_w8a8.fp8_w8a8_linear, w, s, blk, config=cfg, lock=lock), x, ref,
                          TOL[torch.bfloat16], lock, res)
        for kind in ("nvfp4", "mxfp4"):
            if k % 32:
                continue
            packed, sc, gmul = fp4_weight(n, k, kind, gen, dev)
            wd = fp4_dense(packed, sc, kind, gmul)
            for dtype in (torch.bfloat16, torch.float16):
                if dtype == torch.float16 and (kind == "mxfp4" or (k, n) != shapes[0]):
                    continue
                for v, mlist in ms.items():
                    for m in mlist:
                        x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
                        cfg = fp4mm.fp4_config(v, m, n, k)
                        check(f"{kind} {str(dtype)[6:]} {k}x{n} M={m} {cfg.short()}",
                              bind(fp4mm.fp4_linear, packed, sc, kind, gmul, config=cfg, lock=lock), x,
                              x.double() @ wd.t(), TOL[dtype], lock, res)
    # the per-token quantizer, bit for bit against torch (one-pass and two-pass rows; a zero row)
    for k in (4096, 14336) if not args.interpret else (200, 8200):
        x = torch.randn(7, k, device=dev, generator=gen).to(torch.bfloat16) * 3
        x[2] = 0
        xq, sx = fp8_w8a8.quantize_fp8_per_token(x)
        # a tensor divisor: torch divides by a Python scalar as a multiplication by its reciprocal (1 ulp off IEEE
        # division in some rows, seen on the H200), the kernel (and vLLM's quantizer) divides
        s_ref = torch.clamp(x.float().abs().amax(1) / torch.full((), 448.0, device=x.device), min=1.0 / (448 * 512))
        q_ref = (x.float() / s_ref[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        ok = torch.equal(sx, s_ref) and torch.equal(xq.view(torch.uint8), q_ref.view(torch.uint8))
        res.append(ok)
        say(f"| quantize_fp8_per_token K={k} vs torch (bitwise) | - | {'pass' if ok else 'FAIL'} |")
    failed = res.count(False)
    say(f"\n{len(res)} checks, {failed} failed\n")
    return failed == 0


