"""Launch configurations: a shipped table of measured entries, else a heuristic; never a run-time autotune.

A config is chosen per call from the flattened row count M. Variants, each with its own limits:

* ``gemv_tc`` 2/4-bit, M <= 16, sm_80+: the decode GEMV on ``mma.sync`` tensor cores (weights as A, up to 8
  activation rows as B, ``qmv_tc.py``); ``block_n = 32 x`` warps along N, the other warps split K inside the
  CTA, ``block_k`` codes per step, ``block_m`` 16 shares each dequantized chunk between two 8-row sets;
  ``sub_zero`` subtracts the zero per code pair, ``stage_x`` deals x to the lanes through shared memory,
  ``sum_values`` bounds the split-K tail's loads in flight (its registers are the kernel's peak).
* ``gemv``   split-K, multiply-reduce on CUDA cores, 1, 2 or 4 rows per program (``block_m``; rows share
  each dequantized weight): memory bound, decode.
* ``skinny`` split-K, ``tl.dot`` with a 16-row tile (M <= 16..64).
* ``gemm``   tiled dequant-in-the-loop ``tl.dot`` (M up to ~512), split-K only when tiles are few.
* ``skinny2``/``gemm2`` the same two roles in ``qmm2_kernel``: A contiguous (x in sorted order), B words
  broadcast to every field and shifted per K row (no gather, no stack/join of fields).
* ``skinny3`` 4-bit, M <= 16: codes dequantized two per instruction (packed bf16x2/f16x2 PTX) into the A
  operand of a swap-AB wgmma (``qmm3.py``).
* ``gemm3``  the same kernel tiled over M (up to 256 rows a tile): 4-bit mid-M, ahead of ``gemm2`` where it
  can run (4-bit, field blocks of 2+ word rows, no additive offsets).
* ``gemm4``  gemm3's product in Gluon (``qmm4.py``), sm_90 only: the next step's dequantization overlaps this
  step's wgmma (two A register sets, explicit waits), activations by TMA. Serves 4-bit M = 9..2048 ahead of
  ``skinny2``/``gemm3``/``gemm2``/``dense``, which take the calls it cannot run.
* ``gemm5``  gemm4 with a loader warp (``qmm5.py``, Gluon warp specialisation): x, codes and group rows arrive
  by TMA into shared-memory slots, the consumer warpgroups only dequantize and issue wgmma. Same limits.
  ``tail_split``: a last wave of tiles that would leave most SMs idle runs as a second launch, split along K.
* ``dense``  dequantize into a transient dense weight and call cuBLAS (large M).

The table (``tuned_<device>.json``) is keyed by device name, then ``variant:m=<bucket>:n=:k=:b=:g=``;
``crossovers`` maps bits to the largest M bucket each variant serves. Missing entries use ``heuristic``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, replace
from importlib import resources
from typing import Any

VARIANTS = ("gemv_tc", "gemv", "skinny3", "skinny", "gemm5", "gemm4", "skinny2", "gemm", "gemm3", "gemm2", "dense")
#: group length the kernels use for "one group spans K" (any block is inside group 0)
CHANNELWISE = 1 << 30
#: default crossovers (largest M bucket served), used when the table has none for a device/bits
DEFAULT_CROSSOVERS = {"gemv_tc": 8, "gemv": 1, "gemm5": 4096, "gemm4": 2048, "skinny2": 16, "gemm3": 256, "gemm2": 256}
#: Shared memory a pipelined tile config may take by the A+B estimate (bytes). The compiler takes up
#: to ~1.45x the estimate (layout buffers), so this keeps under sm_90's 227 KiB opt-in limit; a
#: 2-bit config asked 258048 B on the H200 before this clamp.
SMEM_BUDGET = 150 * 1024
TABLES = ("tuned_h200.json", "tuned_h100.json")


@dataclass(frozen=True)
class Config:
    """One launch: tile sizes (``block_k`` counts codes along K), split-K factor, warps and pipeline depth."""

    variant: str
    block_m: int = 16
    block_n: int = 128
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    prefetch: bool = False  # gemv: load the next K step's words before computing this one
    max_registers: int = 0  # > 0: cap registers per thread (ptxas .maxnreg) for more resident warps
    sub_zero: bool = False  # gemv_tc: one FMA per code pair makes q - z (no third MMA summing x)
    stage_x: bool = False  # gemv_tc: x loaded coalesced and dealt to the lanes through shared memory
    sum_values: int = 4  # gemv_tc: partial sums per thread per split the split-K epilogue holds at once
    vector_params: bool = False  # gemv_tc: a group's parameters loaded once per lane (4 columns) for both tiles
    tail_split: int = 1  # gemm5: a last grid wave this sparse runs as a second launch, split this many ways along K

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def m_bucket(m: int) -> int:
    """Next power of two >= m (1..8192): rows of the flattened input grouped for the table."""
    return min(8192, 1 << max(0, (max(1, m) - 1).bit_length()))


def table_key(variant: str, m: int, n: int, k: int, bits: int, group: int) -> str:
    g = -1 if group >= CHANNELWISE else group
    return f"{variant}:m={m_bucket(m)}:n={n}:k={k}:b={bits}:g={g}"


@functools.cache
def _shipped() -> tuple[dict[str, Any], dict[str, str]]:
    """Every shipped table merged by device name, and the aliases (a device that uses another's table, with
    the measurement that justified it). Read once: shipped data, not a runtime fact."""
    merged: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    for name in TABLES:
        try:
            text = resources.files(__package__).joinpath(name).read_text()
        except (FileNotFoundError, ModuleNotFoundError):
            continue
        data = json.loads(text)
        for dev, entry in data.get("devices", {}).items():
            merged.setdefault(dev, {"crossovers": {}, "configs": {}})
            merged[dev]["crossovers"].update(entry.get("crossovers", {}))
            merged[dev]["configs"].update(entry.get("configs", {}))
        aliases.update({dev: alias["table"] for dev, alias in data.get("aliases", {}).items()})
    return merged, aliases


#: benchmark A/B runs: device name -> the table it uses instead of its own or its shipped alias ("" = none)
_borrowed: dict[str, str] = {}


def borrow_table(device: str, table_device: str | None) -> None:
    """Make ``device`` use ``table_device``'s table ("" for no table: the heuristic and default crossovers;
    None to undo). For side-by-side measurements of whether a table carries over to another GPU."""
    if table_device is None:
        _borrowed.pop(device, None)
    else:
        _borrowed[device] = table_device


def table_device(device: str) -> str:
    """The device whose table ``device`` uses: itself, or its shipped alias (same die and SM count, measured)."""
    if device in _borrowed:
        return _borrowed[device]
    return _shipped()[1].get(device, device)


def device_table(device: str) -> dict[str, Any]:
    """``{"crossovers": ..., "configs": ...}`` for ``device`` (empty when no table applies): the aliased
    table's entries with the device's own measured entries, where it has any, over them."""
    return _layered(device, table_device(device))


@functools.cache
def _layered(device: str, source: str) -> dict[str, Any]:
    tables = _shipped()[0]
    if not source:
        return {}
    base, own = tables.get(source, {}), tables.get(device, {}) if source != device else {}
    if not own:
        return base
    return {part: {**base.get(part, {}), **own.get(part, {})} for part in ("crossovers", "configs")}


def pick_variant(device: str, m: int, bits: int, exclude: tuple[str, ...] = ()) -> str:
    """The variant for M rows: the device table's crossovers for these bits, else the defaults; the first
    variant (in ``VARIANTS`` order) whose crossover covers M's bucket, skipping ``exclude`` (variants this
    call cannot run)."""
    cross = device_table(device).get("crossovers", {})
    limits = cross.get(str(bits)) or cross.get("default") or DEFAULT_CROSSOVERS
    b = m_bucket(m)
    for v in VARIANTS[:-1]:
        if v in limits and b <= int(limits[v]) and v not in exclude:
            return v
    return "dense"


def measured_variant(device: str, m: int, n: int, k: int, bits: int, group: int,
                     exclude: tuple[str, ...] = ()) -> str | None:
    """The fastest variant timed side by side for exactly this call's key (M bucket, N, K, bits, group): the
    sweeps write each entry's median ``us`` beside its config, and a table gives times for a key only from one
    run. None unless two or more variants (not in ``exclude``) were timed; then the crossovers decide."""
    table = device_table(device).get("configs", {})
    timed = {}
    for v in VARIANTS:
        entry = table.get(table_key(v, m, n, k, bits, group))
        if v not in exclude and entry and "us" in entry:
            timed[v] = float(entry["us"])
    return min(timed, key=timed.__getitem__) if len(timed) >= 2 else None


def _split(tiles: int, nkb: int, sms: int, waves: int, min_blocks: int) -> int:
    """Split K so that about ``waves`` CTAs per SM exist, each keeping at least ``min_blocks`` K blocks."""
    if tiles >= sms * waves // 2:
        return 1
    want = -(-sms * waves // tiles)
    return max(1, min(want, nkb // min_blocks))


def heuristic(variant: str, sms: int, m: int, n: int, k: int, bits: int, group: int) -> Config:
    """A sane config for an H100/H200-class GPU (memory bound below M~64, tensor-core bound above)."""
    pf = 32 // bits
    block_n = 128 if n >= 1024 else max(32, min(128, 1 << (n - 1).bit_length()))
    if variant == "gemv":  # BLOCK_N = 128 * num_warps (the body's layout contract); a step in one group
        # Measured on the H200 (benchmarks/gemv_sweep.py, results/h200-gemv_sweep-2026-12-02.md): 2 warps and
        # about 12 CTAs per SM (many loads in flight, at most 32 splits) won on 3 of 4 shapes; 64-code steps
        # for 8-bit words.
        warps = 2 if n >= 256 else 1
        bk = max(64, 8 * pf)
        while bk > pf and group % bk:
            bk //= 2
        nkb = -(-k // bk)
        split = min(32, _split(-(-n // (128 * warps)), nkb, sms, 12, 2))
        return Config("gemv", min(4, m_bucket(m)), 128 * warps, bk, split, warps, 2)
    if variant == "gemv_tc":  # 4 warps side by side (128 columns), 4 field blocks a step, ~28 warps per SM
        # (the H200 sweep's winners: results/h200-gemv_tc-2026-12-02-second.md); at most 32 splits; the zero
        # subtracted per pair, and above 4 rows x staged through shared memory (results/...-2026-12-03-fifth.md).
        # Above 8 rows one program takes both row sets: 4-bit with one field block a step under a 72-register
        # cap, 2-bit 2 warps x 2 blocks (results/h200-gemv_tc_table-2026-12-03-caps.md)
        # Chunks a step stay inside one group (steps of whole groups measured slower at g128: 14.9 vs 13.5 us,
        # 12.2 vs 11.2 2-bit; results/h200-gemv_tc_table-2026-12-03-units.md), except groups of 32 codes: two
        # groups a step (GGUF's float32 affine runtime 20.8-21.0 us there, 21.4 with one: -striped-kquant.md).
        r = 8
        while r > 1 and group % (r * pf):
            r //= 2
        ck = r * pf
        warps, unit, regs = (4, 4, 0) if m <= 8 else ((4, 1, 72) if bits == 4 else (2, 2, 0))
        unit = min(unit, group // ck) if group >= 2 * ck else (2 if group <= 32 else 1)
        tiles = -(-n // (32 * warps))
        units = max(1, k // (unit * ck))
        want = max(1, -(-sms * 28 // (tiles * warps)))
        split = min(32, units, 1 << (want.bit_length() - 1))
        return Config("gemv_tc", 16 if m > 8 else 8, 32 * warps, unit * ck, split, warps, 1, max_registers=regs,
                      sub_zero=True, stage_x=m > 4)
    if variant == "skinny":  # 64 columns x 4 warps: the dequantized tile feeds mma straight from registers
        bn = 64 if n >= 64 else 32
        nkb = -(-k // 128)
        split = _split(-(-n // bn), nkb, sms, 4, 2)
        return Config("skinny", 16, bn, 128, split, 4, 3)
    if variant == "gemm":
        bm = 64 if m <= 64 else 128
        bk = 64 if bits >= 4 else 128
        tiles = -(-m // bm) * -(-n // block_n)
        split = _split(tiles, -(-k // bk), sms, 1, 4)  # partials cost M*N*8 bytes a split: only when few tiles
        return Config("gemm", bm, block_n, bk, split, 4 if bm == 64 else 8, 4)
    # skinny2/gemm2: tiles where each thread holds its word rows whole (4 columns x 1-2 rows): the offline
    # SASS (triton 3.6 and 3.9, sm_90) then stores the dequantized B tile with 8-byte STS and no PRMT;
    # 16x128 w4 and 64x128 w4 make 4x the shared stores (135/72 STS, 64/32 PRMT)
    if variant == "skinny2":  # 16-row mma tiles; split K to about 4 CTAs per SM (memory bound: fill HBM)
        bn = 64 if n >= 64 else 32
        bk = 128 if bits >= 4 else 256
        split = _split(-(-n // bn), -(-k // bk), sms, 4, 2)
        return Config("skinny2", 16, bn, bk, split, 4, 4)
    if variant == "skinny3":  # swap-AB wgmma: 128 output channels x 16 rows per CTA, 4 warps (qmm3.py)
        bk = 128
        split = min(32, _split(-(-n // 128), -(-k // bk), sms, 4, 2))
        return Config("skinny3", 16, 128, bk, split, 4, 3)
    if variant == "gemm3":  # skinny3's swap-AB wgmma over M tiles, 128 channels x 2 warpgroups; split K to
        # about one CTA per SM (the H200 sweep's winners, results/h200-gemm3_sweep-2026-12-03.md)
        bm = 64 if m <= 64 else 128
        bk = 128 if bm == 64 else 64
        tiles = -(-m // bm) * -(-n // 128)
        split = _split(tiles, -(-k // bk), sms, 1, 4)
        return Config("gemm3", bm, 128, bk, split, 8, 3 if bm == 64 else 4)
    if variant == "gemm4":  # the H200 sweep's winners (results/h200-gemm4_sweep-2026-12-03.md): one warpgroup of
        # 128 channels x M rows up to 32 (about 2 CTAs per SM), 64 x 64 up to 64, then 128 x 128 x 2 warpgroups,
        # 256 x 128 above; split K to fill the SMs
        b = m_bucket(m)
        bm, bn, bk, warps, waves = ((max(16, b), 128, 128, 4, 2) if b <= 32 else (64, 64, 128, 4, 2) if b <= 64
                                    else (128, 128, 128, 8, 1) if b <= 128 else (256, 128, 64, 8, 1))
        tiles = -(-m // bm) * -(-n // bn)
        split = min(16, _split(tiles, -(-k // bk), sms, waves, 2 if waves == 2 else 4))
        return Config("gemm4", bm, bn, bk, split, warps, 4)
    if variant == "gemm5":  # the H200 sweep's winners (results/h200-gemm5_sweep-2026-12-03.md): one consumer
        # warpgroup under a 128-register launch cap (two CTAs per SM) up to M = 64 and on narrow N, two
        # warpgroups of 128 channels above (128 x 128 x 64 at M = 128, 256-row tiles from 256); split K to fill
        b = m_bucket(m)
        wide = n >= 8192
        bm, bn, bk, warps, stages, regs = (
            (max(16, b), 128, 128, 4, 4, 128) if b <= 32 else (64, 64, 128, 4, 4, 128) if b <= 64
            else (128, 128, 64, 8, 6, 0) if b <= 128 and wide else (256, 128, 64, 8, 4, 0) if b > 256 or wide
            else (128, 64, 128, 4, 4, 128))
        tiles = -(-m // bm) * -(-n // bn)
        split = min(16, _split(tiles, -(-k // bk), sms, 2 if regs else 1, 4))
        # a sparse last wave split two ways in a second launch (1.01x-1.08x where it applied:
        # results/h200-wave-tail-2026-12-03.md); the launcher takes it only when those CTAs fit one wave
        return Config("gemm5", bm, bn, bk, split, warps, stages, max_registers=regs, tail_split=2 if b > 256 else 1)
    if variant == "gemm2":  # wgmma tiles (64 rows per warpgroup), 8 warps
        bm = 64 if m <= 64 else 128
        bn = 128 if n >= 128 else max(32, 1 << (n - 1).bit_length())
        bk = 64 if bits >= 4 else 128
        tiles = -(-m // bm) * -(-n // bn)
        split = _split(tiles, -(-k // bk), sms, 1, 8)
        return Config("gemm2", bm, bn, bk, split, 8, 4 if bm == 64 else 3)
    if variant == "dense":
        return Config("dense", 1, 128, 16 * pf, 1, 4, 1)
    raise ValueError(f"variant: expected one of {', '.join(VARIANTS)}, got {variant!r}")


def choose(device: str, sms: int, m: int, n: int, k: int, bits: int, group: int,
           variant: str | None = None, exclude: tuple[str, ...] = ()) -> Config:
    """The table's entry for this call (its M bucket, else the nearest measured bucket of the same
    variant and shape), else ``heuristic``. The variant: ``variant`` if given, else the fastest one timed for
    this exact key, else the crossovers by M; ``exclude`` skips variants this call cannot run."""
    variant = variant or measured_variant(device, m, n, k, bits, group, exclude) or pick_variant(device, m, bits,
                                                                                                  exclude)
    table = device_table(device).get("configs", {})
    entry = table.get(table_key(variant, m, n, k, bits, group))
    exact = entry is not None
    if not entry:
        rest = table_key(variant, m, n, k, bits, group).split(":", 2)[2]
        near = [(abs(int(key.split(":")[1][2:]).bit_length() - m_bucket(m).bit_length()), key)
                for key in table if key.startswith(variant + ":") and key.split(":", 2)[2] == rest]
        entry = table[min(near)[1]] if near else None
    if entry:
        fields = {f: entry[f] for f in Config.__dataclass_fields__ if f in entry and f != "variant"}
        if variant == "gemv" and not exact:  # another bucket's entry: rows per program follow this M
            fields["block_m"] = min(4, m_bucket(m))
        if variant == "gemv_tc" and not exact:
            fields["block_m"] = 16 if m > 8 else 8
        if variant in ("gemm4", "gemm5") and not exact and entry["block_m"] != heuristic(variant, sms, m, n, k, bits,
                                                                                group).block_m:
            return heuristic(variant, sms, m, n, k, bits, group)  # another bucket's M tile: re-tiles the weight
        return Config(variant, **fields)
    return heuristic(variant, sms, m, n, k, bits, group)


def legal(cfg: Config, m: int, k: int, bits: int) -> Config:
    """Clamp a config to what the kernels accept for this call (powers of two, dot minimums, split range)."""
    pf = 32 // bits
    dot = ("skinny", "gemm", "skinny2", "gemm2", "skinny3", "gemm3", "gemm4", "gemm5")
    bk = max(cfg.block_k, pf, 16 * (cfg.variant in dot))
    if cfg.variant == "gemv_tc":  # warps: block_n / 32 along N, the rest along K (qmv_tc.py)
        wn = max(1, min(cfg.num_warps, cfg.block_n // 32))
        return replace(cfg, block_m=16 if m > 8 and cfg.block_m > 8 else 8, block_n=32 * wn, num_stages=1,
                       split_k=max(1, min(cfg.split_k, -(-k // max(pf, cfg.block_k)))))
    bm = min(4, max(1, cfg.block_m), m_bucket(m)) if cfg.variant == "gemv" else max(16, cfg.block_m)
    if cfg.variant == "gemv":  # the layout contract of the GEMV body
        cfg = replace(cfg, block_n=128 * cfg.num_warps)
    stages = cfg.num_stages
    if cfg.variant != "gemv":  # keep the pipeline's A and B tiles inside Hopper's 227 KiB of shared memory
        # gemm4's weight tile never enters shared memory; gemm5's takes bits / 8 bytes a code, not two
        bn = {"gemm4": 0, "gemm5": cfg.block_n * bits // 16}.get(cfg.variant, cfg.block_n)
        while stages > 2 and stages * (bm * bk + bk * bn) * 2 > SMEM_BUDGET:
            stages -= 1
        while bk > max(16, pf) and stages * (bm * bk + bk * bn) * 2 > SMEM_BUDGET:
            bk //= 2
    words = -(-k // pf)
    nkb = -(-words // (bk // pf))
    return replace(cfg, block_m=bm, block_k=bk, num_stages=stages, split_k=max(1, min(cfg.split_k, nkb)))
