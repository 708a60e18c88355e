"""One C extension, compiled at install time for the installing machine's CPU (-march=native)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("qlinear_native._decode", ["src/qlinear_native/_decode.c"],
                             extra_compile_args=["-O3", "-march=native", "-std=c11"])])
