"""``Exl2TritonLinear``: EXL2 mixed-bit layers on CUDA through the GPTQ Triton kernels.

``Exl2TorchLinear`` decodes the whole weight with torch in every forward (4.4 ms for 4096x14336 on an H100, 100x
bf16). Here ``prepare()`` re-lays the groups as at most three GPTQ layouts (``exl2_runtime``: 8, 4 and 2-bit
words, one per run of widths) and drops ``q_weight``: the layouts keep every code, and the file's words are
rebuilt from them when saved or decoded. Where the widest segment's variant for M rows is ``gemv_tc`` and M <=
``ONE_LAUNCH_MAX_M`` (decode), one launch gathers every segment's input rows and one ``triton/exl2_tc.py`` launch
runs all segments, their sum being its split-K sum; otherwise each segment gathers its rows, runs the variant M
picks for it, and the products are summed.
"""

from __future__ import annotations

from typing import Any

import torch

from ..caps import Caps, Problem
from ..enums import BACKEND, DEVICE, FORMAT
from ..layouts import exl2
from ..target import Target
from . import exl2_runtime
from .exl2 import exl2_params
from .exl2_replaced import Exl2ReplacedWeight
from .resident_codes import DeviceMovesOnly
from .triton.runtime import interpreting
from .triton_gptq import device_facts, fitted_config, triton_rows, triton_version_reasons, unfit_variants

#: Rows up to which a forward takes the one-launch path unasked (``fused_config``; ``variant="exl2_tc"`` always may,
#: to 16 rows). Measured on an H100, 4096x14336 at 3.9 bits (``results/h100-gpu-exl2-one-launch-2026-12-07.md``):
#: M = 1 23.4 us against 30.1 one segment at a time (bf16 43.3), M = 4 24.1; M = 16 40.4 at best against 40.5.
#: M = 5..8 were not timed, so they stay one segment at a time.
ONE_LAUNCH_MAX_M = 4
#: The one launch's split (``split_k`` x segments, shared by bytes), step and prefetch: the same run's best at M = 1
#: and 4 among split_k 2/4/8/16, block_k 64/128/256, prefetch off/on (the gemv_tc table's own picks took 27.9 us).
ONE_LAUNCH_STEP = {"split_k": 4, "block_k": 64, "prefetch": True}

#: the per-segment runtime tensors (constant zeros: no zero tensor; no offsets or super-scales)
SEGMENT_TENSORS = ("qweight", "scales", "perm", "xorder")


