"""GPT-2's byte-level alphabet: the printable character that stands for each of the 256 bytes in a byte-level BPE
vocabulary (printable bytes stand for themselves, the others for 256, 257, ... in byte order), and its inverse.
Pure: the built-in tokenizers write their vocabularies with it, and the API reads a token's raw bytes back."""

from __future__ import annotations

_PRINTABLE = frozenset([*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)])


def _stand_ins() -> tuple[str, ...]:
    out, extra = [], 0
    for b in range(256):
        if b in _PRINTABLE:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return tuple(out)


#: ``BYTE_TO_CHAR[b]``: the character that stands for byte ``b``.
BYTE_TO_CHAR: tuple[str, ...] = _stand_ins()
#: ``CHAR_TO_BYTE[c]``: the byte character ``c`` stands for.
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
