"""Resident bytes of an EXL2 layer on CPU: the file's tensors against what ``Exl2CpuLinear`` keeps once prepared.

    python benchmarks/exl2_resident.py [--shape 4096x14336]

Builds the ~3.9-bit mix of ``cpu_formats.py``, runs one forward and counts every tensor the layer holds (its
buffers and the int4 runtime's tensors), in MiB and bits a weight.
"""

from __future__ import annotations

import argparse

import torch


def mib(tensors: list[torch.Tensor | None]) -> float:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None) / 2**20


def main(argv: list[str] | None = None) -> None:
    from cpu_formats import exl2_parts

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4096x14336")
    args = p.parse_args(argv)
    k, n = (int(v) for v in args.shape.split("x"))
    layer = exl2_parts(k, n, torch.Generator().manual_seed(0))
    file = mib(list(layer.tensors().values()))
    with torch.no_grad():
        layer(torch.zeros(1, k, dtype=torch.bfloat16))
    rt = layer._parts[0].rt
    rows = {"codes": [rt.packed], "scale/offset pairs": [rt.scales_zeros],
            "rows read": [part.rows for part in layer._parts], "file tensors kept": list(layer.buffers())}
    assert not set(map(id, rt.tensors())) - {id(t) for ts in rows.values() for t in ts}  # every runtime tensor
    bits = 8 * 2**20 / (k * n)
    print(f"EXL2 {k}x{n}: file {file:.1f} MiB ({file * bits:.2f} bits/weight); q_weight replaced: "
          f"{layer.weight_replaced}")
    print("| resident | MiB | bits/weight |\n|---|---:|---:|")
    for name, ts in rows.items():
        print(f"| {name} | {mib(ts):.1f} | {mib(ts) * bits:.2f} |")
    total = sum(mib(ts) for ts in rows.values())
    print(f"| total | {total:.1f} | {total * bits:.2f} |")


if __name__ == "__main__":
    main()
