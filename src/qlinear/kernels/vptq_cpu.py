"""``VPTQCpuLinear``: VPTQ layers on CPU through qlinear's native extra (``qlinear_native._vq``), for decode sizes.

``VPTQLinear`` decodes every weight in every forward, one rounding per operation in the codebook dtype as the
producers do (408 ms for a 2-bit 4096x14336 layer at M=1 on one thread, 39x dense bf16: ``docs/performance.md``).
Here, for up to ``MV_MAX_M`` rows (16 for codebooks past ``TABLE_BYTES``), ``vq_mv`` (the native extra's ``vq.c`` and
``vq_wide.c``) walks the packed codes once and adds each code's codebook vector (and residual vector) times the
activation into float32 sums held in registers: the weight is never formed. Above, ``vq_decode`` writes tiles of the
weight in bfloat16 (transposed, reused) for one bfloat16 GEMM each. The per-column norm is folded into the
activations (``x s``) and a sum (``x . b``), the permutation into one gather of x; outlier columns (a few percent of
K) are decoded by torch and multiplied in beside it. ``vq_mv``'s arithmetic is float32 throughout, without the
producers' roundings to the codebook dtype, so the result is nearer the exact product than theirs; the decode path
rounds each weight once to bfloat16 and sums in float32 (``tests/test_vptq_cpu.py`` bounds both against float64). A
forward that needs a gradient runs ``VPTQLinear``'s exact tiles.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from types import ModuleType

import torch

from ..caps import Caps, Problem
from ..enums import BACKEND, DEVICE, FORMAT
from ..layouts import vptq
from ..target import Target
from .planned.other import VPTQLinear as _Declared
from .vptq import VPTQLinear

NATIVE = "qlinear_native._vq"
INSTALL = "./native (qlinear's native extra, built for this CPU)"
#: Rows up to which ``vq_mv`` runs (8 rows a pass over the codes); above, ``decode_product``. Measured one thread,
#: 4096x14336, vq_mv / decode + GEMM ms (``benchmarks/cpu_vptq_bound.py``,
#: ``results/cpu_formats-vptq-wide-2026-12-07.md``; the AVX-512 kernels that take two V = 8 vectors or one V = 9..16
#: entry per register): v8 k65536 M = 24 36.0 / 38.7, M = 32 50.8 / 41.3; v12 k65536 M = 24 38.4 / 52.8, M = 32 51.0
#: / 53.2.
MV_MAX_M = 24
#: The bound for layers whose codebooks (main and residual, every group) exceed ``TABLE_BYTES``: each of vq_mv's
#: passes then gathers from tables that miss this CPU's 2 MiB L2, while the tiles gather once. Same run: v16 k65536 +
#: residual k65536 (4 MiB) M = 16 56.3 / 61.0, M = 24 92.4 / 61.2.
MV_MAX_M_LARGE_TABLES = 16
TABLE_BYTES = 2 << 20
#: Decoded values per tile of ``decode_product`` (bfloat16: 8 MiB, freed with the call). Wider tiles mean fewer,
#: wider GEMMs; one thread, ms for 2^20 / 2^21 / 2^22 / 2^23 values (``results/cpu_formats-vptq-rows-2026-12-07.md``):
#: 4096x14336 M = 64 42.4 / 38.8 / 38.0 / 36.7, M = 256 64.0 / 59.9 / 59.0 / 63.2; 14336x4096 M = 64 52.6 / 45.5 /
#: 38.0 / 41.5, M = 256 90.7 / 78.1 / 62.4 / 73.0 (2^18: 54.5 / 87.1 and 75.4 / 159.9).
TILE_ELEMENTS = 1 << 22


def mv_max_m(p: vptq.VptqParams) -> int:
    """Rows up to which a layer runs ``vq_mv`` (``MV_MAX_M``, or ``MV_MAX_M_LARGE_TABLES`` past ``TABLE_BYTES``)."""
    entries = p.num_centroids + max(p.num_res_centroids, 0)
    size = p.group_num * entries * p.vector_len * p.codebook_dtype.itemsize
    return MV_MAX_M_LARGE_TABLES if size > TABLE_BYTES else MV_MAX_M


def native() -> ModuleType:
    """``qlinear_native._vq`` (raises ImportError naming the install command when the extra is missing)."""
    try:
        return importlib.import_module(NATIVE)
    except ImportError as err:
        raise ImportError(f"VPTQCpuLinear needs qlinear's native extra: pip install {INSTALL}") from err


@dataclass(frozen=True)
class Codes:
    """The main codes and codebooks as both native calls take them: the tensors (kept alive: the calls read their
    pointers) and the layer sizes, in the calls' argument order."""

    tensors: tuple[torch.Tensor, ...]
    pointers: tuple[int, int, int]  # indices, codebook, residual codebook (0: none)
    sizes: tuple[int, int, int, int]  # G, J, W, group size
    v: int
    bits: tuple[int, int]  # codebook index bits, residual index bits
    dtype: str

    @classmethod
    def of(cls, indices: torch.Tensor, cb: torch.Tensor, rcb: torch.Tensor | None, p: vptq.VptqParams) -> Codes:
        idx, cbc = indices.contiguous(), cb.contiguous()
        res = rcb.contiguous() if rcb is not None else None
        keep = (idx, cbc) if res is None else (idx, cbc, res)
        return cls(keep, (idx.data_ptr(), cbc.data_ptr(), res.data_ptr() if res is not None else 0),
                   (*idx.shape, p.group_size), p.vector_len, (p.index_bits, p.total_bits - p.index_bits),
                   str(cb.dtype).removeprefix("torch."))

    def tile_codes(self) -> Codes:
        """The codes as ``decode_product`` hands them to ``vq_decode``: a float16 codebook without a residual rounded
        to bfloat16 once (VPTQ's k65536 table: 1 MiB a call), since each tile value is that rounding of one entry;
        ``vq_decode`` then copies entries instead of converting one per code. Anything else as it is."""
        if self.dtype != "float16" or self.pointers[2]:
            return self
        cb = self.tensors[1].to(torch.bfloat16)
        return replace(self, tensors=(self.tensors[0], cb), pointers=(self.pointers[0], cb.data_ptr(), 0),
                       dtype="bfloat16")


