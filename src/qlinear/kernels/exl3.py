"""EXL3 (ExLlamaV3) kernels: ``ExllamaV3TorchLinear`` (exact, any device) and ``ExllamaV3Linear`` (Triton, CUDA).

Both keep the checkpoint tensors as stored (``trellis``, ``suh``/``svh`` or ``su``/``sv``, the codebook marker,
``bias``; ``layouts/exl3.py``) and decode per forward; no dense weight outlives a call. The inner weight is
exllamav3's: float16 codebook values exactly as its CUDA decode rounds them. GPTQModel 7.7.0's Torch EXL3 path
keeps the unrounded float32 result instead (40-50 % of 3inst/mcg values and 95 % of mul1 values differ from the
float16 decode, each by under half a float16 ulp), so it differs from exllamav3's own numbers by that much.

Forward: ``xh = H(x * suh)`` (128-point Hadamard per block, float32), ``y = H(xh @ inner) * svh + bias``.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import torch

from ..caps import Problem, archs_from
from ..enums import DEVICE
from ..layouts import exl3
from ..layouts.exl3 import Exl3LayoutError, Exl3Params
from ..spec import Scheme
from ..target import Target
from .planned.exllama_bitblas import ExllamaV3Linear as _DeclaredNative
from .planned.exllama_bitblas import ExllamaV3TorchLinear as _DeclaredTorch
from .stored_base import StoredTensorsLinear

#: Output columns decoded per step of the Torch kernel (a multiple of the 128-wide Hadamard block), for a
#: transient tile of about 2^20 float32 values.
TILE_ELEMENTS = 1 << 20
#: Rows up to which the native extra's ``exl3_mv`` multiplies on a CPU (decoded in registers, one pass of up to 16
#: rows; above, the decoded tiles and float32 matmul): ``results/cpu_formats-exl3-mv-2026-12-07.md``.
NATIVE_MV_ROWS = 16
RUNTIME = ("_rt_table", "_rt_had", "_rt_suh", "_rt_svh")


@functools.cache
def native_decoder() -> ModuleType | None:
    """``qlinear_native._exl3`` (the native extra, ``pip install ./native``) when installed, else None: it decodes
    the inner weight's tiles on a CPU with the same values ``layouts.exl3.inner_weight`` gives, about 10x faster."""
    try:
        return importlib.import_module("qlinear_native._exl3")
    except ImportError:
        return None


@functools.cache
def table32(codebook: str) -> torch.Tensor:
    """The codebook's 65536 values as float32 on the CPU (exact; one shared, read-only tensor per codebook)."""
    return exl3.codebook_table(codebook, "cpu").float()


def params_of(scheme: Scheme) -> Exl3Params:
    p = scheme.layout_params
    if not isinstance(p, Exl3Params):
        raise Exl3LayoutError(f"an EXL3 layer needs Exl3Params in Scheme.layout_params; found {p!r}")
    return p


class Exl3QuantLinear(StoredTensorsLinear):
    """The EXL3 checkpoint buffers, their validation and the runtime scale vectors both kernels use."""

    RUNTIME = RUNTIME
    FORM = "EXL3 weights are trellis codes"
    #: Whether forward looks codebook values up in Torch (the Triton kernel computes them in registers).
    uses_table = True

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        s = problem.scheme
        if not isinstance(s.layout_params, Exl3Params):
            return ["an EXL3 layer needs its Exl3Params (Scheme.layout_params)"]
        out = cls.runtime_target_reasons(target) + exl3.shape_errors(s.in_features, s.out_features)
        if s.bits != s.layout_params.bits:
            out.append(f"scheme bits {s.bits} disagree with the trellis' {s.layout_params.bits}")
        return out

    @property
    def params(self) -> Exl3Params:
        return params_of(self.scheme)

    def register_checkpoint_buffers(self, bias: bool) -> None:
        shapes = exl3.checkpoint_shapes(params_of(self.scheme), self.in_features, self.out_features)
        for name, (shape, dtype) in shapes.items():
            self.register_buffer(name, torch.zeros(shape, dtype=dtype))
        if self.params.codebook in exl3.MARKERS:
            self.get_buffer(self.params.codebook).copy_(exl3.marker_tensor(self.params.codebook))
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=torch.float16) if bias else None)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The checkpoint tensors by their checkpoint names (bias excluded)."""
        return {name: getattr(self, name) for name in exl3.checkpoint_shapes(self.params, self.in_features,
                                                                              self.out_features)}

    def validate_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        exl3.check_tensors(tensors, self.params, self.in_features, self.out_features)

    load_exl3 = StoredTensorsLinear.load_tensors

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense weight ``[N, K]`` (a fresh tensor; ``layouts.exl3.dense_weight``)."""
        return exl3.dense_weight(self.tensors(), self.params).t().to(dtype)

    def prepare(self) -> None:
        """Validate the tensors; keep the codebook table, the Hadamard matrix (both shared between layers) and float32
        scale vectors."""
        t = self.tensors()
        exl3.check_tensors(t, self.params, self.in_features, self.out_features)
        dev = t["trellis"].device
        suh, svh = exl3.scale_vectors(t, self.params)
        self._rt_table = exl3.codebook_table(self.params.codebook, dev) if self.uses_table else None
        self._rt_had = exl3.hadamard(dev)
        self._rt_suh, self._rt_svh = suh.float().contiguous(), svh.float().contiguous()
        super().prepare()

    def extra_repr(self) -> str:
        p = self.params
        signs = ", su/sv sign bitfields" if p.packed_signs else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, exl3 {p.bits}-bit "
                f"{p.codebook}{signs}, backend={self.backend.value}")


