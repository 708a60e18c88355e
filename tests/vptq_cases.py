"""Random VPTQ layers for the VPTQ tests (not a test module): random codes and codebooks are valid layers.

``make_case`` returns the case's description (JSON-able, also what the producer scripts read) and its tensors
with the codes unpacked (``idx``/``res`` ``[G, J, gs]``, ``oidx`` ``[1, Jo, os]``, ``perm`` ``[K]``, int64).
"""

from __future__ import annotations

import torch


def make_case(name: str, *, k: int, n: int, v: int, c: int, r: int = -1, gs: int | None = None, os: int = 0,
              vo: int = -1, co: int = -1, norm: bool = False, norm_dim: int = 0, perm: bool = False,
              dtype: torch.dtype = torch.float16, bias: bool = False, m: int = 3,
              seed: int = 0) -> tuple[dict, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    gs = k - os if gs is None else gs
    g = -(-(k - os) // gs)
    j = -(-n // v)
    meta = dict(name=name, K=k, N=n, v=v, C=c, R=r, G=g, gs=gs, os=os, vo=vo, Co=co, norm=norm, norm_dim=norm_dim,
                perm=perm, dtype=str(dtype).removeprefix("torch."), npercent=100.0 * os / k)
    t = {"idx": torch.randint(0, c, (g, j, gs), generator=gen),
         "centroids": torch.randn(g, c * v, generator=gen).to(dtype)}
    if r > 0:
        t["res"] = torch.randint(0, r, (g, j, gs), generator=gen)
        t["rcentroids"] = (torch.randn(g, r * v, generator=gen) * 0.1).to(dtype)
    if os:
        t["oidx"] = torch.randint(0, co, (1, -(-n // vo), os), generator=gen)
        t["ocentroids"] = (torch.randn(1, co * vo, generator=gen) * 3).to(dtype)
    if perm:
        t["perm"] = torch.randperm(k, generator=gen)
    if norm:
        size = k if norm_dim == 0 else n
        t["scale"] = (torch.rand(size, generator=gen) + 0.5).to(dtype)
        t["shift"] = (torch.randn(size, generator=gen) * 0.1).to(dtype)
    if bias:
        t["bias"] = torch.randn(n, generator=gen).to(dtype)
    t["x"] = torch.randn(m, k, generator=gen).to(dtype)
    return meta, t


def params(meta: dict, aux_dtype: torch.dtype = torch.int16):
    """The case's ``VptqParams``."""
    from qlinear.layouts.vptq import VptqParams

    return VptqParams(vector_len=meta["v"], num_centroids=meta["C"], group_num=meta["G"], group_size=meta["gs"],
                      num_res_centroids=meta["R"], outlier_size=meta["os"], outlier_vector_len=meta["vo"],
                      outlier_num_centroids=meta["Co"], enable_norm=meta["norm"], norm_dim=meta["norm_dim"],
                      enable_perm=meta["perm"], codebook_dtype=getattr(torch, meta["dtype"]), aux_dtype=aux_dtype)


def scheme(meta: dict, aux_dtype: torch.dtype = torch.int16):
    from qlinear.spec import Scheme

    p = params(meta, aux_dtype)
    return Scheme(bits=p.nominal_bits(), group_size=-1, in_features=meta["K"], out_features=meta["N"],
                  method="vptq", format="vptq", layout_params=p)


def checkpoint_tensors(meta: dict, t: dict[str, torch.Tensor], packed: torch.Tensor,
                       aux_dtype: torch.dtype = torch.int16) -> dict[str, torch.Tensor]:
    """The case as a module's checkpoint tensors (names as VPTQ / GPTQModel store them), ``packed`` the codes."""
    def aux(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.int32).to(torch.int16) if aux_dtype == torch.int16 else x.to(aux_dtype)

    out = {"indices": packed, "centroids.weight": t["centroids"]}
    if "rcentroids" in t:
        out["res_centroids.weight"] = t["rcentroids"]
    if "oidx" in t:
        out["outlier_centroids.weight"] = t["ocentroids"]
        out["outlier_indices"] = aux(t["oidx"])
    if "perm" in t:
        out["perm"] = aux(t["perm"])
    if "scale" in t:
        out["weight_scale"], out["weight_bias"] = t["scale"], t["shift"]
    return out
