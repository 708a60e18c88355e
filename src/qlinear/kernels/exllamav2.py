"""ExLlamaV2 kernels for 4-bit GPTQ (v1/v2) and AWQ GEMM layers: ``ExllamaV2Linear``, ``AwqExllamaV2Linear``.

exllamav2's CUDA extension is JIT-built with nvcc and is never called here. Instead:

* off CUDA, ``prepare()`` derives exllamav2's own runtime layout (``layouts/exllamav2.py``: rows sorted by
  group into ``q_perm``/``q_invperm``, nibble-shuffled words, true zero points, float16 scales) and each
  forward decodes it in column tiles exactly as the extension's ``reconstruct_gptq_kernel`` does, then
  multiplies as GPTQModel calls the extension: inputs cast to float16, a float16 output, the bias, a cast back.
  The products accumulate in float32; the extension's GEMM kernels accumulate partly in float16, so outputs agree
  with it to float16 rounding, not bit for bit (the decoded weights do agree bit for bit).
* on CUDA, the layer runs qlinear's Triton GPTQ kernels (``TritonQuantMixin``). Both layouts come from the
  same canonical weight, so keeping one runtime layout per device is the simplest design that is exact
  where it can be checked and fast where it runs; the shuffled layout exists to feed exllamav2's own CUDA
  code, which qlinear does not build.

AUTO never picks these classes (``auto_reasons``): on CUDA they would only repeat ``gptq_triton`` /
``awq_triton`` under a higher declared priority, and the declared devices stay the reference's (CUDA);
build one directly (or with an explicit backend) to run exllamav2's arithmetic.
"""

from __future__ import annotations

import torch

from ..caps import Problem
from ..enums import DEVICE
from ..layouts import exllamav2 as exv2
from ..target import Target
from .awq_base import AwqQuantLinear
from .base import QuantLinear
from .gptq_base import GPTQQuantLinear
from .planned.exllama_bitblas import AwqExllamaV2Linear as _DeclaredAwq
from .planned.exllama_bitblas import ExllamaV2Linear as _Declared
from .triton_gptq import RUNTIME, TritonQuantMixin

EX_RUNTIME = ("_ex_qweight", "_ex_q_perm", "_ex_q_invperm", "_ex_qzeros", "_ex_scales")
#: Decoded values per column tile (float16 weights; float32 while multiplying).
TILE_ELEMENTS = 1 << 18


class ExllamaV2Mixin(TritonQuantMixin):
    """exllamav2's runtime layout and arithmetic off CUDA; qlinear's Triton kernels on CUDA."""

    #: GPTQModel's GPTQ layer sorts act-order rows (``make_sequential``) and adds the bias to the float16 output
    #: before casting back; its AWQ layer hands over no ``g_idx`` and adds the bias after the cast.
    reorder: bool = True
    bias_after_cast: bool = False

    def __init__(self, scheme: object, bias: bool = False, dtype: torch.dtype = torch.float16,
                 release_checkpoint: bool = False) -> None:
        super().__init__(scheme, bias=bias, dtype=dtype, release_checkpoint=release_checkpoint)  # type: ignore
        self._ex_group_size = 0
        for name in EX_RUNTIME:
            self.register_buffer(name, None, persistent=False)

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        out = super().runtime_target_reasons(target)
        if any(d.kind is DEVICE.CUDA for d in target.devices) and not target.has_module("triton"):
            out.append("triton is not installed (on CUDA this layer runs qlinear's Triton kernels): "
                       "pip install 'triton>=3.4'")
        return out

    @classmethod
    def auto_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return ["explicit only: on CUDA it runs the Triton kernels AUTO ranks on their own; elsewhere a slower "
                "exact float16 decode"]

    def prepare(self) -> None:
        if self.qweight.device.type == "cuda":
            for name in EX_RUNTIME:
                setattr(self, name, None)
            super().prepare()
            return
        rt = exv2.build(self.affine(), reorder=self.reorder)
        device = self.qweight.device
        for name in EX_RUNTIME:
            t = getattr(rt, name.removeprefix("_ex_"))
            self.register_buffer(name, None if t is None else t.to(device), persistent=False)
        self._ex_group_size = rt.group_size
        for name in RUNTIME:  # a layer moved off CUDA drops its Triton layout
            setattr(self, name, None)
        self._rt_meta = None
        QuantLinear.prepare(self)  # type: ignore[arg-type]  # the Triton layout is for CUDA only

    def runtime(self) -> exv2.ExV2Runtime:
        """exllamav2's runtime tensors (views of this module's buffers); prepares if needed."""
        self.ensure_prepared()
        if self._ex_qweight is None:
            raise RuntimeError(f"{type(self).__name__}: on CUDA the layer runs the Triton layout, not exllamav2's")
        return exv2.ExV2Runtime(self._ex_qweight, self._ex_q_perm, self._ex_q_invperm, self._ex_qzeros,
                                self._ex_scales, self._ex_group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cuda":
            return super().forward(x)
        self.check_input(x)  # type: ignore[attr-defined]
        k, n = self.in_features, self.out_features  # type: ignore[attr-defined]
        rt = self.runtime()
        x2 = x.reshape(-1, k).to(torch.float16)
        if rt.q_perm is not None:  # sorted row i holds input row q_perm[i]
            x2 = x2[:, rt.q_perm.to(torch.int64) & 0xFFFF]
        xf = x2.to(torch.float32)
        y = torch.empty(x2.shape[0], n, dtype=torch.float16, device=x.device)
        step = max(32, TILE_ELEMENTS // k // 32 * 32)
        for n0 in range(0, n, step):
            n1 = min(n, n0 + step)
            y[:, n0:n1] = (xf @ exv2.decode_cols(rt, n0, n1).to(torch.float32)).to(torch.float16)
        bias = self.bias  # type: ignore[attr-defined]
        if bias is not None and not self.bias_after_cast:
            y += bias.to(torch.float16)
        y = y.to(x.dtype)
        if bias is not None and self.bias_after_cast:
            y += bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], n)


class ExllamaV2Linear(ExllamaV2Mixin, GPTQQuantLinear):
    """GPTQ v1/v2 4-bit buffers run with exllamav2's layout and arithmetic (CUDA: qlinear's Triton kernels)."""

    backend = _Declared.backend
    caps = _Declared.caps


class AwqExllamaV2Linear(ExllamaV2Mixin, AwqQuantLinear):
    """AWQ GEMM 4-bit buffers, as GPTQModel feeds them to exllamav2 (repacked along K, true zeros)."""

    backend = _DeclaredAwq.backend
    caps = _DeclaredAwq.caps
    reorder = False
    bias_after_cast = True


KERNELS = (ExllamaV2Linear, AwqExllamaV2Linear)
