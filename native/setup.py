"""Seven C extensions, compiled at install time for the installing machine's CPU (-march=native)."""

from setuptools import Extension, setup

FLAGS = ["-O3", "-march=native", "-std=gnu11"]
OPENMP = ["-fopenmp"]  # the int4 and block kernels split output channels over torch's thread count
SRC = "src/qlinear_native/"
COMMON = SRC + "cpu_common.h"  # helpers the four kernel extensions share (thread split, rounding, CPU checks)
KERNEL = dict(extra_compile_args=FLAGS + OPENMP, extra_link_args=OPENMP)
setup(ext_modules=[Extension("qlinear_native._decode", [SRC + "_decode.c"], extra_compile_args=FLAGS),
                   Extension("qlinear_native._int4",
                             [SRC + f for f in ("_int4.c", "int4_amx.c", "int4_mv.c", "int4_dp.c")],
                             depends=[SRC + "int4.h", COMMON], **KERNEL),
                   Extension("qlinear_native._blocks", [SRC + "_blocks.c", SRC + "blocks.c"],
                             depends=[SRC + "blocks.h", COMMON], **KERNEL),
                   Extension("qlinear_native._float", [SRC + f for f in ("_float.c", "float8_mv.c", "float8_amx.c")],
                             depends=[SRC + "float8.h", COMMON], **KERNEL),
                   Extension("qlinear_native._lut4", [SRC + f for f in ("_lut4.c", "lut4_mv.c", "lut4_mm.c")],
                             depends=[SRC + "lut4.h", COMMON], **KERNEL),
                   # loops at 32-byte boundaries: vq_mv's one-row loop ran 20 % slower when placed across one
                   # (identical instructions; results/cpu_formats-vptq-wide-2026-12-07.md)
                   Extension("qlinear_native._vq", [SRC + f for f in ("_vq.c", "vq.c", "vq_wide.c")],
                             depends=[SRC + "vq.h", SRC + "vq_common.h", COMMON],
                             extra_compile_args=FLAGS + OPENMP + ["-falign-loops=32"], extra_link_args=OPENMP),
                   Extension("qlinear_native._exl3", [SRC + "_exl3.c", SRC + "exl3.c"],
                             depends=[SRC + "exl3.h", COMMON], **KERNEL)])
