"""Peers for benchmarks/gpu_linear.py: bf16 cuBLAS, torch tinygemm int4, and vLLM 0.33.0 Marlin/Machete.

Each builder takes one GPTQ 4-bit g128 symmetric weight (``qweight [K/8, N]`` int32 and ``scales [K/128, N]``),
so every contender multiplies the same numbers, and returns ``fn(x) -> y`` or raises with the reason.
vLLM's ops come from ``.peers/vllm_C_stable_libtorch.abi3.so`` (or ``.so.xz``), loaded with
``torch.ops.load_library`` as /work/shared/specs/peers.md describes.
"""

from __future__ import annotations

import lzma
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
UINT4B8 = 1125899907892224  # vLLM scalar_type id of uint4b8 (4-bit codes, bias 8)
MARLIN_PERM = [i + 8 * j for i in range(8) for j in range(8)]
Fn = Callable[[torch.Tensor], torch.Tensor]


def load_vllm() -> str:
    """Load vLLM's stable-ABI op library once; returns '' or the reason it is unavailable."""
    if hasattr(torch.ops._C, "marlin_gemm"):
        return ""
    so = ROOT / ".peers" / "vllm_C_stable_libtorch.abi3.so"
    if not so.exists():
        xz = so.with_name(so.name + ".xz")
        if not xz.exists():
            return f"{so} (or .xz) not found"
        so = Path("/tmp") / so.name
        if not so.exists():
            with lzma.open(xz) as src, open(so, "wb") as dst:
                shutil.copyfileobj(src, dst)
    try:
        torch.ops.load_library(str(so))
    except Exception as err:  # a missing symbol or ABI mismatch: report, keep benchmarking the rest
        return f"load_library failed: {err}"
    return ""


def call_by_schema(op: Any, **values: Any) -> Any:
    """Call a torch op positionally in its schema's order, by argument name (defaults where not given)."""
    schema = op.default._schema
    args = []
    for a in schema.arguments:
        if a.name in values:
            args.append(values[a.name])
        elif a.has_default_value():
            args.append(a.default_value)
        else:
            raise TypeError(f"no value for {a.name!r} of {schema}")
    return op(*args)


def unpack_gptq(qweight: torch.Tensor) -> torch.Tensor:
    """4-bit GPTQ words ``[K/8, N]`` -> codes ``[K, N]`` uint8 (field j of word r is row 8r+j)."""
    shifts = torch.arange(0, 32, 4, device=qweight.device).view(1, 8, 1)
    codes = (qweight.unsqueeze(1) >> shifts) & 0xF
    return codes.reshape(-1, qweight.shape[1]).to(torch.uint8)


def dense_weight(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float weight ``[N, K]`` bf16 (sym, zero 8, group 128)."""
    codes = unpack_gptq(qweight).float()
    s = scales.float().repeat_interleave(128, dim=0)
    return ((codes - 8) * s).t().contiguous().to(torch.bfloat16)


def bf16_linear(qweight: torch.Tensor, scales: torch.Tensor) -> Fn:
    w = dense_weight(qweight, scales)
    return lambda x: F.linear(x, w)


def tinygemm(qweight: torch.Tensor, scales: torch.Tensor) -> Fn:
    """torch's CUDA int4 (value ``(q - 8) * scale + zero``): zero 0 reproduces the symmetric weight."""
    codes = unpack_gptq(qweight).t().contiguous()  # [N, K]
    packed_nk = (codes[:, 0::2] << 4 | codes[:, 1::2]).contiguous()  # [N, K/2], high nibble first
    packed = torch.ops.aten._convert_weight_to_int4pack(packed_nk, 8)
    sz = torch.stack([scales.to(torch.bfloat16), torch.zeros_like(scales, dtype=torch.bfloat16)], dim=2)
    return lambda x: torch.ops.aten._weight_int4pack_mm(x, packed, 128, sz.contiguous())


def marlin(qweight: torch.Tensor, scales: torch.Tensor) -> Fn:
    reason = load_vllm()
    if reason:
        raise RuntimeError(reason)
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    b_q = call_by_schema(torch.ops._C.gptq_marlin_repack, b_q_weight=qweight,
                         perm=torch.empty(0, dtype=torch.int32, device=qweight.device),
                         size_k=k, size_n=n, num_bits=4, is_a_8bit=False)
    s = scales.to(torch.bfloat16).reshape(-1, 64)[:, MARLIN_PERM].reshape(-1, n).contiguous()
    sms = torch.cuda.get_device_properties(qweight.device).multi_processor_count
    ws = torch.zeros(4 * sms, dtype=torch.int32, device=qweight.device)
    op = torch.ops._C.marlin_gemm
    return lambda x: op(x, None, b_q, None, s, None, None, None, ws, UINT4B8, x.shape[0], n, k, False, True, False)


def machete(qweight: torch.Tensor, scales: torch.Tensor) -> Fn:
    reason = load_vllm()
    if reason:
        raise RuntimeError(reason)
    b = torch.ops._C.machete_prepack_B(qweight.t().contiguous().t(), torch.bfloat16, UINT4B8, torch.bfloat16)
    s = scales.to(torch.bfloat16).contiguous()
    op = torch.ops._C.machete_mm
    return lambda x: op(x, b, UINT4B8, None, s, None, 128, None, None, None)


PEERS: dict[str, Callable[[torch.Tensor, torch.Tensor], Fn]] = {
    "bf16": bf16_linear, "tinygemm": tinygemm, "marlin": marlin, "machete": machete,
}