def main_product(xm: torch.Tensor, codes: Codes, n: int) -> torch.Tensor:
    """``xm [M, Kmain]`` float32 (decoded-column order, outliers removed, norm scale folded in) times the main
    weight: float32 ``[M, N]``, ``vq_mv`` once per 8 rows (16 for V = 8 where AVX-512 holds two vectors a
    register: ``max_m``)."""
    mod = native()
    m, kmain = xm.shape
    j, v = codes.sizes[1], codes.v
    y = torch.empty(m, j * v, dtype=torch.float32)
    xm = xm.contiguous()
    step = mod.max_m(v, codes.dtype)
    for m0 in range(0, m, step):
        mod.vq_mv(*codes.pointers, xm[m0:].data_ptr(), y[m0:].data_ptr(), min(step, m - m0), *codes.sizes, kmain,
                  kmain, j * v, v, *codes.bits, codes.dtype, torch.get_num_threads())
    return y[:, :n]


def decode_product(xm: torch.Tensor, codes: Codes, n: int) -> torch.Tensor:
    """The same product for larger M: ``vq_decode`` writes a tile of output rows in bfloat16, transposed (``[Kmain,
    rows]``, about ``TILE_ELEMENTS`` values, reused), one bfloat16 GEMM per tile (float32 sums, bfloat16 results):
    float32 ``[M, N]``. No decoded row outlives its tile."""
    mod = native()
    m, kmain = xm.shape
    codes = codes.tile_codes()
    j, v = codes.sizes[1], codes.v
    per = max(1, TILE_ELEMENTS // (kmain * v))  # vectors a tile
    width = min(per, j) * v
    tile = torch.empty(kmain, width, dtype=torch.bfloat16)
    xb = xm.to(torch.bfloat16)
    y = torch.empty(m, j * v, dtype=torch.float32)
    for j0 in range(0, j, per):
        j1 = min(j, j0 + per)
        mod.vq_decode(*codes.pointers, tile.data_ptr(), *codes.sizes, kmain, j0, j1, width, v, *codes.bits,
                      codes.dtype, torch.get_num_threads())
        y[:, j0 * v:j1 * v] = torch.mm(xb, tile[:, :(j1 - j0) * v])
    return y[:, :n]


class VPTQCpuLinear(VPTQLinear):
    """VPTQ on CPU: the packed codes walked once per call by the native extra, codebook vectors summed in float32
    (up to ``mv_max_m`` rows; above, bfloat16 tiles decoded by it and one GEMM each)."""

    backend = BACKEND.VPTQ_CPU
    caps = Caps(
        formats={FORMAT.VPTQ: 110},
        bits=_Declared.caps.bits,
        group_sizes=_Declared.caps.group_sizes,
        desc_act=_Declared.caps.desc_act,
        sym=_Declared.caps.sym,
        devices=frozenset({DEVICE.CPU}),
        dtypes=_Declared.caps.dtypes,
        pack_dtypes=_Declared.caps.pack_dtypes,
        requires_modules={NATIVE: INSTALL},
    )

    @classmethod
    def auto_reasons(cls, problem: Problem, target: Target) -> list[str]:
        if problem.dtype == torch.float32:
            return ["sums without the producers' roundings to the codebook dtype: AUTO keeps float32 layers on "
                    "VPTQLinear, which reproduces them (name this backend to accept float32 sums)"]
        return []

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        out = super().runtime_reasons(problem, target)
        p = problem.scheme.layout_params
        if isinstance(p, vptq.VptqParams) and p.vector_len > 32:
            out.append(f"vector_len {p.vector_len} (the native kernel takes up to 32)")
        return out

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        s = problem.scheme
        what = vptq.describe(s) if isinstance(s.layout_params, vptq.VptqParams) else "VPTQ"
        bound = mv_max_m(s.layout_params) if isinstance(s.layout_params, vptq.VptqParams) else MV_MAX_M
        return (f"{what}: up to M={bound}, the packed codes walked once per call by the native extra (vq_mv: "
                "codebook vectors times x summed in float32, the norm folded into x, outlier columns by torch); "
                "above, bfloat16 weight tiles decoded by it (vq_decode), one GEMM each")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x, "cpu")
        self.ensure_prepared()
        x2 = x.reshape(-1, self.in_features)
        if torch.is_grad_enabled() and x2.requires_grad:
            return super().forward(x)  # the exact tiles: the only path with a backward
        return self.product(x2).reshape(*x.shape[:-1], self.out_features)

    def product(self, x2: torch.Tensor) -> torch.Tensor:
        """``x2 [M, K] @ W.T + bias`` through ``vq_mv``, in ``x2``'s dtype."""
        p, n, t = self.params, self.out_features, self.tensors()
        xp = (x2 if self._rt_perm is None else x2[:, self._rt_perm]).float()
        os_ = p.outlier_size if p.outlier else 0
        xm = xp[:, os_:]
        extra = None
        if self._rt_scale is not None:  # norm per input column: sum_k x (w s + b) = sum_k (x s) w + x . b
            extra = xm @ self._rt_bias[os_:].float()
            xm = xm * self._rt_scale[os_:].float()
        product = main_product if x2.shape[0] <= mv_max_m(p) else decode_product
        y = product(xm, Codes.of(t["indices"], t["centroids.weight"], t.get("res_centroids.weight"), p), n)
        if extra is not None:
            y += extra[:, None]
        if os_:
            y += xp[:, :os_] @ self._outlier_cols(torch.float32, compute=torch.float32).t()
        if p.enable_norm and p.norm_dim == 1:  # norm per output row: w s + b
            y = y * t["weight_scale"].float() + xp.sum(1, keepdim=True) * t["weight_bias"].float()
        if self.bias is not None:
            y += self.bias.float()
        return y.to(x2.dtype)


KERNELS = (VPTQCpuLinear,)
