"""``GGUFTritonKernel``: raw GGML blocks multiplied by Triton kernels on CUDA, with no repack.

The kernels read ``qweight`` (uint8 ``[N, nb * T]``, the file's own bytes) as int16 halfwords and decode
the blocks inside the matmul (``triton/gguf.py``), so the layer's resident memory is the checkpoint
itself (Q4_K aside, below): nothing is derived in ``prepare()`` but a small split-K counter buffer. Each forward picks a
variant from M (``triton/gguf_configs.py``): split-K GEMV on CUDA cores (M <= 2), split-K ``tl.dot``
with a 16-row activation tile (M <= 16), tiled ``tl.dot`` (M <= 128), or a transient dense weight in the
activation dtype and torch's matmul (cuBLAS) above. Float32 activations are multiplied in float32.

Types run: Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q8_0, Q1_0, Q1_0_G128. The reference declares logical
bits 1/4/5/6; qlinear adds 8 (``planned/gguf.TRITON_EXTRA_BITS``) so that Q8_0 layers on CUDA run these bodies
rather than GGUFTorchLinear's whole-weight decode in every forward.

Q4_K (half-precision layers of whole super-blocks) runs by default on the GPTQ kernels instead: ``prepare()``
re-lays the blocks' own fields (``layout.build_kquant``, 4.75 bits a weight) and drops the blocks, which reading
``qweight`` re-encodes bit for bit for saving, sharding and float32 inputs (``replaces_blocks``, ``resident_codes``).
``affine_runtime=True`` also builds the float32 ``scale * code + offset`` form of Q4_0 and Q4_1 (about 6 bits a
weight) beside their blocks; ``affine_runtime=False`` keeps every layer on its blocks. The forward then runs the GPTQ
variants with an additive offset per group (gemv_tc, gemv, skinny2, gemm2, dense).
"""

from __future__ import annotations

from typing import Any

import torch

from ..caps import Problem
from ..layouts import gguf
from ..spec import Scheme
from ..target import Target
from .affine_offsets import explain_offsets, offsets_config, offsets_matmul
from .gguf_runtime import lossless_runtime, to_blocks, to_runtime
from .gguf_torch import GGUFQuantLinear
from .planned.gguf import GGUFTritonKernel as _Declared
from .resident_codes import CodesInRuntime, DeviceMovesOnly
from .triton.runtime import interpreting
from .triton_gptq import device_facts, triton_version_reasons

T = gguf.GGMLType
#: every type the Triton bodies decode (``triton.gguf.GEOMS``)
RUNNABLE = frozenset({T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.Q1_0, T.Q1_0_G128})
#: largest dense weight chunk (elements) the ``dense`` variant materialises within one forward
MAX_DENSE = 1 << 26
AFFINE_BUFFERS = ("_af_qweight", "_af_scales", "_af_offsets", "_af_supers", "_af_perm", "_af_xorder")
#: which decoder forms the ``dense`` variant's transient weight chunk: "triton" (``dequant_kernel`` straight into the
#: activation dtype, one launch) or "torch" (``layouts/gguf`` decoders in float32, then a cast); both are exact
DENSE_DECODER = "triton"


