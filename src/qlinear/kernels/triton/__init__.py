"""Triton bodies and thin launchers for the quantized-linear kernels (no policy, no registry).

Importing this package imports nothing: ``triton`` is imported only by the body modules
(``common``, ``qmm``, ``dequant``), which the kernel classes import inside ``prepare``/``forward``.
``configs`` and ``layout`` are plain Python/torch and never import triton.
"""
