"""Which replica likely holds a prompt's prefix in its KV cache: an index of
prompt block hashes per replica, filled as requests are routed.

The gateway holds no tokenizer, so blocks are fixed runs of text (hashing
text is as good as hashing tokens for "same prefix"): a chained hash per
block, so a block matches only when everything before it matched too. Each
replica's index is an LRU bounded like its KV cache: a replica forgets old
prefixes much as its engine evicts them."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

BLOCK_CHARS = 256  # about 64 tokens of English text: a few KV blocks


def block_hashes(text: str, block_chars: int = BLOCK_CHARS) -> list[bytes]:
    """Chained hashes of the prompt's whole blocks (a trailing partial block
    is not cached by the engine either)."""
    hashes: list[bytes] = []
    previous = b""
    for start in range(0, len(text) - block_chars + 1, block_chars):
        previous = hashlib.blake2b(previous + text[start : start + block_chars].encode(), digest_size=12).digest()
        hashes.append(previous)
    return hashes


class PrefixIndex:
    def __init__(self, capacity_blocks: int = 8192) -> None:
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def matched(self, hashes: list[bytes]) -> int:
        """How many leading blocks of the prompt this replica likely holds."""
        count = 0
        for digest in hashes:
            if digest not in self._blocks:
                break
            count += 1
        return count

    def record(self, hashes: list[bytes]) -> None:
        for digest in hashes:
            self._blocks[digest] = None
            self._blocks.move_to_end(digest)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def forget(self) -> None:
        """A restarted or ejected replica holds nothing any more."""
        self._blocks.clear()
