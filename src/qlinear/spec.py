"""What the numbers mean: a model's quantization config and one layer's resolved scheme.

``QuantizeConfig`` is what a checkpoint says for the whole model (``group_size=-1`` kept as written,
since that is what is saved). ``Scheme`` is one layer: the config plus the layer's shape, with the
group size resolved to a length once, at construction, so no code downstream tests for ``-1``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .activations import ActQuant
from .config_json import ConfigError, config_bool, config_int, load_mapping
from .enums import FORMAT, METHOD
from .floats import Element
from .ggml_types import GEOMETRY, ggml_type

PACK_DTYPES: Mapping[str, torch.dtype] = {
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
}

GPTQ_FORMATS = frozenset({FORMAT.GPTQ, FORMAT.GPTQ_V2, FORMAT.GPTQ_P, FORMAT.MARLIN, FORMAT.BITBLAS})
AWQ_FORMATS = frozenset({FORMAT.GEMM, FORMAT.GEMV, FORMAT.GEMV_FAST, FORMAT.LLM_AWQ, FORMAT.MARLIN, FORMAT.BITBLAS})
METHOD_FORMATS: Mapping[METHOD, frozenset[FORMAT]] = {
    METHOD.GPTQ: GPTQ_FORMATS,
    METHOD.AWQ: AWQ_FORMATS,
    METHOD.QQQ: frozenset({FORMAT.QQQ}),
    METHOD.GGUF: frozenset({FORMAT.GGUF}),
    METHOD.FP8: frozenset({FORMAT.FP8, FORMAT.HF_FP8}),
    METHOD.BITSANDBYTES: frozenset({FORMAT.BITSANDBYTES}),
    METHOD.VPTQ: frozenset({FORMAT.VPTQ}),
    METHOD.PAROQUANT: frozenset({FORMAT.PAROQUANT}),
    METHOD.EXL3: frozenset({FORMAT.EXL3}),
    METHOD.EXL2: frozenset({FORMAT.EXL2}),
    METHOD.MLX: frozenset({FORMAT.MLX}),
    METHOD.COMPRESSED_TENSORS: frozenset({FORMAT.PACK_QUANTIZED, FORMAT.NAIVE_QUANTIZED, FORMAT.INT_QUANTIZED,
                                          FORMAT.FLOAT_QUANTIZED, FORMAT.NVFP4_PACK_QUANTIZED,
                                          FORMAT.MXFP4_PACK_QUANTIZED}),
}
DEFAULT_FORMAT: Mapping[METHOD, FORMAT] = {
    METHOD.GPTQ: FORMAT.GPTQ,
    METHOD.AWQ: FORMAT.GEMM,
    METHOD.FP8: FORMAT.FP8,
}
#: Formats whose codes are small floats (``Scheme.element`` names which), and those that may hold either.
FLOAT_FORMATS = frozenset({FORMAT.FP8, FORMAT.HF_FP8, FORMAT.FLOAT_QUANTIZED, FORMAT.NVFP4_PACK_QUANTIZED,
                           FORMAT.MXFP4_PACK_QUANTIZED})
EITHER_FORMATS = frozenset({FORMAT.NAIVE_QUANTIZED})
#: Formats whose checkpoints store int16 words (AWQ GEMV_FAST's interleaved nibbles); the rest default to int32.
INT16_FORMATS = frozenset({FORMAT.GEMV_FAST, FORMAT.LLM_AWQ})
#: Bits each AWQ layout can hold: GEMM words carry 32/b fields (2, 4, 8); the GEMV layouts are nibbles only.
AWQ_LAYOUT_BITS: Mapping[FORMAT, tuple[int, ...]] = {
    FORMAT.GEMM: (2, 4, 8), FORMAT.GEMV: (4,), FORMAT.GEMV_FAST: (4,), FORMAT.LLM_AWQ: (4,),
}


def pack_dtype_of(value: str | torch.dtype) -> torch.dtype:
    """Parse a pack word dtype given as ``"int32"``, ``"torch.int32"`` or ``torch.int32``."""
    if isinstance(value, torch.dtype):
        if value in PACK_DTYPES.values():
            return value
    elif isinstance(value, str):
        name = value.strip().lower().removeprefix("torch.")
        if name in PACK_DTYPES:
            return PACK_DTYPES[name]
    raise ConfigError(f"pack_dtype must be one of {', '.join(PACK_DTYPES)}; got {value!r}")


def default_pack_dtype(fmt: FORMAT | str) -> torch.dtype:
    """The word dtype a format's checkpoints use when a config does not name one."""
    return torch.int16 if FORMAT(fmt) in INT16_FORMATS else torch.int32


