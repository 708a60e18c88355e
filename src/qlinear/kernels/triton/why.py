"""Why a Triton layer runs the variant it runs for M rows, and why each other variant does not.

The choice itself is ``configs.choose``; this module re-traces it in words from the same data (the shipped
table's timings and crossovers, the layer's own reasons a variant cannot run), so a user can see which
kernel a call gets and on what evidence: a side-by-side timing, a crossover, or the heuristic.
"""

from __future__ import annotations

from . import configs


def _limits(device: str, bits: int) -> dict[str, int]:
    cross = configs.device_table(device).get("crossovers", {})
    found = cross.get(str(bits)) or cross.get("default") or configs.DEFAULT_CROSSOVERS
    return {v: int(limit) for v, limit in found.items()}


def _timings(device: str, m: int, n: int, k: int, bits: int, group: int) -> dict[str, float]:
    table = configs.device_table(device).get("configs", {})
    out = {}
    for v in configs.VARIANTS:
        entry = table.get(configs.table_key(v, m, n, k, bits, group))
        if entry and "us" in entry:
            out[v] = float(entry["us"])
    return out


def explain_choice(device: str, sms: int, m: int, n: int, k: int, kp: int, bits: int, group: int,
                   unfit: dict[str, str]) -> list[str]:
    """Lines: the chosen variant and its launch config (legalised for the padded K ``kp``, as the layer runs
    it) with the evidence for both, then one line per other variant.

    ``unfit`` maps each variant this layer, dtype or device cannot run to the reason (the layer's own)."""
    exclude = tuple(unfit)
    chosen = configs.choose(device, sms, m, n, k, bits, group, exclude=exclude)
    cfg = configs.legal(chosen, m, kp, bits)
    bucket = configs.m_bucket(m)
    timed = {v: us for v, us in _timings(device, m, n, k, bits, group).items() if v not in exclude}
    limits = _limits(device, bits)
    table = configs.device_table(device).get("configs", {})
    key = configs.table_key(cfg.variant, m, n, k, bits, group)
    if len(timed) >= 2:
        times = ", ".join(f"{v} {us:.1f} us" for v, us in sorted(timed.items(), key=lambda t: t[1]))
        source = configs.table_device(device)
        whose = source if source == device else f"{source} (whose table this {device} uses)"
        evidence = f"fastest of the variants the {whose} table timed side by side for this shape ({times})"
    elif cfg.variant == "dense":
        evidence = f"no variant's crossover covers M bucket {bucket}: dequantize + cuBLAS"
    else:
        evidence = f"crossover: {cfg.variant} serves M buckets <= {limits[cfg.variant]} ({bucket} here)"
    if key in table:
        source = f"table entry {key}"
    elif any(e.startswith(cfg.variant + ":") and e.split(":", 2)[2] == key.split(":", 2)[2] for e in table):
        source = "the table's entry for the nearest M bucket of this shape"
    else:
        source = "heuristic (no table entry for this shape)"
    lines = [f"M={m}: {cfg.variant} — {evidence}; config from {source}: "
             f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}, split-K {cfg.split_k}, {cfg.num_warps} warps"]
    order = [v for v in configs.VARIANTS if v != "dense"]
    taken_by = {v: next((u for u in order[:order.index(v)] if u in limits and bucket <= limits[u]
                         and u not in exclude), None) for v in order}
    for v in configs.VARIANTS:
        if v == cfg.variant:
            continue
        if v in unfit:
            why = unfit[v]
        elif v in timed:
            why = f"timed slower for this shape ({timed[v]:.1f} us)"
        elif v == "dense":
            why = f"a crossover covers M bucket {bucket}"
        elif v not in limits:
            why = "not in the crossovers (runs only when asked for by name)"
        elif bucket > limits[v]:
            why = f"serves M buckets <= {limits[v]}"
        elif taken_by[v]:
            why = f"{taken_by[v]} comes first in the crossovers for this M"
        else:
            why = "not timed for this shape; the table's timing picked another"
        lines.append(f"  {v}: {why}")
    return lines