class ExllamaV3TorchLinear(Exl3QuantLinear):
    """EXL3 on any device in plain Torch, float32 arithmetic on the exact float16 inner weight, decoded 128-column
    blocks at a time inside each forward (on a CPU by the native extra when installed: the same values)."""

    backend = _DeclaredTorch.backend
    caps = _DeclaredTorch.caps

    def _input_transform(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        self.check_input(x)
        self.ensure_prepared()
        x2 = x.reshape(-1, self.in_features)
        return exl3.had_last(x2.float() * self._rt_suh, self._rt_had), x2.shape[0]

    def _output_transform(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y = exl3.had_last(y, self._rt_had) * self._rt_svh
        if self.bias is not None:
            y += self.bias.float()
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def tile_cols(self) -> int:
        return max(exl3.HAD, TILE_ELEMENTS // self.in_features // exl3.HAD * exl3.HAD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xh, m = self._input_transform(x)
        n, step = self.out_features, self.tile_cols()
        native = native_decoder() if self.trellis.device.type == "cpu" and self.trellis.is_contiguous() else None
        kt, nt, bits, cb = self.in_features // exl3.TILE, n // exl3.TILE, self.params.bits, self.params.codebook
        if native is not None and m <= NATIVE_MV_ROWS:  # decoded in registers, never stored
            xh = xh.contiguous()
            y = torch.empty(m, n, dtype=torch.float32)
            native.exl3_mv(self.trellis.data_ptr(), table32(cb).data_ptr(), xh.data_ptr(), y.data_ptr(), m, kt, nt,
                           bits, torch.get_num_threads(), cb)
            return self._output_transform(y, x)
        y = torch.empty(m, n, dtype=torch.float32, device=x.device)
        tile = torch.empty(self.in_features, step, dtype=torch.float32) if native is not None else None
        for n0 in range(0, n, step):
            n1 = min(n, n0 + step)
            if tile is not None:  # the same float32 values, decoded by the native extra into a reused tile
                native.exl3_decode(self.trellis.data_ptr(), table32(cb).data_ptr(), tile.data_ptr(), kt, nt, bits,
                                   n0 // exl3.TILE, n1 // exl3.TILE, step, torch.get_num_threads(), cb)
                w = tile[:, :n1 - n0]
            else:
                w = exl3.inner_weight(self.trellis, self.params.bits, self._rt_table, n0 // exl3.TILE,
                                      n1 // exl3.TILE).float()
            torch.matmul(xh, w, out=y[:, n0:n1])
        return self._output_transform(y, x)


class ExllamaV3Linear(Exl3QuantLinear):
    """EXL3 on CUDA through Triton (``triton/exl3_mv.py``). The reference's class of this name runs exllamav3's
    JIT-built CUDA extension; qlinear does not build or import it, and runs its own Triton kernels instead: for
    M up to 32 each lane decodes 8 consecutive trellis states from 2-3 words straight into its mma.sync A fragment
    (exllamav3's tile order is that fragment's, ``triton/exl3_tc.py``, Gluon; float32 sums, split over K; without
    Gluon a lane-wise decode GEMV up to M = 4, ``triton/exl3_gemv.py``), for M <= 64 a fused decode GEMM (the same
    decode of a block, placed for ``tl.dot``), above that the float16 inner weight decoded once per call
    (transient) and one cuBLAS matmul. The transformed input
    is rounded to float16 before the product, as exllamav3 does; outputs match ExllamaV3TorchLinear to that
    rounding (split-K partial sums are added atomically, so their order may vary between calls). Declared for CUDA
    only: the kernel has not been run on ROCm."""

    backend = _DeclaredNative.backend
    uses_table = False
    caps = _DeclaredNative.caps.but(devices=frozenset({DEVICE.CUDA}), requires_modules={"triton": "triton>=3.4"},
                                    gpu_archs=archs_from((8, 0)))

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        return ("M <= 32: trellis decoded into mma.sync fragments (Gluon, split-K; without Gluon a lane-wise GEMV up "
                "to M = 4); M <= 64: fused trellis-decode GEMM (Triton, split-K); "
                "above: float16 weight decoded per call, then cuBLAS; input/output Hadamard transforms as two Triton "
                "butterfly kernels")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .triton import exl3_mv, hadamard

        self.check_input(x, "cuda")
        self.ensure_prepared()
        x2 = x.reshape(-1, self.in_features)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        xh = hadamard.input_transform(x2, self._rt_suh)
        y = exl3_mv.inner_product(xh, self.trellis, self.params.bits, self.params.codebook)
        y = hadamard.output_transform(y, self._rt_svh, self.bias, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)


KERNELS = (ExllamaV3Linear, ExllamaV3TorchLinear)
