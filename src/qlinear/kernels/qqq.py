"""QQQ (W4A8) kernels: ``QQQTorchLinear`` (portable Torch, exact) and ``QQQLinear`` (Triton, int8 tensor cores).

Both compute what GPTQModel's QQQ torch path computes (``layouts/qqq.py``): each input row is quantized to int8
(``s1 = dtype(max|x| / 127)``, ``xq = clamp(round(x / s1), -128, 127)``), the weight becomes int8 (grouped:
``clamp(round(c * s_group))``, per-channel: ``16 c``), the products are summed exactly in int32, and
``y = dtype(float32(acc) * s1 * s_channel)`` (+ bias, added in the activation dtype). Rounding is half to even
everywhere, as torch rounds. The int8 activations make the layer differ from a float matmul with the dequantized
weight by about 0.5-1 % (relative Frobenius error; docs/formats.md); against that exact arithmetic (float64 oracle,
tests/test_qqq_kernels.py) ``QQQTorchLinear`` is exact up to the float32 scaling (<= 1 ulp of the output dtype).

Runtime layout (``prepare()``, non-persistent buffers; ``state_dict`` stays the checkpoint layout): the codes as
int32 words ``[KP/8, N]`` (``KP`` = K rounded up to 128, padding codes 0), word row ``128 kb / 8 + r`` holding in
nibble ``j`` the code of input ``128 kb + 16 j + r``: a 128-deep K step unpacks to its 128 rows in natural order
with shifts alone. Nibbles are ``c + 8`` for both kinds (per-channel int8 weight ``16 (q - 8)``: the nibble in a
byte's high half with the top bit flipped). Group scales ``[G, N]`` and channel scales ``[N]`` un-permuted, float32.
"""

from __future__ import annotations

import torch

from ..caps import Problem, archs_from
from ..layouts import qqq
from ..layouts.qqq import QQQWeight
from ..spec import Scheme
from ..target import Target
from .base import QuantLinear
from .planned.other import QQQLinear as _DeclaredQQQ
from .planned.other import QQQTorchLinear as _DeclaredTorch

RUNTIME = ("_rt_words", "_rt_sg", "_rt_sc", "_rt_lock")
STEP = 128  # K rows per runtime block (one Triton K step)
#: Largest decoded column tile (values) of the Torch kernel: about 1 MiB of float32 while it is built.
TILE_ELEMENTS = 1 << 18