def word_bits(pack_dtype: torch.dtype) -> int:
    """Bits in one storage word of ``pack_dtype``."""
    return torch.iinfo(pack_dtype).bits


def _check_integer_affine(bits: int, group_size: int, fmt: FORMAT, method: METHOD,
                          desc_act: bool, pack_dtype: torch.dtype) -> None:
    if not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ConfigError(f"bits must be an integer in 1..8; got {bits!r}")
    if not isinstance(group_size, int) or not (group_size == -1 or group_size > 0):
        raise ConfigError(f"group_size must be -1 (one group per row) or a positive length; got {group_size!r}")
    if fmt not in METHOD_FORMATS.get(method, frozenset()):
        allowed = ", ".join(sorted(f.value for f in METHOD_FORMATS.get(method, ())))
        raise ConfigError(f"checkpoint_format {fmt.value!r} is not a {method.value} format; expected one of: {allowed}")
    if method is METHOD.GPTQ:
        if fmt in (FORMAT.GPTQ, FORMAT.GPTQ_V2) and bits not in (2, 3, 4, 8):
            raise ConfigError(f"continuous GPTQ packing holds 2, 3, 4 or 8 bits; got bits={bits} "
                              "(5, 6 and 7 bits exist only as checkpoint_format='gptq_p')")
        if fmt is FORMAT.GPTQ_P and not 2 <= bits <= 8:
            raise ConfigError(f"planar GPTQ (gptq_p) holds 2..8 bits; got bits={bits}")
        if (fmt is FORMAT.GPTQ_P or bits == 3) and pack_dtype != torch.int32:
            what = "planar gptq_p" if fmt is FORMAT.GPTQ_P else "3-bit GPTQ"
            raise ConfigError(f"{what} is packed in int32 words only; got pack_dtype={pack_dtype}")
    if method is METHOD.AWQ and desc_act:
        raise ConfigError("AWQ never reorders input channels: desc_act must be False")
    if method is METHOD.AWQ and fmt in AWQ_LAYOUT_BITS and bits not in AWQ_LAYOUT_BITS[fmt]:
        allowed = ", ".join(map(str, AWQ_LAYOUT_BITS[fmt]))
        raise ConfigError(f"AWQ checkpoint_format {fmt.value!r} holds bits {allowed}; got bits={bits}")


