"""Golden bytes of vLLM 0.33's own Marlin repacks, made on a GPU, for qlinear's CPU tests of its Marlin codec.

Run on a CUDA machine with vLLM's op library in ``.peers/`` (see benchmarks/gpu_peers.py):
``python benchmarks/marlin_golden.py OUT_DIR``. Writes ``marlin_vllm_repack.safetensors``: metadata ``cases`` =
JSON list of ``{name, kind: gptq|awq, bits, k, n, group, act_order}``; tensors ``{name}.src`` (GPTQ
``[K*b/32, N]`` or AWQ ``[K, N*b/32]`` int32), ``{name}.perm`` (act-order only), ``{name}.marlin`` (the op's
output). vLLM 0.33's repack takes no perm: act-order cases gather the source rows first (row k <- ``perm[k]``),
as its Python side does, and multiply ``x[:, perm]``. For the GEMM check the file also holds ``{name}.scales``
``[G, N]`` fp16 and ``{name}.zeros`` ``[G, N]`` int32 (AWQ) as the quantizer wrote them, ``{name}.g_idx``,
``{name}.x`` and ``{name}.y`` (vLLM's ``marlin_gemm`` on the repacked weight, scales / zero points permuted by
the rules of formats.md 2.8, written here independently); the script prints how far ``y`` is from a float64
dequantized reference: small means those rules are right.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_peers import call_by_schema, load_vllm

NAN_IEEE = 1 << 50  # vLLM ScalarType.id: exponent 8 | mantissa 8 | signed 1 | bias 32 | finite 1 | nan_repr 8


def type_id(bits: int, bias: int) -> int:
    return NAN_IEEE | (bits << 8) | (bias << 17)


GROUP_PERM = [i + 8 * j for i in range(8) for j in range(8)]
SINGLE_PERM = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]
AWQ_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]  # logical column j of 8 sits in nibble AWQ_ORDER[j]
MARLIN_ZP_INTERLEAVE = {4: [0, 2, 4, 6, 1, 3, 5, 7], 8: [0, 2, 1, 3]}


def permute_scales(s: torch.Tensor, grouped: bool) -> torch.Tensor:
    n = s.shape[1]
    if grouped:
        return s.reshape(-1, 64)[:, GROUP_PERM].reshape(-1, n).contiguous()
    return s.reshape(-1, 32)[:, SINGLE_PERM].reshape(-1, n).contiguous()


def unpack_rows(words: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQ ``[K*b/32, N]`` -> codes ``[K, N]``."""
    pf = 32 // bits
    sh = torch.arange(0, 32, bits, device=words.device).view(1, pf, 1)
    return ((words.unsqueeze(1) >> sh) & ((1 << bits) - 1)).reshape(-1, words.shape[1])


