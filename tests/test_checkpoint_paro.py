"""ParoQuant checkpoints (``checkpoint/plan_paro.py``): a directory as paroquant 0.1.16's converter writes it
(``config.json`` with ``quantization_config = {quant_method: paroquant, bits, group_size, krot}``, each module's
``qweight``/``qzeros``/``scales``/``theta``/``pairs``/``channel_scales``/``bias``, unquantized tensors beside) and
GPTQModel's spelling (``format: paroquant``, ``sym``, ``dynamic``) load into ``ParoLinear`` layers whose forward is
the directly built layer's; every bad module is refused naming the tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qlinear.checkpoint import CheckpointError, load_checkpoint, plan_checkpoint
from qlinear.kernels.paro_cpu import ParoCpuLinear
from qlinear.kernels.paroquant import ParoLinear
from qlinear.layouts.paroquant import ParoParams
from qlinear.spec import Scheme
from qlinear.target import Target

K, N, GS, KROT = 128, 32, 64, 2


def module(seed: int, k: int = K, n: int = N, krot: int = KROT, gs: int = GS) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "qweight": torch.randint(-2**31, 2**31 - 1, (k, n // 8), dtype=torch.int32, generator=g),
        "qzeros": torch.randint(-2**31, 2**31 - 1, (k // gs, n // 8), dtype=torch.int32, generator=g),
        "scales": (torch.rand(k // gs, n, generator=g) * 0.02 + 0.001).half(),
        "theta": ((torch.rand(krot, k // 2, generator=g) * 2 - 1) * 3.2).half(),
        "pairs": torch.stack([torch.cat([torch.randperm(gs, generator=g) for _ in range(k // gs)])
                              for _ in range(krot)]).to(torch.int16),
        "channel_scales": (torch.rand(1, k, generator=g) * 1.5 + 0.5).half(),
        "bias": (torch.randn(n, generator=g) * 0.1).half(),
    }


def write(root: Path, modules: dict[str, dict[str, torch.Tensor]], qcfg: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    tensors = {f"{m}.{leaf}": t for m, leaves in modules.items() for leaf, t in leaves.items()}
    tensors["model.embed_tokens.weight"] = torch.zeros(4, K, dtype=torch.float16)
    save_file(tensors, str(root / "model.safetensors"))
    cfg = qcfg or {"quant_method": "paroquant", "bits": 4, "group_size": GS, "krot": KROT}
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": cfg}))
    return root


def direct(leaves: dict[str, torch.Tensor]) -> ParoLinear:
    s = Scheme(bits=4, group_size=GS, in_features=K, out_features=N, method="paroquant", format="paroquant",
               layout_params=ParoParams(KROT))
    layer = ParoLinear(s, bias=True)
    layer.load_state_dict(leaves, strict=True)
    return layer


def test_paroquant_directory_loads_and_runs(tmp_path: Path) -> None:
    mods = {"model.layers.0.mlp.up_proj": module(1), "model.layers.0.self_attn.q_proj": module(2)}
    root = write(tmp_path / "ckpt", mods)
    plan = plan_checkpoint(root)
    assert sorted(plan.modules) == sorted(mods)
    assert plan.modules["model.layers.0.mlp.up_proj"].scheme.layout_params == ParoParams(KROT)
    x = torch.randn(3, K).half()
    exact = load_checkpoint(root, backend="paroquant_cuda")  # ParoLinear: GPTQModel's arithmetic
    for name, leaves in mods.items():
        layer = exact[name]
        assert isinstance(layer, ParoLinear)
        assert torch.equal(layer(x), direct(leaves)(x))
        assert sorted(layer.state_dict()) == sorted(leaves)
    auto = load_checkpoint(root)  # on CPU: ParoCpuLinear (the int4 kernels) where torch has the int4pack ops
    for name, leaves in mods.items():
        layer, want = auto[name], direct(leaves)(x).double()
        assert isinstance(layer, ParoCpuLinear if torch_has_int4pack() else ParoLinear)
        assert float((layer(x).double() - want).norm() / want.norm()) < 6e-3  # bfloat16 arithmetic
        sd = layer.state_dict()
        assert sorted(sd) == sorted(leaves) and all(torch.equal(sd[k], v) for k, v in leaves.items())


def torch_has_int4pack() -> bool:
    from qlinear.kernels.planned.cpu import INT4PACK_CPU_OPS

    return all(Target.here().has_op(op) for op in INT4PACK_CPU_OPS)


def test_gptqmodel_spelling_and_dynamic_rules(tmp_path: Path) -> None:
    mods = {"model.layers.0.mlp.up_proj": module(3), "model.layers.1.mlp.up_proj": module(4, krot=KROT, gs=32)}
    cfg = {"quant_method": "paroquant", "format": "paroquant", "bits": 4, "group_size": GS, "sym": True,
           "desc_act": False, "krot": KROT, "dynamic": {r"model\.layers\.1\..*": {"group_size": 32}}}
    layers = load_checkpoint(write(tmp_path / "ckpt", mods, cfg))
    assert layers["model.layers.1.mlp.up_proj"].scheme.group_size == 32


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda m: m.pop("theta"), "model.layers.0.mlp.up_proj.theta: expected a 2-D [krot, in_features/2]"),
    (lambda m: m.update(theta=m["theta"][:1]), "theta: 1 rotation rounds, but"),
    (lambda m: m.update(pairs=m["pairs"].int()), "model.layers.0.mlp.up_proj.pairs: found"),
    (lambda m: m.update(channel_scales=m["channel_scales"][:, :64]), "channel_scales: found"),
    (lambda m: m.update(scales=m["scales"][:1]), "model.layers.0.mlp.up_proj.scales: found"),
    (lambda m: m.update(bias=m["bias"][:4]), "model.layers.0.mlp.up_proj.bias: found"),
])
def test_bad_modules_are_named(tmp_path: Path, edit, needle: str) -> None:
    leaves = module(5)
    edit(leaves)
    root = write(tmp_path / "bad", {"model.layers.0.mlp.up_proj": leaves})
    with pytest.raises(CheckpointError) as err:
        plan_checkpoint(root)
    assert needle in str(err.value)


def test_bad_config_and_bad_rotation_content(tmp_path: Path) -> None:
    root = write(tmp_path / "bits", {"m.q_proj": module(6)},
                 {"quant_method": "paroquant", "bits": 8, "group_size": GS, "krot": KROT})
    with pytest.raises(CheckpointError, match="bits=8"):
        plan_checkpoint(root)
    root = write(tmp_path / "fmt", {"m.q_proj": module(6)},
                 {"quant_method": "paroquant", "format": "gemm", "bits": 4, "group_size": GS, "krot": KROT})
    with pytest.raises(CheckpointError, match="format 'gemm' is not a ParoQuant checkpoint format"):
        plan_checkpoint(root)
    leaves = module(7)
    leaves["pairs"][1, 0] = leaves["pairs"][1, 1]
    root = write(tmp_path / "dup", {"m.q_proj": leaves})
    with pytest.raises(CheckpointError, match=r"m.q_proj: Paro\w*Linear .* pairs: round 1, group 0 is not a perm"):
        load_checkpoint(root)


def test_save_round_trip_and_refusals(tmp_path: Path) -> None:
    from qlinear.checkpoint import save_checkpoint
    from qlinear.convert import ConversionError

    mods = {"model.layers.0.mlp.up_proj": module(11), "model.layers.1.mlp.up_proj": module(12, gs=32)}
    cfg = {"quant_method": "paroquant", "bits": 4, "group_size": GS, "krot": KROT,
           "dynamic": {r"model\.layers\.1\..*": {"group_size": 32}}}
    layers = load_checkpoint(write(tmp_path / "src", mods, cfg))
    out = save_checkpoint(layers, tmp_path / "dst", format="paroquant")
    quant = json.loads((out / "quantize_config.json").read_text())
    assert quant["quant_method"] == "paroquant" and quant["krot"] == KROT and quant["group_size"] == GS
    assert list(quant["dynamic"].values()) == [{"bits": 4, "group_size": 32, "sym": True, "desc_act": False}]
    again = load_checkpoint(out)
    x = torch.randn(2, K).half()
    for name, layer in layers.items():
        assert torch.equal(again[name](x), layer(x))
        for leaf, t in layer.state_dict().items():
            assert torch.equal(again[name].state_dict()[leaf], t), (name, leaf)
    with pytest.raises(ConversionError, match="ParoQuant codes multiply rotated inputs"):
        save_checkpoint(layers, tmp_path / "gptq", format="gptq")
