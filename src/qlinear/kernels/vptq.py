"""VPTQ kernels: ``VPTQLinear`` (exact Torch, any device) and ``VPTQCudaLinear`` (Triton on CUDA).

Both keep the checkpoint tensors as stored (``layouts/vptq.py``; codebooks as ``centroids.weight`` etc. in child
modules, so ``state_dict`` names match VPTQ's and GPTQModel's) and decode per forward: the Torch kernel a few output
rows at a time exactly as the producers dequantize (no dense weight outlives a tile); the Triton kernel gathers
codebook vectors inside a GEMV for small M, and above that decodes the weight once per call for one matmul.
The decoded weight is rounded to the activation dtype before the product, as both producers do.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..caps import Problem, archs_from
from ..layouts import vptq
from ..target import Target
from .planned.other import VPTQCudaLinear as _DeclaredCuda
from .planned.other import VPTQLinear as _DeclaredTorch
from .stored_base import StoredTensorsLinear

#: Largest decoded row tile (values) of the Torch kernel.
TILE_ELEMENTS = 1 << 20
TABLES = ("centroids", "res_centroids", "outlier_centroids")
AUX = ("indices", "outlier_indices", "perm", "weight_scale", "weight_bias")
RUNTIME = ("_rt_inv", "_rt_perm", "_rt_scale", "_rt_bias")


class _Table(nn.Module):
    """A codebook held as ``weight`` (VPTQ stores its codebooks as ``nn.Embedding`` weights)."""

    def __init__(self, rows: int, cols: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("weight", torch.zeros(rows, cols, dtype=dtype))


class VPTQQuantLinear(StoredTensorsLinear):
    """The VPTQ checkpoint buffers, their validation and the exact row decode both kernels share."""

    RUNTIME = RUNTIME
    FORM = "VPTQ weights are codebook vectors"

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        s = problem.scheme
        if not isinstance(s.layout_params, vptq.VptqParams):
            return ["a VPTQ layer needs its VptqParams (Scheme.layout_params)"]
        return cls.runtime_target_reasons(target) + vptq.shape_errors(s.layout_params, s.in_features,
                                                                      s.out_features)

    @property
    def params(self) -> vptq.VptqParams:
        return vptq.params_of(self.scheme)

    def register_checkpoint_buffers(self, bias: bool) -> None:
        for name, (shape, dtypes) in vptq.checkpoint_shapes(self.scheme).items():
            if name.endswith(".weight"):
                self.add_module(name.removesuffix(".weight"), _Table(*shape, dtypes[0]))
            else:
                self.register_buffer(name, torch.zeros(shape, dtype=dtypes[0]))
        cd = self.params.codebook_dtype
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=cd) if bias else None)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The checkpoint tensors by their checkpoint names (bias excluded)."""
        out = {f"{n}.weight": getattr(self, n).weight for n in TABLES if hasattr(self, n)}
        out.update({n: getattr(self, n) for n in AUX if isinstance(getattr(self, n, None), torch.Tensor)})
        return out

    def validate_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        vptq.validate(tensors, self.scheme)

    load_vptq = StoredTensorsLinear.load_tensors

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The dense weight ``[N, K]``, in the codebook dtype unless ``dtype`` is given."""
        w = vptq.dequantize(self.tensors(), self.scheme)
        return w if dtype is None else w.to(dtype)

    def prepare(self) -> None:
        """Validate the tensors; keep the inverse permutation and the norm in decoded-column order."""
        t, p = self.tensors(), self.params
        vptq.validate(t, self.scheme)
        self._rt_inv = self._rt_perm = self._rt_scale = self._rt_bias = None
        if p.enable_perm:
            self._rt_perm = vptq.as_index(t["perm"])
            self._rt_inv = self._rt_perm.argsort()
        if p.enable_norm and p.norm_dim == 0:
            s, b = t["weight_scale"], t["weight_bias"]
            if self._rt_perm is not None:
                s, b = s[self._rt_perm], b[self._rt_perm]
            self._rt_scale, self._rt_bias = s.contiguous(), b.contiguous()
        super().prepare()

    def decode_rows(self, n0: int, n1: int, dtype: torch.dtype) -> torch.Tensor:
        return vptq.decode_rows(self.tensors(), self.scheme, n0, n1, self._rt_inv).to(dtype)

    def tile_rows(self) -> int:
        p = self.params
        step = math.lcm(p.vector_len, p.outlier_vector_len if p.outlier else 1)
        return max(step, TILE_ELEMENTS // self.in_features // step * step)

    def _outlier_cols(self, dtype: torch.dtype, compute: torch.dtype | None = None) -> torch.Tensor:
        """The outlier columns ``[N, outlier_size]`` in decoded order, normed, in ``dtype``: the norm in the codebook
        dtype as the producers apply it (Torch), or in ``compute`` when given."""
        p, t = self.params, self.tensors()
        vo, os_ = p.outlier_vector_len, p.outlier_size
        oi = vptq.as_index(t["outlier_indices"][0])
        w = t["outlier_centroids.weight"].reshape(-1, vo)[oi].permute(0, 2, 1).reshape(-1, os_)[:self.out_features]
        if compute is not None:
            w = w.to(compute)
        if self._rt_scale is not None:
            w = w * self._rt_scale[:os_].to(w.dtype) + self._rt_bias[:os_].to(w.dtype)
        return w.to(dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, {vptq.describe(self.scheme)}, "
                f"backend={self.backend.value}")


class VPTQLinear(VPTQQuantLinear):
    """VPTQ on any device in plain Torch: row tiles decoded exactly as VPTQ / GPTQModel dequantize, multiplied in.

    Each tile is one ``F.linear`` with its slice of the bias, the producers' own call on the whole weight, so a
    layer of one tile gives their output bit for bit."""

    backend = _DeclaredTorch.backend
    caps = _DeclaredTorch.caps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.out_features
        self.check_input(x)
        self.ensure_prepared()
        x2 = x.reshape(-1, self.in_features)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
        step = self.tile_rows()
        for n0 in range(0, n, step):
            n1 = min(n, n0 + step)
            y[:, n0:n1] = F.linear(x2, self.decode_rows(n0, n1, x.dtype), None if bias is None else bias[n0:n1])
        return y.reshape(*x.shape[:-1], n)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        s = problem.scheme
        if not isinstance(s.layout_params, vptq.VptqParams):
            return ""
        return (f"{vptq.describe(s)}: output rows decoded exactly as VPTQ dequantizes, in tiles of about "
                f"{TILE_ELEMENTS} values, each one F.linear (no dense weight kept)")


class VPTQCudaLinear(VPTQQuantLinear):
    """VPTQ on CUDA through Triton (``triton/vptq_mv.py``): M = 1 a split-K GEMV gathering codebook vectors
    from the packed codes, M <= 16 the same decoded tiles on tensor cores; above, the weight decoded once per call,
    then one matmul. Outlier columns (a few percent of K) are decoded by the Torch path and multiplied in beside
    it."""

    backend = _DeclaredCuda.backend
    # The vptq package's own CUDA extension is not used (the Triton kernel replaces it), so the declaration's
    # requires_modules={"vptq": "vptq"} becomes triton; everything else is the reference's declaration.
    caps = _DeclaredCuda.caps.but(requires_modules={"triton": "triton>=3.4"}, gpu_archs=archs_from((8, 0)))

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        return ("M = 1: Triton split-K GEMV decoding the packed codes through the codebooks in registers; M <= 16: "
                "the decoded tiles times the activations on tensor cores; above: the weight decoded once per call "
                "by a Triton kernel (transient), then one matmul")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x, "cuda")
        self.ensure_prepared()
        y = self.product(x.reshape(-1, self.in_features))
        return y.reshape(*x.shape[:-1], self.out_features)

    def product(self, x2: torch.Tensor, path: str | None = None) -> torch.Tensor:
        """``x2 [M, K] @ W.T + bias`` through the Triton kernels (``path``: force "gemv", "mma" or "dense"; the
        CPU interpreter runs this too)."""
        from .triton import vptq_mv

        p, n = self.params, self.out_features
        if p.enable_norm and p.norm_dim == 1:
            raise ValueError("VPTQCudaLinear: norm_dim=1 (GPTQModel per-output norm) runs on VPTQLinear only")
        xp = x2 if self._rt_perm is None else x2[:, self._rt_perm]
        os_ = p.outlier_size if p.outlier else 0
        t = self.tensors()
        y = vptq_mv.vptq_main(xp[:, os_:].contiguous(), t["indices"], t["centroids.weight"],
                              t.get("res_centroids.weight"),
                              None if self._rt_scale is None else self._rt_scale[os_:],
                              None if self._rt_bias is None else self._rt_bias[os_:], p, n, force=path)
        if os_:
            y += xp[:, :os_].float() @ self._outlier_cols(x2.dtype).float().t()
        y = y.to(x2.dtype)
        if self.bias is not None:
            y += self.bias.to(x2.dtype)
        return y

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        out = super().runtime_reasons(problem, target)
        p = problem.scheme.layout_params
        if isinstance(p, vptq.VptqParams) and p.enable_norm and p.norm_dim == 1:
            out.append("norm_dim=1 (per output channel norm, GPTQModel only): VPTQLinear runs it")
        return out


KERNELS = (VPTQCudaLinear, VPTQLinear)
