"""Pack deterministic GPTQ cases with the reference GPTQModel 7.7.0 and save them as test vectors.

Run under the reference virtualenv (see requirements/gptqmodel-crosscheck.txt), not the project's::

    python tests/external/gptqmodel_pack_vectors.py OUT.safetensors [--check-block]

Every case packs a fake-quantized weight ``W = s * (q - z)`` (plus a variant) with
``TorchLinear.pack_original`` (the default path of ``hf_pack_layer``). Tensors are stored as ``<case>/<name>``:

inputs   ``weight [N, K]`` (the dtype handed to the packer), ``scales [N, G]`` (packer contract: out x groups),
         ``zeros [N, G]`` int32 (true zeros; symmetric ones synthesised as 2**(bits-1) like ``hf_pack_layer``),
         ``g_idx [K]`` int32, ``bias [N]`` (some cases)
outputs  ``out.qweight``, ``out.qzeros`` (raw packer output = true zeros, i.e. v2 values), ``out.scales [G, N]``
         float16, ``out.g_idx``, ``out.bias``; format ``gptq`` also ``out.qzeros_v1`` (after GPTQModel's
         ``convert_gptq_v2_to_v1_format_module``, the export step of ``pack_module``); format ``gptq_p`` also
         ``planar.rows`` = ``planar_pack_rows(codes)`` and ``planar.cols`` = ``planar_pack_cols(zeros.T)``.
``codes [K, N]`` int32 are the generator's codes q; the packer derives its own from ``weight``, which equal q only
for variant ``exact`` (``noisy``/``ties``/``clamp`` perturb the weight to exercise rounding and clamping).
Per-case parameters are in the safetensors metadata key ``cases`` (JSON list).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

DTYPES = {name: getattr(torch, name) for name in ("int8", "int16", "int32", "float16", "bfloat16", "float32")}
KEYS = ("desc", "sym", "pack", "fmt", "variant", "wdt", "sdt", "bias")
NAMES = ("desc_act", "sym", "pack_dtype", "format", "variant", "weight_dtype", "scales_dtype", "bias")


def case_list() -> list[dict]:
    cases = []

    def add(bits, k, n, gs, desc=False, sym=False, pack="int32", fmt="gptq", variant="exact", wdt="float16", **kw):
        values = dict(desc=desc, sym=sym, pack=pack, fmt=fmt, variant=variant, wdt=wdt, sdt="float32", bias=False)
        values.update(kw)
        case = {"bits": bits, "in_features": k, "out_features": n, "group_size": gs}
        cases.append(case | {name: values[key] for key, name in zip(KEYS, NAMES, strict=True)})

    # Full grid over bits x group size x act-order x symmetry, int32 words (the only width 3-bit packs with).
    for bits in (2, 3, 4, 8):
        for gs in (-1, 32, 128):
            for desc in (False, True):
                for sym in (False, True):
                    add(bits, 256, 32, gs, desc=desc, sym=sym, variant="noisy" if desc else "exact")
    # Narrow words (TorchLinear allows int8/int16; 3-bit packing fails with them, see docs/reference-notes.md).
    for bits in (2, 4, 8):
        for pack in ("int8", "int16"):
            add(bits, 128, 32, 32, pack=pack, desc=True)
            add(bits, 100, 40, -1, pack=pack, sym=True, variant="noisy")
    # Odd shapes: partial words/groups (2/4/8 only; 3-bit needs K and N multiples of 32), gs > K, bias.
    for bits in (2, 4, 8):
        add(bits, 100, 40, 32, desc=True, bias=True)
        add(bits, 72, 24, 128, variant="noisy")
        add(bits, 200, 48, 64, desc=True, sym=True)
    add(3, 96, 32, 128, bias=True)
    add(3, 160, 96, 32, desc=True, variant="noisy")
    # Rounding: power-of-two scales with exact .5 ties (round half to even) and out-of-range values (clamp).
    for bits in (2, 3, 4, 8):
        add(bits, 128, 64, 32, variant="ties", wdt="float32")
        add(bits, 128, 64, 32, desc=True, variant="clamp")
    # Precision: bfloat16 / float32 weights, float16 scales (the packer then computes in float16).
    for bits in (3, 4, 8):
        add(bits, 128, 64, 32, variant="noisy", wdt="bfloat16")
        add(bits, 128, 64, 32, variant="noisy", wdt="float32")
        add(bits, 128, 64, 32, variant="noisy", sdt="float16")
    # Planar gptq_p, 2..8 bits (5/6/7 exist only planar; 2/4/8 are bit-identical to the continuous layout).
    for bits in range(2, 9):
        for gs, desc, sym in ((32, False, False), (-1, False, True), (64, True, False)):
            add(bits, 128, 64, gs, desc=desc, sym=sym, fmt="gptq_p")
    for i, c in enumerate(cases):
        c["name"] = f"c{i:03d}_{c['format']}_b{c['bits']}_{c['pack_dtype']}_k{c['in_features']}_n{c['out_features']}"
    return cases


def make_inputs(c: dict, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    bits, k, n = c["bits"], c["in_features"], c["out_features"]
    gsz = k if c["group_size"] == -1 else c["group_size"]
    groups, maxq = -(-k // gsz), 2**bits - 1
    q = torch.randint(0, maxq + 1, (n, k), generator=gen)
    z = torch.randint(0, maxq + 1, (n, groups), generator=gen)
    if c["sym"]:
        z = torch.full((n, groups), 2 ** (bits - 1))
    if c["variant"] == "ties":
        s = 2.0 ** -torch.randint(3, 8, (n, groups), generator=gen).float()
    else:
        s = torch.rand(n, groups, generator=gen) * 0.02 + 0.001
    g_idx = torch.arange(k) // gsz
    if c["desc_act"]:  # stored g_idx = (arange(K)//gs)[invperm] for a processing order perm
        g_idx = g_idx[torch.argsort(torch.randperm(k, generator=gen))]
    codes = (q - z[:, g_idx]).double()
    if c["variant"] == "noisy":
        codes += torch.rand(n, k, generator=gen).double() * 0.9 - 0.45
    elif c["variant"] == "ties":
        codes += torch.where(torch.rand(n, k, generator=gen) < 0.5, -0.5, 0.5).double()
    elif c["variant"] == "clamp":
        codes += torch.rand(n, k, generator=gen).double() * 6 - 3
    weight = (s.double()[:, g_idx] * codes).to(DTYPES[c["weight_dtype"]])
    out = dict(weight=weight, scales=s.to(DTYPES[c["scales_dtype"]]), zeros=z.to(torch.int32))
    out.update(g_idx=g_idx.to(torch.int32), codes=q.T.contiguous().to(torch.int32))
    if c["bias"]:
        out["bias"] = (torch.rand(n, generator=gen) - 0.5).to(DTYPES[c["weight_dtype"]])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="output .safetensors path")
    parser.add_argument(
        "--check-block",
        action="store_true",
        help="also run pack_block where it applies (int32 words, K and N multiples of 32) and compare",
    )
    args = parser.parse_args()
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")

    import gptqmodel
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.quantization import FORMAT, QuantizeConfig
    from gptqmodel.utils.model import convert_gptq_v2_to_v1_format_module
    from gptqmodel.utils.planar_packing import planar_pack_cols, planar_pack_rows
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    failures = 0
    cases = case_list()
    for seed, c in enumerate(cases):
        x = make_inputs(c, seed)
        k, n = c["in_features"], c["out_features"]
        linear = torch.nn.Linear(k, n, bias=c["bias"], dtype=x["weight"].dtype)
        linear.weight.data = x["weight"]
        if c["bias"]:
            linear.bias.data = x["bias"]

        def new_module(c=c):
            return TorchLinear(
                bits=c["bits"],
                group_size=c["group_size"],
                sym=c["sym"],
                desc_act=c["desc_act"],
                in_features=c["in_features"],
                out_features=c["out_features"],
                bias=c["bias"],
                pack_dtype=DTYPES[c["pack_dtype"]],
                format=FORMAT.GPTQ_P if c["format"] == "gptq_p" else None,
            )

        module = new_module()
        module.pack_original(linear, x["scales"], x["zeros"], x["g_idx"])
        out = {"qweight": module.qweight, "qzeros": module.qzeros, "scales": module.scales, "g_idx": module.g_idx}
        if c["bias"]:
            out["bias"] = module.bias
        out = {key: value.detach().clone().contiguous() for key, value in out.items()}
        if args.check_block and c["pack_dtype"] == "int32" and k % 32 == 0 and n % 32 == 0:
            other = new_module()
            other.pack_block(linear, x["scales"], x["zeros"], x["g_idx"])
            diff = [key for key in ("qweight", "qzeros", "scales") if not torch.equal(getattr(other, key), out[key])]
            # float16 scales: pack_original computes in float16, the C++ pack_block_cpu op in float32.
            if diff:
                print(f"{c['name']}: pack_block differs in {diff} (scales {c['scales_dtype']})", file=sys.stderr)
                failures += c["scales_dtype"] == "float32"
        if c["format"] == "gptq":
            module.qzero_format(format=2)
            convert_gptq_v2_to_v1_format_module(module, QuantizeConfig(bits=c["bits"], offload_to_disk=False))
            out["qzeros_v1"] = module.qzeros.detach().clone()
        else:
            out["planar.rows"] = planar_pack_rows(x["codes"], c["bits"])
            out["planar.cols"] = planar_pack_cols(x["zeros"].T.contiguous(), c["bits"])
        for key in ("weight", "scales", "zeros", "g_idx", "codes", "bias"):
            if key in x:
                tensors[f"{c['name']}/{key}"] = x[key].contiguous()
        for key, value in out.items():
            tensors[f"{c['name']}/{key if key.startswith('planar') else 'out.' + key}"] = value
    meta = {
        "cases": json.dumps(cases),
        "gptqmodel": gptqmodel.__version__,
        "torch": torch.__version__,
        "packer": "TorchLinear.pack_original",
    }
    save_file(tensors, args.out, metadata=meta)
    print(f"wrote {len(cases)} cases, {len(tensors)} tensors to {args.out}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
