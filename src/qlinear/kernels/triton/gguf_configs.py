"""Launch configurations of the GGUF Triton kernels: a heuristic per variant, never a run-time autotune.

Variants by the flattened row count M (``CROSSOVERS`` holds the largest M each serves):

* ``gemv``   one row per program, split-K, CUDA cores: memory bound, for decode-sized M.
* ``skinny`` ``tl.dot`` with a 16-row activation tile, split-K: the decode is done once for all rows.
* ``gemm``   ``tl.dot`` with 64/128-row tiles.
* ``dense``  dequantize into a transient weight in the activation dtype and call torch's matmul (cuBLAS).

Plain Python: importing this module imports no triton.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

VARIANTS = ("gemv", "skinny", "gemm", "dense")
#: largest M served by each variant (above ``gemm``: dense); benchmarks/gguf_linear.py measures them
#: Measured on the H200 (benchmarks/results/h200-gguf_*-2026-12-02.md): gemm beats the dense path up to
#: M=256, above it decoding with torch + cuBLAS wins.
CROSSOVERS = {"gemv": 2, "skinny": 16, "gemm": 256}


@dataclass(frozen=True)
class GConfig:
    """One launch: output rows per program (``block_n``), activation rows (``block_m``), blocks per step
    (``bps``, 0: the type's default), split-K factor, warps, pipeline depth, and for ``gemv`` the tile
    arrangement (``jt``: -1 by type, 0 one 16-byte vector a thread, 1 halfwords in-thread)."""

    variant: str
    block_m: int = 1
    block_n: int = 64
    bps: int = 0
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    jt: int = -1


def pick_variant(m: int) -> str:
    for v in ("gemv", "skinny", "gemm"):
        if m <= CROSSOVERS[v]:
            return v
    return "dense"


def _split(tiles: int, steps: int, sms: int, waves: int, min_steps: int) -> int:
    """Split K so that about ``waves`` programs per SM exist, each keeping at least ``min_steps`` steps."""
    if tiles >= sms * waves // 2:
        return 1
    want = -(-sms * waves // tiles)
    return max(1, min(want, steps // min_steps))


def heuristic(variant: str, sms: int, m: int, n: int, nb: int, bps: int) -> GConfig:
    """A sane config for an H100/H200-class GPU; ``nb`` blocks per row, ``bps`` the type's blocks per step."""
    steps = -(-nb // bps)
    if variant == "gemv":
        bn = 64 if n >= 2048 else 32
        return GConfig("gemv", 1, bn, bps, _split(m * -(-n // bn), steps, sms, 6, 2), 4, 1)
    if variant == "skinny":
        bn = 64 if n >= 1024 else 32
        return GConfig("skinny", 16, bn, bps, _split(-(-m // 16) * -(-n // bn), steps, sms, 4, 2), 4, 2)
    if variant == "gemm":  # 128x64 / 64x128 tiles: 128x128 needs 255 registers and spills for Q6_K (sm_90a)
        bm = 64 if m <= 64 else 128
        bn = 128 if bm == 64 else 64
        tiles = -(-m // bm) * -(-n // bn)
        return GConfig("gemm", bm, bn, bps, _split(tiles, steps, sms, 2, 4), 8, 2)
    if variant == "dense":
        return GConfig("dense", 1, 32, bps)
    raise ValueError(f"variant: expected one of {', '.join(VARIANTS)}, got {variant!r}")


def choose(sms: int, m: int, n: int, nb: int, bps: int, variant: str | None = None) -> GConfig:
    return heuristic(variant or pick_variant(m), sms, m, n, nb, bps)


def legal(cfg: GConfig, m: int, nb: int, bps: int) -> GConfig:
    """Clamp a config to what the kernels accept (``tl.dot`` needs 16 rows, split within the steps)."""
    b = cfg.bps or bps
    bm = 1 if cfg.variant == "gemv" else max(16, cfg.block_m)
    steps = -(-nb // b)
    return replace(cfg, block_m=bm, bps=b, split_k=max(1, min(cfg.split_k, steps)))
