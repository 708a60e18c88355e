"""Two C extensions, compiled at install time for the installing machine's CPU (-march=native)."""

from setuptools import Extension, setup

FLAGS = ["-O3", "-march=native", "-std=c11"]
setup(ext_modules=[Extension("qlinear_native._decode", ["src/qlinear_native/_decode.c"], extra_compile_args=FLAGS),
                   Extension("qlinear_native._amx", ["src/qlinear_native/_amx.c"], extra_compile_args=FLAGS)])