@dataclass(frozen=True)
class QuantizeConfig:
    """A model's quantization config as a checkpoint states it."""

    bits: int = 4
    group_size: int = 128
    sym: bool = True
    desc_act: bool = False
    method: METHOD = METHOD.GPTQ
    checkpoint_format: FORMAT | None = None
    pack_dtype: torch.dtype | str | None = None  # None: the format's default word (default_pack_dtype)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        method = METHOD(self.method)
        fmt = FORMAT(self.checkpoint_format) if self.checkpoint_format is not None else DEFAULT_FORMAT.get(method)
        if fmt is None:
            raise ConfigError(f"method {method.value!r} has no default checkpoint_format; name one")
        object.__setattr__(self, "method", method)
        object.__setattr__(self, "checkpoint_format", fmt)
        pack = default_pack_dtype(fmt) if self.pack_dtype is None else self.pack_dtype
        object.__setattr__(self, "pack_dtype", pack_dtype_of(pack))
        if method in (METHOD.GPTQ, METHOD.AWQ):
            _check_integer_affine(self.bits, self.group_size, fmt, method, self.desc_act, self.pack_dtype)

    def scheme(self, in_features: int, out_features: int) -> Scheme:
        """This config resolved for one layer of shape ``[out_features, in_features]``."""
        return Scheme(bits=self.bits, group_size=self.group_size, in_features=in_features,
                      out_features=out_features, sym=self.sym, desc_act=self.desc_act, method=self.method,
                      format=self.checkpoint_format, pack_dtype=self.pack_dtype)

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``quantization_config`` dict GPTQModel writes (readable by AutoGPTQ and transformers)."""
        out: dict[str, Any] = dict(self.extra)
        out.update(bits=self.bits, group_size=self.group_size, desc_act=self.desc_act, sym=self.sym,
                   quant_method=self.method.value, checkpoint_format=self.checkpoint_format.value,
                   pack_dtype=str(self.pack_dtype).removeprefix("torch."))
        if self.method is METHOD.AWQ:
            out["zero_point"] = not self.sym
            out["version"] = self.checkpoint_format.value
        return out

    @classmethod
    def from_hf_config(cls, source: str | Path | Mapping[str, Any]) -> QuantizeConfig:
        """Read ``quantize_config.json``, a ``config.json`` with ``quantization_config``, or their dict.

        Accepts the spellings GPTQModel, AutoGPTQ, AutoAWQ and transformers write: ``bits``/``w_bit``,
        ``group_size``/``q_group_size``, ``checkpoint_format``/``format``/``version``, AWQ's
        ``zero_point`` (the opposite of ``sym``).
        """
        data = load_mapping(source)
        if "quantization_config" in data:
            data = data["quantization_config"]
        if not isinstance(data, Mapping):
            raise ConfigError(f"quantization_config must be a JSON object; got {type(data).__name__}")
        method = METHOD(data.get("quant_method", "awq" if "w_bit" in data or "zero_point" in data else "gptq"))
        if method is METHOD.COMPRESSED_TENSORS:
            raise ConfigError("compressed-tensors configs map module targets to schemes (config_groups): read them "
                              "with qlinear.ct_config.CompressedTensorsConfig.from_hf_config")
        if method is METHOD.FP8:
            return cls(bits=8, group_size=-1, method=method, checkpoint_format=fp8_format(data, "quantization_config"),
                       extra=dict(data))
        if method is METHOD.BITSANDBYTES:  # transformers' BitsAndBytesConfig: load_in_4bit / load_in_8bit
            four, eight = bool(data.get("load_in_4bit")), bool(data.get("load_in_8bit"))
            if four == eight:
                raise ConfigError("bitsandbytes config: exactly one of load_in_4bit / load_in_8bit must be true; got "
                                  f"load_in_4bit={data.get('load_in_4bit')!r}, "
                                  f"load_in_8bit={data.get('load_in_8bit')!r}")
            return cls(bits=4 if four else 8, group_size=-1, method=method, checkpoint_format=FORMAT.BITSANDBYTES,
                       pack_dtype="int8", extra=dict(data))
        bits = config_int(data, "bits", "w_bit")
        if bits is None:
            raise ConfigError("quantization config has no 'bits' (or 'w_bit') entry")
        group_size = config_int(data, "group_size", "q_group_size")
        fmt = data.get("checkpoint_format") or data.get("format") or data.get("version")
        if fmt is not None and not isinstance(fmt, str):
            raise ConfigError(f"checkpoint_format/format/version: expected a format name (a string), found {fmt!r}")
        if method is METHOD.AWQ and "sym" not in data:
            sym = not config_bool(data, "zero_point", True)
        else:
            sym = config_bool(data, "sym", True)
        known = {"bits", "w_bit", "group_size", "q_group_size", "checkpoint_format", "format", "version",
                 "sym", "zero_point", "desc_act", "quant_method", "pack_dtype"}
        return cls(bits=bits, group_size=-1 if group_size is None else group_size, sym=sym,
                   desc_act=config_bool(data, "desc_act", False), method=method,
                   checkpoint_format=FORMAT(fmt) if fmt else None, pack_dtype=data.get("pack_dtype"),
                   extra={k: v for k, v in data.items() if k not in known})


@dataclass(frozen=True)
class Scheme:
    """One layer's quantization: a config resolved against the layer's shape.

    ``group_size`` is a length here: ``-1`` (and any size past K) becomes ``in_features`` once, and
    ``channelwise`` remembers that there is a single group per output row.
    """

    bits: int
    group_size: int
    in_features: int
    out_features: int
    sym: bool = True
    desc_act: bool = False
    method: METHOD = METHOD.GPTQ
    format: FORMAT = FORMAT.GPTQ_V2
    pack_dtype: torch.dtype | str | None = None  # None: the format's default word (default_pack_dtype)
    qtype: str | None = None  # GGUF only: the GGML block type ("Q4_K"); logical bits alone do not name it
    #: Float-quantized weights: the element format of the codes (None: integer codes).
    element: Element | None = None
    #: Rows x input columns one weight scale covers, for formats that record it (compressed-tensors' tensor,
    #: channel, group and block strategies; FP8 blocks). None: one scale per output row and group.
    scale_block: tuple[int, int] | None = None
    #: One scale for the whole weight, stored as a single value (compressed-tensors' "tensor" strategy, GPTQModel
    #: FP8's "tensor" method): ``scale_block`` is then ``(out, in)``, which a "block" strategy may also be.
    per_tensor_scale: bool = False
    #: How the checkpoint quantizes this layer's inputs at run time (None: it does not; weight-only).
    activations: ActQuant | None = None
    #: compressed-tensors before 0.18 packed ``32 // bits`` codes per int32 word (padded, never straddling);
    #: from 0.18 one dense bit stream. Differs only for 3, 5, 6 and 7 bits.
    legacy_packing: bool = False
    #: bitsandbytes only: the code type, ``nf4`` / ``fp4`` (4-bit look-up tables) or ``int8`` (LLM.int8 rows).
    bnb_type: str | None = None
    #: bitsandbytes 4-bit only: values per ``absmax`` block, counted over the flattened row-major weight (a block
    #: may straddle rows when it does not divide ``in_features``).
    blocksize: int | None = None
    #: bitsandbytes 4-bit only: ``absmax`` itself quantized to uint8 (a nested 8-bit state plus an offset).
    double_quant: bool = False
    #: Structure of a non-affine format that the fields above cannot hold, as one frozen (hashable) dataclass
    #: defined by that format's layout module: EXL3 trellis parameters, VPTQ codebook sizes, EXL2 per-group bit
    #: widths, ParoQuant rotation counts. None for every other format.
    layout_params: Hashable | None = None

    def __post_init__(self) -> None:
        for name in ("in_features", "out_features"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer; got {value!r}")
        if not isinstance(self.group_size, int) or isinstance(self.group_size, bool) or not (
                self.group_size == -1 or self.group_size > 0):
            raise ConfigError(f"group_size must be -1 (one group per row) or a positive length; got "
                              f"{self.group_size!r}")
        object.__setattr__(self, "method", METHOD(self.method))
        object.__setattr__(self, "format", FORMAT(self.format))
        pack = default_pack_dtype(self.format) if self.pack_dtype is None else self.pack_dtype
        object.__setattr__(self, "pack_dtype", pack_dtype_of(pack))
        if self.method in (METHOD.GPTQ, METHOD.AWQ):
            _check_integer_affine(self.bits, self.group_size, self.format, self.method, self.desc_act,
                                  self.pack_dtype)
        if self.qtype is not None:
            qtype = ggml_type(self.qtype)
            bits = GEOMETRY[qtype].bits
            if self.method is not METHOD.GGUF or bits != self.bits:
                raise ConfigError(f"qtype {qtype.name} is a {bits}-bit GGUF block type; got method="
                                  f"{self.method.value}, bits={self.bits}")
            object.__setattr__(self, "qtype", qtype.name)
        if self.scale_block is not None:
            object.__setattr__(self, "scale_block", _block_of(self.scale_block))
        if self.per_tensor_scale and self.scale_block != (self.out_features, self.in_features):
            raise ConfigError(f"per_tensor_scale needs scale_block ({self.out_features}, {self.in_features}); "
                              f"got {self.scale_block}")
        _check_float(self)
        _check_bnb(self)
        if self.group_size == -1 or self.group_size > self.in_features:
            object.__setattr__(self, "group_size", self.in_features)

    @property
    def channelwise(self) -> bool:
        """One group spans the whole input dimension."""
        return self.group_size >= self.in_features

    @property
    def num_groups(self) -> int:
        return -(-self.in_features // self.group_size)

    @property
    def maxq(self) -> int:
        return (1 << self.bits) - 1

    def with_format(self, fmt: FORMAT | str) -> Scheme:
        return replace(self, format=FORMAT(fmt))


def _block_of(block: object) -> tuple[int, int]:
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise ConfigError(f"scale_block must be (rows, cols), two positive integers; got {block!r}")
    return int(block[0]), int(block[1])


def _check_float(s: Scheme) -> None:
    """The element format agrees with the format and the bits (float formats need one, integer ones none)."""
    if s.element is not None:
        object.__setattr__(s, "element", Element(s.element))
    if s.format in FLOAT_FORMATS and s.element is None:
        raise ConfigError(f"format {s.format.value} holds float codes: name the element format "
                          "(element='float8_e4m3fn', 'float8_e5m2' or 'float4_e2m1')")
    if s.element is not None:
        if s.format not in FLOAT_FORMATS | EITHER_FORMATS:
            raise ConfigError(f"format {s.format.value} holds integer codes; got element={s.element.value}")
        if s.bits != s.element.bits:
            raise ConfigError(f"element {s.element.value} is {s.element.bits}-bit; got bits={s.bits}")
    if s.activations is not None and not isinstance(s.activations, ActQuant):
        raise ConfigError(f"activations must be an ActQuant or None; got {type(s.activations).__name__}")


#: bitsandbytes code types by bit width (4-bit look-up tables, 8-bit LLM.int8 rows).
BNB_TYPES: Mapping[int, tuple[str, ...]] = {4: ("nf4", "fp4"), 8: ("int8",)}


def _check_bnb(s: Scheme) -> None:
    """bitsandbytes fields appear together, on bitsandbytes schemes only, and agree with the bits."""
    if s.method is not METHOD.BITSANDBYTES:
        if s.bnb_type is not None or s.blocksize is not None or s.double_quant:
            raise ConfigError(f"bnb_type / blocksize / double_quant describe bitsandbytes weights; got method "
                              f"{s.method.value}")
        return
    allowed = BNB_TYPES.get(s.bits)
    if allowed is None:
        raise ConfigError(f"bitsandbytes weights are 4-bit (nf4, fp4) or 8-bit (int8); got bits={s.bits}")
    if s.bnb_type not in allowed:
        raise ConfigError(f"bnb_type for {s.bits}-bit bitsandbytes weights must be one of {', '.join(allowed)}; "
                          f"got {s.bnb_type!r}")
    if s.element is not None or s.qtype is not None:
        raise ConfigError("bitsandbytes weights have neither a float element format nor a GGUF qtype")
    if s.bits == 4:
        if not isinstance(s.blocksize, int) or isinstance(s.blocksize, bool) or s.blocksize <= 0:
            raise ConfigError(f"4-bit bitsandbytes weights need blocksize, a positive integer; got {s.blocksize!r}")
    elif s.blocksize is not None or s.double_quant:
        raise ConfigError(f"8-bit bitsandbytes weights have one scale (SCB) per row: no blocksize or double_quant; "
                          f"got blocksize={s.blocksize!r}, double_quant={s.double_quant}")


def fp8_format(raw: Mapping[str, Any], source: str) -> FORMAT:
    """Which FP8 family a ``quant_method: fp8`` config is (their ``weight_scale_inv`` mean opposite things):
    GPTQModel's ``fp8`` (it names ``weight_scale_method`` / ``weight_scale_semantics``; the scale divides) or
    transformers' ``hf_fp8`` (``activation_scheme`` / ``fmt``; it multiplies). Neither: refused as ambiguous."""
    if any(k in raw for k in ("weight_scale_method", "weight_scale_semantics")):
        semantics = str(raw.get("weight_scale_semantics", "inverse")).lower()
        if semantics != "inverse":
            raise ConfigError(f"{source}: weight_scale_semantics {semantics!r}; GPTQModel FP8 defines 'inverse' only")
        return FORMAT.FP8
    if "activation_scheme" in raw or "fmt" in raw:
        return FORMAT.HF_FP8
    raise ConfigError(f"{source}: quant_method fp8 without weight_scale_method/weight_scale_semantics (GPTQModel) "
                      "or activation_scheme/fmt (transformers): cannot tell whether weight_scale_inv multiplies or "
                      "divides")


def method_of(fmt: FORMAT | str) -> METHOD:
    """The method a checkpoint format belongs to (Marlin and BitBLAS are GPTQ unless a config says AWQ)."""
    fmt = FORMAT(fmt)
    for method in (METHOD.GPTQ, METHOD.AWQ, *METHOD):
        if fmt in METHOD_FORMATS.get(method, frozenset()):
            return method
    raise ConfigError(f"format {fmt.value!r} belongs to no known method")
