"""The GGUF dequant kernel compiled for sm_90 on this CPU (the interpreter cannot see compiled code): for the types
the dense variant decodes at large M, each row's weights leave in 16-byte stores, not 2-byte ones. Field-by-field
stores used 2 of every 32 bytes written and made the kernel L2-bound (947 us for a 4096x14336 Q4_K weight on an
H100; ncu in benchmarks/results/h100-ncu-gguf-2026-12-05.md). Its values are checked bit for bit in the
interpreter (test_gguf_triton_interpret.py)."""

from __future__ import annotations

from tests.sm90_facts import compile_facts


def test_rows_are_stored_16_bytes_at_a_time() -> None:
    for name, f in compile_facts("gguf_sm90_compile.py").items():
        assert f["st.global.v4.b32"] > 0 and f["st.global.b16"] == 0 and f["st.local"] == 0, (name, f)
