"""BitBLAS checkpoints (GPTQModel ``checkpoint_format: bitblas``) run by qlinear's Triton GPTQ kernels.

``BitblasLinear`` (GPTQ) and ``AWQBitBlasKernel`` (AWQ) hold exactly the tensors GPTQModel saves for these classes
(``layouts/bitblas.py``: LOP3-permuted int8 ``qweight``, float16 ``scales``, packed int8 ``qzeros``), so a
BitBLAS checkpoint loads with ``load_state_dict(strict=True)`` and saves back byte for byte. They do not call
BitBLAS: its runtime compiles TVM kernels for CUDA at construction. ``prepare()`` decodes the tensors to the
canonical weight and builds the same private runtime layout ``TritonV2Linear`` runs, on CUDA. Where Triton does
not run (a CPU), the loader re-encodes a BitBLAS module to gptq_v2 in memory, losslessly, and any GPTQ kernel runs
it (``checkpoint/repack.py``); the layer's ``choice.note`` says so.

As the reference declares, the classes also take plain GPTQ / GPTQ v2 (``BitblasLinear``) and AWQ GEMM
(``AWQBitBlasKernel``) modules, which GPTQModel repacks into BitBLAS at load: here they keep those tensors as stored
and run the same Triton layout (AUTO still ranks ``TritonV2Linear`` above them for such modules).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ..affine import AffineWeight
from ..canonical import decode, encode
from ..caps import Problem
from ..enums import FORMAT, METHOD
from ..layouts import awq, bitblas, gptq
from ..spec import Scheme
from ..target import Target
from .base import QuantLinear, adopt_dtypes
from .planned.exllama_bitblas import AWQBitBlasKernel as _DeclaredAwq
from .planned.exllama_bitblas import BitblasLinear as _DeclaredGptq
from .triton_gptq import TritonQuantMixin

TRITON = {"triton": "triton>=3.4"}
#: The plain layouts each method's class also holds, as declared (GPTQModel repacks them into BitBLAS at load).
PLAIN: dict[METHOD, tuple[FORMAT, ...]] = {METHOD.GPTQ: (FORMAT.GPTQ, FORMAT.GPTQ_V2), METHOD.AWQ: (FORMAT.GEMM,)}


def layout_reasons(scheme: Scheme, method: METHOD) -> list[str]:
    """Why a ``method`` BitBLAS module cannot hold ``scheme`` (another method or layout, or no BitBLAS encoding)."""
    if scheme.method is not method:
        return [f"runs {method.value} checkpoints; this one is {scheme.method.value}"]
    if scheme.format is not FORMAT.BITBLAS and scheme.format not in PLAIN[method]:
        held = ", ".join(f.value for f in (FORMAT.BITBLAS, *PLAIN[method]))
        return [f"holds {held} tensors, not {scheme.format.value} ones"]
    return bitblas.layout_errors(scheme)


def checkpoint_shapes(scheme: Scheme) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The stored tensors of a module in ``scheme``'s layout (BitBLAS, GPTQ or AWQ GEMM)."""
    if scheme.format is FORMAT.BITBLAS:
        return bitblas.checkpoint_shapes(scheme)
    return gptq.checkpoint_shapes(scheme) if scheme.method is METHOD.GPTQ else awq.checkpoint_shapes(scheme)


class BitblasQuantLinear(QuantLinear):
    """The checkpoint buffers (BitBLAS ``qweight``, ``scales``, ``qzeros``, or a plain GPTQ / AWQ module's, optional
    ``bias``) and their codecs."""

    method: ClassVar[METHOD] = METHOD.GPTQ  # the quant_method of the checkpoints this class runs
    raw_packing = False  # hf_pack_layer packs GPTQ/AWQ words; BitBLAS modules come from load_affine or a checkpoint

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return cls.runtime_target_reasons(target) + layout_reasons(problem.scheme, cls.method)

    def register_checkpoint_buffers(self, bias: bool) -> None:
        for name, (shape, dtype) in checkpoint_shapes(self.scheme).items():
            self.register_buffer(name, torch.zeros(shape, dtype=dtype))
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=torch.float16) if bias else None)

    def _load_from_state_dict(self, state_dict: dict[str, object], prefix: str, *args: object,
                              **kwargs: object) -> None:
        stored = self.scheme.format is FORMAT.BITBLAS
        adopt_dtypes(self, state_dict, prefix, ("scales",), bitblas.SCALE_DTYPES if stored else awq.SCALE_DTYPES)
        if stored and not bitblas.zeros_stored(self.scheme) and prefix + "qzeros" not in state_dict:
            state_dict[prefix + "qzeros"] = torch.empty(0, dtype=torch.int8)  # symmetric: GPTQModel's is empty
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _names(self) -> tuple[str, ...]:
        return tuple(checkpoint_shapes(self.scheme))

    def load_affine(self, q: AffineWeight, bias: torch.Tensor | None = None) -> None:
        """Encode ``q`` bit-exactly as GPTQModel saves such a module (BitBLAS, GPTQ or AWQ GEMM)."""
        self.check_fits(q)
        s = self.scheme
        tensors = encode(q, s, self.scales.dtype)
        self.write_checkpoint({name: tensors[name] for name in self._names()}, bias)

    def affine(self) -> AffineWeight:
        return decode({n: getattr(self, n).cpu() for n in self._names()}, self.scheme)

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        return [*(getattr(self, n) for n in self._names()), self.bias]


class BitblasLinear(TritonQuantMixin, BitblasQuantLinear):
    """GPTQ BitBLAS tensors run by qlinear's Triton GPTQ kernels (BitBLAS itself is not called)."""

    backend = _DeclaredGptq.backend
    # The declaration's caps needing triton (the kernels that run) instead of bitblas, which is never imported.
    caps = _DeclaredGptq.caps.but(requires_modules=TRITON)

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return cls.runtime_target_reasons(target) + layout_reasons(problem.scheme, cls.method)


class AWQBitBlasKernel(BitblasLinear):
    """AWQ BitBLAS tensors (always unsigned codes + zero points) run by qlinear's Triton GPTQ kernels."""

    backend = _DeclaredAwq.backend
    method = METHOD.AWQ
    caps = _DeclaredAwq.caps.but(requires_modules=TRITON)  # as BitblasLinear: BitBLAS is not called


KERNELS = (BitblasLinear, AWQBitBlasKernel)
