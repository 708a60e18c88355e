"""Packed weight layouts: pure functions between checkpoint tensors and the canonical AffineWeight."""