# ---------------------------------------------------------------- runtime layout and exact Torch arithmetic
def runtime_words(qw: QQQWeight) -> torch.Tensor:
    """Codes -> int32 words ``[KP/8, N]`` (module docstring)."""
    n, k = qw.codes.shape
    kp = -(-k // STEP) * STEP
    c = qw.codes.to(torch.int64)
    nib = torch.nn.functional.pad(c + 8, (0, kp - k), value=8)
    t = nib.t().reshape(kp // STEP, 8, 16, n).permute(0, 2, 1, 3)  # [kb, r, j, n]
    words = (t << (4 * torch.arange(8, device=t.device).view(1, 1, 8, 1))).sum(dim=2).reshape(kp // 8, n)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32).contiguous()


def int8_cols(words: torch.Tensor, sg: torch.Tensor | None, k: int, group_size: int) -> torch.Tensor:
    """The int8 weight ``[K, nt]`` of the runtime words ``[KP/8, nt]`` (``sg``: their float32 group scales)."""
    kp, nt = words.shape[0] * 8, words.shape[1]
    shifts = 4 * torch.arange(8, dtype=torch.int32, device=words.device).view(1, 1, 8, 1)
    nib = (words.view(kp // STEP, 16, 1, nt) >> shifts) & 0xF  # [kb, r, j, n]
    nib = nib.permute(0, 2, 1, 3).reshape(kp, nt)[:k]
    if sg is None:
        return ((nib - 8) * 16).to(torch.int8)
    v = (nib - 8).to(torch.float32).view(k // group_size, group_size, nt) * sg[:, None, :]
    return v.round_().clamp_(-128, 127).to(torch.int8).view(k, nt)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> ``(xq int8 [M, K], s1 float32 [M, 1])`` as GPTQModel's ``dynamic_quant``: the scale is
    ``max|x| / 127`` in x's dtype. An all-zero row has scale 0 and codes 0 (the reference divides 0 by 0 there)."""
    s1 = x.abs().amax(dim=-1, keepdim=True).div(127.0).to(torch.float32)
    safe = torch.where(s1 == 0, torch.ones_like(s1), s1)
    return (x / safe).round_().clamp_(-128, 127).to(torch.int8), s1


def exact_int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a [M, K] @ b [K, N]`` of int8 operands, summed exactly, as float32 (round to nearest even of the integer,
    what ``int32 -> float32`` gives): ``torch._int_mm`` where it runs, else float64 (exact below 2^53) or, where
    float64 is missing (MPS), float32 over K chunks of 512 (each partial < 2^24, exact) summed in int64."""
    dev = a.device.type
    if dev == "cpu" or (dev == "cuda" and a.shape[0] > 16 and a.shape[1] % 8 == 0 and b.shape[1] % 8 == 0):
        try:
            return torch._int_mm(a.contiguous(), b.contiguous()).to(torch.float32)
        except (RuntimeError, NotImplementedError):
            pass
    if dev != "mps":
        return (a.double() @ b.double()).to(torch.float32)
    total = torch.zeros(a.shape[0], b.shape[1], dtype=torch.int64, device=a.device)
    for k0 in range(0, a.shape[1], 512):
        total += (a[:, k0:k0 + 512].float() @ b[k0:k0 + 512].float()).to(torch.int64)
    return total.to(torch.float32)


# ---------------------------------------------------------------- the checkpoint layout, shared by both kernels
class QQQQuantLinear(QuantLinear):
    """Checkpoint buffers ``B``, ``s_channel``, ``s_group`` (+ float16 ``bias``) and the runtime derived from them."""

    raw_packing = False  # hf_pack_layer packs GPTQ/AWQ codes; QQQ weights come from load_qqq / load_affine

    def __init__(self, scheme: Scheme, bias: bool = False, dtype: torch.dtype = torch.float16) -> None:
        super().__init__(scheme, bias=bias, dtype=dtype)
        for name in RUNTIME:
            self.register_buffer(name, None, persistent=False)

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        s = problem.scheme
        return (cls.runtime_target_reasons(target) + qqq.layout_errors(s.in_features, s.out_features, s.group_size)
                + qqq.kernel_tile_errors(s.in_features, s.out_features))

    def register_checkpoint_buffers(self, bias: bool) -> None:
        for name, (shape, dtypes) in qqq.checkpoint_shapes(self.scheme).items():
            self.register_buffer(name, torch.zeros(shape, dtype=dtypes[0]))
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=torch.float16) if bias else None)

    def _load_from_state_dict(self, state_dict: dict[str, object], prefix: str, *args: object,
                              **kwargs: object) -> None:
        # GPTQModel writes a per-channel layer's empty s_group for some modules and not for others.
        if self.scheme.channelwise and prefix + "s_group" not in state_dict:
            state_dict[prefix + "s_group"] = torch.empty(0, dtype=torch.float16)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def load_qqq(self, qw: QQQWeight, bias: torch.Tensor | None = None) -> None:
        """Encode ``qw`` into the checkpoint buffers, bit-exactly as GPTQModel writes them."""
        s = self.scheme
        if (qw.out_features, qw.in_features, qw.group_size) != (s.out_features, s.in_features, s.group_size):
            raise ValueError(f"weight: expected [{s.out_features}, {s.in_features}] group size {s.group_size} for this "
                             f"layer, got [{qw.out_features}, {qw.in_features}] group size {qw.group_size}")
        self.write_checkpoint(qqq.pack(qw), bias)

    def load_affine(self, q: object, bias: torch.Tensor | None = None) -> None:
        """A symmetric 4-bit channelwise AffineWeight (zero 8) as per-channel QQQ; grouped QQQ needs ``load_qqq``."""
        self.check_fits(q)  # type: ignore[arg-type]
        self.load_qqq(qqq.from_affine(q), bias)  # type: ignore[arg-type]

    def qqq_weight(self, on_device: bool = False) -> QQQWeight:
        """The canonical QQQ form of the checkpoint buffers (validated), on the CPU or (``on_device``) theirs."""
        t = {n: getattr(self, n) if on_device else getattr(self, n).cpu() for n in ("B", "s_channel", "s_group")}
        return qqq.unpack(t, self.in_features)

    def affine(self) -> object:
        return qqq.to_affine(self.qqq_weight())

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.qqq_weight().dequantize(dtype).to(self.B.device)

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        return [self.B, self.s_channel, self.s_group, self.bias]

    def prepare(self) -> None:
        """Derive the runtime words and float32 scales (module docstring) on the buffers' device."""
        qw = self.qqq_weight(on_device=True)
        self._rt_words = runtime_words(qw)
        self._rt_sg = qw.group_scales.t().float().contiguous() if qw.grouped else None
        self._rt_sc = qw.channel_scales.float().contiguous()
        super().prepare()

    def _flat(self, x: torch.Tensor, device_type: str | None = None) -> torch.Tensor:
        self.check_input(x, device_type)
        self.ensure_prepared()
        return x.reshape(-1, self.in_features)


class QQQTorchLinear(QQQQuantLinear):
    """QQQ on any device in plain Torch: int8 activations, int8 weights decoded per column tile, exact int sums."""

    backend = _DeclaredTorch.backend
    caps = _DeclaredTorch.caps

    def tile_cols(self) -> int:
        return max(64, TILE_ELEMENTS // self.in_features // 64 * 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, k, gs = self.out_features, self.in_features, self.scheme.group_size
        x2 = self._flat(x)
        xq, s1 = quantize_per_token(x2)
        y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
        step = self.tile_cols()
        for n0 in range(0, n, step):
            n1 = min(n, n0 + step)
            sg = None if self._rt_sg is None else self._rt_sg[:, n0:n1]
            acc = exact_int8_matmul(xq, int8_cols(self._rt_words[:, n0:n1], sg, k, gs))
            y[:, n0:n1] = (acc * s1 * self._rt_sc[n0:n1]).to(x.dtype)
        if self.bias is not None:
            y += self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], n)


class QQQLinear(QQQQuantLinear):
    """QQQ on CUDA through Triton (``triton/qqq_mm.py``): per-token int8 activations; up to 4 rows a CUDA-core GEMV,
    above that the int8 weight written once per forward (transient) and multiplied on int8 tensor cores (``tl.dot``
    int8 -> int32). Bit-identical to QQQTorchLinear (H200, benchmarks/gpu_qqq.py)."""

    backend = _DeclaredQQQ.backend
    caps = _DeclaredQQQ.caps.but(requires_modules={"triton": "triton>=3.4"}, gpu_archs=archs_from((8, 0)))

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        return ("inputs quantized to int8 per token; M <= 4: CUDA-core GEMV on the packed words; above: the int8 "
                "weight written once per call, then int8 x int8 tl.dot with int32 accumulation")

    def prepare(self) -> None:
        super().prepare()
        # split-K tile counters (every launch leaves them at zero): split-K runs only for M <= 64, tiles >= 16 x 64
        self._rt_lock = torch.zeros(4 * -(-self.out_features // 64), dtype=torch.int32, device=self.B.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .triton import qqq_mm

        x2 = self._flat(x, "cuda").contiguous()
        bias = None if self.bias is None else self.bias.to(x.dtype)
        gs = self.scheme.group_size if self._rt_sg is not None else 0
        y = qqq_mm.qqq_linear(x2, self._rt_words, self._rt_sg, self._rt_sc, bias, gs, lock=self._rt_lock)
        return y.reshape(*x.shape[:-1], self.out_features)


KERNELS = (QQQLinear, QQQTorchLinear)