class GGUFTritonKernel(DeviceMovesOnly, CodesInRuntime, GGUFQuantLinear):
    """Native GGML blocks of Q4_0/Q4_1/Q5_0/Q5_1/Q5_K/Q6_K/Q1_0 decoded inside Triton matmuls; Q4_K and Q8_0 re-laid
    losslessly for the GPTQ Triton kernels (``replaces_blocks``)."""

    backend = _Declared.backend
    caps = _Declared.caps
    qtypes = frozenset(t for t in RUNNABLE if gguf.TYPES[t].bits in _Declared.caps.bits)

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        return triton_version_reasons(target)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        from .triton.gguf_configs import CROSSOVERS

        s = problem.scheme
        blocks = (f"the GGML blocks in place: split-K GEMV on CUDA cores (M <= {CROSSOVERS['gemv']}), tl.dot with "
                  f"16-row tiles (M <= {CROSSOVERS['skinny']}), tiled tl.dot (M <= {CROSSOVERS['gemm']}), then a "
                  "transient weight decoded by Triton and cuBLAS")
        qt = gguf.ggml_type(s.qtype) if s.qtype is not None else None
        if qt is None or not lossless_runtime(qt, s.in_features, problem.dtype):
            return blocks
        form = ("its own fields: 4.75 bits a weight; gemv_tc / gemv, gemm5 on sm_90 up to M = 1024 (else skinny2, "
                "gemm2), then dequantize + cuBLAS, each with an additive offset per 32" if qt is T.Q4_K else
                "GPTQ 8-bit g32 with zero 128 and d as the float16 scale: 8.5 bits a weight, as the blocks; the "
                "GPTQ variants by M")
        return (f"{qt.name} re-laid at load for the GPTQ Triton kernels ({form}; lossless: the blocks are dropped and "
                f"re-encoded bit for bit on save); float32 inputs: {blocks} (affine_runtime=False keeps the blocks)")

    def __init__(self, scheme: Scheme, bias: bool = False, dtype: torch.dtype = torch.float16,
                 qtype: str | int | gguf.GGMLType | None = None, affine_runtime: bool | None = None) -> None:
        super().__init__(scheme, bias=bias, dtype=dtype, qtype=qtype)
        self.affine_runtime = affine_runtime
        self._af_meta: tuple[int, ...] | None = None
        #: the runtime form holds every field of the blocks (``replaces_blocks``): the blocks are dropped
        self._af_lossless = False

    def replaces_blocks(self) -> bool:
        """Does ``prepare()`` swap the blocks for their runtime form? Unless ``affine_runtime=False``: for Q4_K and Q8_0
        layers of whole blocks and half-precision activations. Those forms hold the blocks' own fields (Q4_K 4.75 bits a
        weight against 4.5, Q8_0 8.5 as the blocks), so nothing is lost, and the GPTQ kernels run them 1.0-3.1x as fast
        as the block kernels (H100, benchmarks/gguf_crossover.py)."""
        return self.affine_runtime is not False and lossless_runtime(self.qtype, self.in_features, self.dtype)

    # the blocks replaced by their lossless runtime form (``resident_codes.CodesInRuntime``)
    def checkpoint_names(self) -> tuple[str, ...]:
        return ("qweight", "bias")

    def checkpoint_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"qweight": ((self.out_features, self.type_info.row_bytes(self.in_features)), torch.uint8)}

    def runtime_can_rebuild(self) -> bool:
        return self._af_lossless and self._af_meta is not None

    def rebuilt_words(self) -> torch.Tensor:
        """The GGML bytes re-encoded from the runtime form, bit for bit (it keeps every field's value)."""
        return to_blocks(self.affine_packed(), self.qtype)

    def runtime_anchor(self) -> torch.Tensor:
        return self._af_qweight

    def drop_runtime(self) -> None:
        for name in AFFINE_BUFFERS:
            setattr(self, name, None)
        self._af_meta, self._af_lossless = None, False

    def load_blocks(self, qweight: Any, bias: Any = None, share: bool = False) -> None:
        self.restore_codes_buffer()
        super().load_blocks(qweight, bias, share)

    @property
    def weight_device(self) -> torch.device:
        return self.checkpoint_tensors()[0].device  # type: ignore[union-attr]

    def register_checkpoint_buffers(self, bias: bool) -> None:
        super().register_checkpoint_buffers(bias)
        self.register_buffer("_rt_lock", None, persistent=False)
        for name in AFFINE_BUFFERS:
            self.register_buffer(name, None, persistent=False)

    def prepare(self) -> None:
        """The split-K counters (int32 zeros, enough for 64 activation tiles of 16-row output tiles), and the GPTQ
        kernels' layout of the blocks where it replaces them (``replaces_blocks``) or ``affine_runtime`` asks. The
        blocks are read from the buffer, or rebuilt from the current runtime where it replaced them."""
        n = self.out_features
        blocks = self.qweight
        self._rt_lock = torch.zeros(64 * -(-n // 16), dtype=torch.int32, device=blocks.device)
        replace_blocks = self.replaces_blocks()
        p = None
        if replace_blocks or self.affine_runtime:
            p = to_runtime(blocks, self.qtype, self.in_features, lossless=replace_blocks)
            if p is None and replace_blocks and self.affine_runtime:  # non-finite scales: beside the blocks
                p, replace_blocks = to_runtime(blocks, self.qtype, self.in_features, lossless=False), False
        self.keep_words_unless(replace_blocks and p is not None, blocks)
        self.drop_runtime()
        if p is not None:
            self._adopt(p)
            self._af_lossless = replace_blocks
        super().prepare()
        self.drop_codes_buffer()

    def _adopt(self, p: Any) -> None:
        for name, t in p.tensors().items():
            if name != "zeros":
                setattr(self, f"_af_{name}", t)
        self._af_meta = p.meta()

    def affine_packed(self) -> Any:
        """The GPTQ kernels' layout of this layer (its runtime form), or None where it runs on its blocks."""
        from .triton.layout import Packed

        if self._af_meta is None:
            return None
        return Packed(self._af_qweight, self._af_scales, None, self._af_perm, *self._af_meta,
                      offsets=self._af_offsets, supers=self._af_supers, xorder=self._af_xorder)

    def affine_matmul(self, x2: torch.Tensor, p: Any, variant: str | None, config: Any) -> torch.Tensor:
        """``x2 @ W^T + bias`` on the GPTQ kernels: with additive offsets (Q4_0/Q4_1/Q4_K) the variants that take
        them (``affine_offsets``), else (Q8_0: GPTQ 8-bit g32) any that runs its words."""
        cfg = config or self.runtime_config(p, x2.shape[0], x2.dtype, x2.device, variant)
        return offsets_matmul(x2, p, cfg, self.bias, self._rt_lock)

    def runtime_config(self, p: Any, m: int, dtype: torch.dtype, device: torch.device,
                       variant: str | None = None) -> Any:
        """The GPTQ kernels' config for M rows of the runtime form ``p`` (``affine_offsets.offsets_config``)."""
        return offsets_config(p, m, dtype, device, variant)

    def explain_call(self, m: int, device: torch.device | str = "cuda") -> str:
        """Which form and variant a forward of M rows (in the layer's dtype) runs on ``device``, on what evidence,
        and why each other variant does not (``cpu``: the interpreter's view, without the device's table)."""
        from .triton.gguf_configs import CROSSOVERS

        self.ensure_prepared()
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("explain_call: no CUDA device here; device='cpu' gives the interpreter's view")
        p = self.affine_packed()
        if p is None:
            cfg = self.config(m, device)
            return (f"M={m}: {cfg.variant} on the {self.qtype.name} blocks (by M alone: the variants serve M <= "
                    f"{CROSSOVERS}, dense above); {cfg}")
        what = ("the two-level Q4_K form" if p.supers is not None else "float32 scales and offsets per 32"
                if p.offsets is not None else f"{p.bits}-bit words, zero {p.zero_const}")
        form = f"{'blocks replaced by' if self.codes_replaced else 'beside the blocks:'} {what}"
        lines = [f"{self.qtype.name} on the GPTQ kernels ({form})",
                 *explain_offsets(p, m, self.dtype, device, "GGUF minimums")]
        return "\n".join(lines)

    def config(self, m: int, device: torch.device, variant: str | None = None) -> object:
        """The launch config for M rows on ``device`` (heuristic, legalised)."""
        from .triton.gguf import GEOMS
        from .triton.gguf_configs import choose, legal

        sms = device_facts(device.index or 0)[1] if device.type == "cuda" else 4
        bps = GEOMS[int(self.qtype)].bps
        nb = self.type_info.blocks_per_row(self.in_features)
        return legal(choose(sms, m, self.out_features, nb, bps, variant), m, nb, bps)

    def matmul(self, x2: torch.Tensor, variant: str | None = None, config: object = None) -> torch.Tensor:
        """``x2 [M, K] @ W^T + bias`` with the chosen (or given) variant / config."""
        from .triton import gguf_mm
        from .triton.configs import Config

        p = self.affine_packed()
        if p is not None and x2.dtype in (torch.float16, torch.bfloat16) and (config is None
                                                                             or isinstance(config, Config)):
            return self.affine_matmul(x2, p, variant, config)
        cfg = config or self.config(x2.shape[0], x2.device, variant)
        qt = int(self.qtype)
        blocks = self.blocks()  # re-encoded (transient) only for float32 inputs once the runtime replaced them
        if cfg.variant != "dense":  # type: ignore[attr-defined]
            return gguf_mm.matmul(x2, blocks, qt, cfg, self.bias, self._rt_lock)  # type: ignore[arg-type]
        n, k = self.out_features, self.in_features
        step = max(64, MAX_DENSE // max(1, k) // 64 * 64)
        parts = []
        for n0 in range(0, n, step):  # the dense chunk lives only inside this loop iteration
            w = self.dense_rows(n0, min(n, n0 + step), x2.dtype, blocks)
            b = None if self.bias is None else self.bias[n0:n0 + step].to(x2.dtype)
            parts.append(x2 @ w.t() if b is None else torch.addmm(b, x2, w.t()))
            del w
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def dense_rows(self, n0: int, n1: int, dtype: torch.dtype, blocks: torch.Tensor | None = None) -> torch.Tensor:
        """Weight rows ``n0:n1`` in ``dtype`` (the float32 decode rounded once), by ``DENSE_DECODER``."""
        blocks = self.blocks() if blocks is None else blocks
        if DENSE_DECODER == "triton":
            from .triton import gguf_mm

            return gguf_mm.dequantize(blocks[n0:n1], int(self.qtype), self.in_features, dtype=dtype)
        return gguf.dequantize(blocks[n0:n1], self.qtype, self.in_features).to(dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight, decoded by the Triton dequant kernel on CUDA (torch decoders elsewhere)."""
        if self.weight_device.type == "cuda" or interpreting():
            from .triton import gguf_mm

            return gguf_mm.dequantize(self.blocks(), int(self.qtype), self.in_features).to(dtype)
        return super().dequantize(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if self.qtype not in RUNNABLE:
            raise ValueError(f"{type(self).__name__}: qtype {self.qtype.name} is not run by the Triton kernels "
                             f"(runs {', '.join(t.name for t in sorted(RUNNABLE))})")
        if x.device.type != "cuda" and not interpreting():
            raise ValueError(f"input: {type(self).__name__} runs on CUDA tensors, got one on {x.device} "
                             "(TRITON_INTERPRET=1 runs the kernels on CPU tensors, for testing)")
        if self.weight_device != x.device:
            raise ValueError(f"input on {x.device} but the layer is on {self.weight_device}")
        self.ensure_prepared()
        x2 = x.reshape(-1, self.in_features)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        return self.matmul(x2).reshape(*x.shape[:-1], self.out_features)


KERNELS = (GGUFTritonKernel,)