class Exl2TritonLinear(DeviceMovesOnly, Exl2ReplacedWeight):
    """EXL2 (2/3/4/5/6/8-bit row groups) on CUDA: widened losslessly to 2/4/8-bit GPTQ layouts run by Triton."""

    backend = BACKEND.EXL2_TRITON
    caps = Caps(
        formats={FORMAT.EXL2: 30},
        bits=frozenset(exl2.BITS),
        group_sizes=None,
        desc_act=None,
        sym=None,
        devices=frozenset({DEVICE.CUDA}),
        dtypes=frozenset({torch.float16, torch.bfloat16}),
        pack_dtypes=frozenset({torch.int32}),
        out_divisible=8,
        requires_modules={"triton": "triton>=3.4"},
    )

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        return triton_version_reasons(target)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        p = problem.scheme.layout_params
        segs = exl2_runtime.segments(p) if isinstance(p, exl2.Exl2Params) else ()
        runs = ", ".join(f"{s.rows} rows of {sorted(set(p.group_bits[s.first:s.first + s.count]), reverse=True)} "
                         f"bits as {s.bits}-bit words g{s.group}" for s in segs) or "its runs of widths"
        return (f"the GPTQ Triton kernels on {runs} (q_weight re-laid at load, rebuilt bit for bit on save); "
                "where the widest segment runs gemv_tc (decode), every segment in one launch (exl2_tc); else per "
                "segment the variant M picks (gemv_tc / gemv, the tensor-core GEMMs, dequantize + cuBLAS), the "
                "segments' outputs summed")

    def register_checkpoint_buffers(self, bias: bool) -> None:
        super().register_checkpoint_buffers(bias)
        self.register_buffer("_rt_lock", None, persistent=False)
        self.register_buffer("_perm32", None, persistent=False)
        self.register_buffer("_xidx", None, persistent=False)  # the one-launch gather (exl2_tc.XPlan.index)
        self._xcols: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())  # its segments' offsets and widths
        for i in range(len(exl2_runtime.KERNEL_BITS)):
            for name in SEGMENT_TENSORS:
                self.register_buffer(f"_s{i}_{name}", None, persistent=False)
        self._seg_meta: list[tuple[int, ...]] = []
        self._segments: tuple[exl2_runtime.Segment, ...] = ()

    # ------------------------------------------------------------------ checkpoint <-> runtime
    def packs(self) -> list[Any]:
        """The segments' GPTQ layouts (views of this module's buffers)."""
        from .triton.layout import Packed

        return [Packed(getattr(self, f"_s{i}_qweight"), getattr(self, f"_s{i}_scales"), None,
                       getattr(self, f"_s{i}_perm"), *meta, xorder=getattr(self, f"_s{i}_xorder"))
                for i, meta in enumerate(self._seg_meta)]

    def runtime_can_rebuild(self) -> bool:
        return bool(self._seg_meta)

    def rebuilt_words(self) -> torch.Tensor:
        return exl2_runtime.to_q_weight(self.packs(), exl2_params(self.scheme))

    def runtime_anchor(self) -> torch.Tensor:
        return self._s0_qweight

    def drop_runtime(self) -> None:
        for i in range(len(exl2_runtime.KERNEL_BITS)):
            for name in SEGMENT_TENSORS:
                setattr(self, f"_s{i}_{name}", None)
        self._seg_meta, self._segments = [], ()
        self._xidx, self._xcols = None, ((), ())

    def prepare(self) -> None:
        """Check the file's tensors, build the segments from them and drop ``q_weight`` (read back from the
        current segments when it was dropped before)."""
        from .triton.qmm import lock_slots

        super().prepare()  # checks the tensors; q_perm (int64), the float16 group scales
        p = exl2_params(self.scheme)
        packs = exl2_runtime.to_runtime(self.q_weight, self._scales, p)
        dev = self.q_scale.device
        for i, pk in enumerate(packs):
            for name in SEGMENT_TENSORS:
                t = pk.tensors()[name]
                setattr(self, f"_s{i}_{name}", None if t is None else t.to(dev))
        self._seg_meta = [pk.meta() for pk in packs]
        self._segments = exl2_runtime.segments(p)
        self._perm32 = self._perm.to(torch.int32)
        plan = exl2_runtime.x_plan(self.packs(), [seg.row0 for seg in self._segments], self._perm)
        self._xidx, self._xcols = plan.index.to(dev), (plan.offsets, plan.widths)
        self._perm = self._scales = self._groups = None  # the torch path's tensors: the segments hold them now
        self._rt_lock = torch.zeros(lock_slots(self.out_features), dtype=torch.int32, device=dev)
        self.drop_codes_buffer()

    # ------------------------------------------------------------------ forward
    def configs(self, m: int, device: torch.device, variant: str | None = None, config: Any = None) -> list[Any]:
        """Each segment's launch config for M rows: the GPTQ table or heuristic (or ``config``, for tests and
        benchmarks), legalised for the segment's layout."""
        from .triton.configs import legal

        if config is not None:
            return [legal(config, m, pk.kp, pk.bits) for pk in self.packs()]
        return [fitted_config(pk, m, self.dtype, device, variant) for pk in self.packs()]

    def explain_call(self, m: int, device: torch.device | str = "cuda") -> str:
        """Whether the segments run in one launch (and why not), then per segment: its rows and widths, the variant
        a forward of M rows runs and why each other does not."""
        from .triton import exl2_tc
        from .triton.why import explain_choice

        self.ensure_prepared()
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("explain_call: no CUDA device here; device='cpu' gives the interpreter's view")
        name, sms = device_facts(device.index or 0) if device.type == "cuda" else ("interpreter", 4)
        p = exl2_params(self.scheme)
        fused = self.fused_config(m, device)
        if fused is not None:
            lines = [f"one launch (exl2_tc): every segment's splits in one gemv_tc kernel, {fused.num_warps} warps, "
                     f"block_n {fused.block_n}, block_k {fused.block_k}, split-K {fused.split_k} x {len(self.packs())} "
                     "segments shared by bytes; the per-segment variants below run otherwise"]
        else:
            why = exl2_tc.fused_reasons(self.packs(), m, self.dtype, device) or (
                [f"M = {m} above ONE_LAUNCH_MAX_M = {ONE_LAUNCH_MAX_M} (measured no faster there)"]
                if m > ONE_LAUNCH_MAX_M else ["the widest segment's variant for this M is not gemv_tc"])
            lines = ["segments one by one (not one launch: " + "; ".join(why) + ")"]
        for seg, pk in zip(exl2_runtime.segments(p), self.packs()):
            widths = sorted(set(p.group_bits[seg.first:seg.first + seg.count]), reverse=True)
            lines.append(f"segment rows {seg.row0}..{seg.row0 + seg.rows - 1} (EXL2 {widths}-bit): {pk.bits}-bit "
                         f"words, groups of {pk.group}")
            unfit = unfit_variants(pk, m, self.dtype, device)
            lines += ["  " + v for v in explain_choice(name, sms, m, pk.n, pk.k, pk.kp, pk.bits, pk.group, unfit)]
        return "\n".join(lines)

    def fused_config(self, m: int, device: torch.device, variant: str | None = None, config: Any = None) -> Any:
        """The one-launch config for M rows (the widest segment's ``gemv_tc`` config with ``ONE_LAUNCH_STEP``), or
        None where the segments run one by one: another variant asked for, no variant and M above
        ``ONE_LAUNCH_MAX_M`` or the widest segment's variant not ``gemv_tc``, or ``exl2_tc.fused_reasons``."""
        import dataclasses

        from .triton import exl2_tc

        if variant not in (None, "exl2_tc") or (variant is None and m > ONE_LAUNCH_MAX_M):
            return None
        if exl2_tc.fused_reasons(self.packs(), m, self.dtype, device):
            return None
        if config is not None:
            return config if variant == "exl2_tc" else None
        widest = max(self.packs(), key=lambda pk: pk.qweight.numel())
        cfg = fitted_config(widest, m, self.dtype, device, "gemv_tc" if variant == "exl2_tc" else None)
        return dataclasses.replace(cfg, **ONE_LAUNCH_STEP) if cfg.variant == "gemv_tc" else None

    def matmul(self, x2: torch.Tensor, variant: str | None = None, config: Any = None) -> torch.Tensor:
        """``x2 [M, K] @ W^T + bias``: every segment in one launch (``fused_config``), or each segment's rows
        gathered, multiplied, the products summed."""
        from .triton.dequant import dense_mm
        from .triton.gather import gather
        from .triton.qmm import qmm

        self.ensure_prepared()
        fused = self.fused_config(x2.shape[0], x2.device, variant, config)
        if fused is not None:
            from .triton import exl2_tc

            plan = exl2_runtime.XPlan(self._xidx, *self._xcols)
            return exl2_tc.exl2_tc(gather(x2, self._xidx), plan, self.packs(), fused, self.bias, self._rt_lock,
                                   use_asm=not interpreting())
        if variant == "exl2_tc":
            from .triton import exl2_tc

            why = exl2_tc.fused_reasons(self.packs(), x2.shape[0], self.dtype, x2.device)
            raise ValueError("variant exl2_tc cannot run this call: " + "; ".join(why or ["no gemv_tc config"]))
        y = None
        for seg, pk, cfg in zip(self._segments, self.packs(),
                                self.configs(x2.shape[0], x2.device, variant, config)):
            xs = gather(x2, self._perm32[seg.row0:seg.row0 + seg.rows])
            bias = self.bias if y is None else None
            part = dense_mm(xs, pk, cfg, bias) if cfg.variant == "dense" else qmm(xs, pk, cfg, bias, self._rt_lock)
            y = part if y is None else y.add_(part)
        assert y is not None  # an EXL2 layer has at least one group
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return self.matmul(triton_rows(self, x, lambda: self._s0_qweight)).reshape(*x.shape[:-1], self.out_features)


KERNELS = (Exl2TritonLinear,)