def repack_rows(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes ``[K, N]`` -> GPTQ words ``[K*b/32, N]`` (field j of word r is row pf*r + j)."""
    pf = 32 // bits
    c = codes.to(torch.int64).reshape(-1, pf, codes.shape[1])
    words = sum(c[:, j] << (bits * j) for j in range(pf))
    return ((words + 2**31) % 2**32 - 2**31).to(torch.int32)


def unpack_awq(words: torch.Tensor, bits: int) -> torch.Tensor:
    """AWQ ``[R, N*b/32]`` -> values ``[R, N]`` in logical column order (4-bit interleaved; 8-bit [0,2,1,3])."""
    pf = 32 // bits
    order = AWQ_ORDER if bits == 4 else [0, 2, 1, 3]
    sh = torch.arange(0, 32, bits, device=words.device).view(1, 1, pf)
    fields = (words.unsqueeze(2) >> sh) & ((1 << bits) - 1)  # [R, N/pf, pf] by field
    return fields[:, :, order].reshape(words.shape[0], -1)


def marlin_zero_points(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical zeros ``[G, N]`` -> Marlin's packed ``[G, N*b/32]`` (64-block scale permutation, interleave, pack)."""
    g, n = z.shape
    z = z.reshape(-1, 64)[:, GROUP_PERM].reshape(g, n)
    pf = 32 // bits
    z = z.reshape(-1, pf)[:, MARLIN_ZP_INTERLEAVE[bits]].reshape(g, n // pf, pf)
    out = torch.zeros(g, n // pf, dtype=torch.int32, device=z.device)
    for i in range(pf):
        out |= (z[:, :, i].to(torch.int32) << (bits * i))
    return out


def main() -> None:
    out_dir = Path(sys.argv[1])
    reason = load_vllm()
    if reason:
        raise SystemExit(reason)
    for name in ("gptq_marlin_repack", "awq_marlin_repack", "marlin_gemm", "machete_prepack_B", "machete_mm"):
        op = getattr(torch.ops._C, name, None)
        print(name, op.default._schema if op is not None else "MISSING")
    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(2026)
    cases = [("gptq4_g64", "gptq", 4, 256, 128, 64, False), ("gptq4_g64_act", "gptq", 4, 256, 128, 64, True),
             ("gptq4_ch", "gptq", 4, 128, 192, -1, False), ("gptq8_g128", "gptq", 8, 256, 128, 128, False),
             ("gptq8_g64_act", "gptq", 8, 256, 192, 64, True), ("awq4_g64", "awq", 4, 128, 128, 64, False),
             ("awq4_g32", "awq", 4, 256, 256, 32, False), ("awq8_g64", "awq", 8, 256, 256, 64, False)]
    tensors: dict[str, torch.Tensor] = {}
    meta = []
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ws = torch.zeros(max(4 * sms, 128), dtype=torch.int32, device=dev)
    for name, kind, bits, k, n, group, act in cases:
        pf = 32 // bits
        gs = k if group == -1 else group
        g = k // gs
        src_shape = (k // pf, n) if kind == "gptq" else (k, n // pf)
        src = torch.randint(-2**31, 2**31 - 1, src_shape, generator=gen, dtype=torch.int64).to(torch.int32)
        g_idx = torch.arange(k, dtype=torch.int32) // gs
        perm = torch.empty(0, dtype=torch.int32)
        if act:
            g_idx = g_idx[torch.randperm(k, generator=gen)].contiguous()
            perm = torch.argsort(g_idx).to(torch.int32)
        scales = (torch.rand(g, n, generator=gen) * 0.02 + 0.001).to(torch.float16)
        zeros = torch.randint(0, 1 << bits, (g, n), generator=gen, dtype=torch.int32)
        if kind == "gptq":
            # vLLM 0.33's repack takes no perm: act-order rows are gathered (row k <- source row perm[k]) first
            rows = repack_rows(unpack_rows(src, bits)[perm.long()], bits) if act else src
            marlin = call_by_schema(torch.ops._C.gptq_marlin_repack, b_q_weight=rows.to(dev), perm=perm.to(dev),
                                    size_k=k, size_n=n, num_bits=bits, is_a_8bit=False)
        else:
            marlin = call_by_schema(torch.ops._C.awq_marlin_repack, b_q_weight=src.to(dev), size_k=k, size_n=n,
                                    num_bits=bits, is_a_8bit=False)
        tensors[f"{name}.src"] = src
        if act:
            tensors[f"{name}.perm"] = perm
        tensors[f"{name}.marlin"] = marlin.cpu()
        # GEMM through the repacked weight, scales / zeros permuted by formats.md 2.8 (written here independently)
        codes = unpack_rows(src, bits) if kind == "gptq" else unpack_awq(src, bits)  # [K, N]
        zlog = torch.full((g, n), 1 << (bits - 1), dtype=torch.int32) if kind == "gptq" else zeros
        w = (codes.double() - zlog[g_idx.long()].double()) * scales[g_idx.long()].double()  # [K, N]
        x = (torch.randn(5, k, generator=gen) * 0.5).to(torch.float16)
        y_ref = x.double() @ w
        a = x[:, perm.long()] if act else x  # with the rows sorted, act-order is a plain grouped GEMM on x[:, perm]
        g_eff = g_idx[perm.long()] if act else g_idx
        assert torch.equal(g_eff, torch.arange(k, dtype=torch.int32) // gs)
        values = dict(a=a.to(dev), b_q_weight=marlin, b_scales=permute_scales(scales, g > 1).to(dev), workspace=ws,
                      size_m=5, size_n=n, size_k=k, is_k_full=True, use_atomic_add=False, use_fp32_reduce=True,
                      is_zp_float=False)
        schema_names = [a.name for a in torch.ops._C.marlin_gemm.default._schema.arguments]
        for a in schema_names:
            if "type" in a:
                values[a] = type_id(bits, 1 << (bits - 1)) if kind == "gptq" else type_id(bits, 0)
            elif "zeros" in a:
                values[a] = marlin_zero_points(zeros, bits).to(dev) if kind == "awq" else None
            elif a not in values:
                values[a] = None
        try:
            y = call_by_schema(torch.ops._C.marlin_gemm, **values).float().cpu()
            err = ((y.double() - y_ref).abs().max() / y_ref.abs().max()).item()
            tensors.update({f"{name}.x": x, f"{name}.y": y.to(torch.float16)})
        except Exception as exc:  # report, keep the repack goldens
            err = f"marlin_gemm failed: {exc}"
        tensors.update({f"{name}.scales": scales, f"{name}.g_idx": g_idx})
        if kind == "awq":
            tensors[f"{name}.zeros"] = zeros
        print(f"{name}: marlin {tuple(marlin.shape)} gemm rel err vs float64 dequant: {err}")
        meta.append({"name": name, "kind": kind, "bits": bits, "k": k, "n": n, "group": group, "act_order": act})
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_all = {"cases": json.dumps(meta), "producer": "vLLM 0.33.0 _C_stable_libtorch ops on an H200"}
    try:
        from safetensors.torch import save_file
    except ImportError:  # the GPU machine may lack safetensors: a .pt the lead converts
        torch.save({"tensors": tensors, "metadata": meta_all}, out_dir / "marlin_vllm_repack.pt")
        return
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "marlin_vllm_repack.safetensors"),
              metadata=meta_all)


if __name__ == "__main__":
    main()
