"""Deterministic byte and JSON mutators for the reader fuzz tests (seeded: a failure replays from its index).

Byte mutations follow what breaks binary headers in practice: flipped bits, length and count fields set to
boundary values, truncation, bytes inserted or deleted (shifting every later offset), spliced duplicates.
JSON mutations change types, drop keys and set numbers to absurd values.
"""

from __future__ import annotations

import copy
import random
import struct
from typing import Any

#: Integers that sit on boundaries length and count checks get wrong.
INTERESTING = (0, 1, 2, 7, 8, 31, 32, 127, 128, 255, 256, 4095, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1,
               2**32, 2**40, 2**62, 2**63 - 1, 2**64 - 1)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One to four random edits of ``data``."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        if not out:
            out += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
            continue
        i = rng.randrange(len(out))
        if op == 0:  # flip one bit
            out[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # one random byte
            out[i] = rng.randrange(256)
        elif op == 2:  # a boundary integer over 1/2/4/8 bytes (little-endian, as GGUF and safetensors store)
            width = rng.choice((1, 2, 4, 8))
            value = rng.choice(INTERESTING) % (1 << (8 * width))
            out[i:i + width] = value.to_bytes(width, "little")
        elif op == 3:  # truncate
            del out[rng.randrange(len(out)):]
        elif op == 4:  # delete a run
            del out[i:i + rng.randint(1, 16)]
        elif op == 5:  # insert a run
            out[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 6:  # duplicate a chunk elsewhere
            j = rng.randrange(len(out))
            out[j:j] = out[i:i + rng.randint(1, 64)]
        else:  # an aligned 8-byte field (counts, lengths, offsets) set to a boundary value
            i -= i % 8
            out[i:i + 8] = struct.pack("<Q", rng.choice(INTERESTING) % 2**64)
    return bytes(out)


def _random_value(rng: random.Random) -> Any:
    return rng.choice((None, True, False, -1, 0, 1, 3, 7, 9, 33, 2**31, 2**63, -(2**40), 1e308, float("nan"),
                       float("inf"), "", "gptq", "awq", "gemm", "marlin", "zzz", [], [1], {}, {"a": 1}, "128"))


def mutate_json(obj: Any, rng: random.Random) -> Any:
    """A deep copy of ``obj`` with one to three edits at random paths: a value replaced (any type), a key
    deleted, a key added, or a number pushed to an extreme."""
    out = copy.deepcopy(obj)
    for _ in range(rng.randint(1, 3)):
        containers = [out]
        node = out
        while isinstance(node, (dict, list)) and node and rng.random() < 0.6:
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            if not isinstance(node[key], (dict, list)):
                break
            node = node[key]
            containers.append(node)
        if isinstance(node, dict):
            op = rng.randrange(4)
            if op == 0 and node:
                del node[rng.choice(list(node))]
            elif op == 1:
                node[rng.choice(("bits", "group_size", "sym", "desc_act", "quant_method", "checkpoint_format",
                                 "format", "version", "zero_point", "w_bit", "q_group_size", "dynamic", "extra"))] = \
                    _random_value(rng)
            elif node:
                key = rng.choice(list(node))
                value = node[key]
                node[key] = (value * rng.choice((-1, 0, 3, 1 << 20)) if isinstance(value, int) and
                             not isinstance(value, bool) else _random_value(rng))
        elif isinstance(node, list) and node:
            node[rng.randrange(len(node))] = _random_value(rng)
    return out
