"""The numba CRC-32C: the same checksums as the ``crc32c`` package, over any span, and over batches."""

from __future__ import annotations

import crc32c as crc32c_package
import numpy as np

from storage.batch_builder import build_batch
from storage.batch_header import CRC_OFFSET
from storage.crc32c_kernel import batch_crcs_ok, crc32c, crc32c_by_table, fill_batch_crcs


def test_crc32c_matches_the_package_over_any_span() -> None:
    data = np.random.default_rng(5).integers(0, 256, 20_000, dtype=np.uint8)
    spans = [(0, 0), (0, 1), (3, 11), (5, 100), (7, 4999), (0, 5000), (1, 19_999), (0, 20_000)]
    spans += [(s, s + n) for s in range(8) for n in range(17)]  # every alignment, every tail length
    # around the lengths where the three interleaved streams take over (3 x 128 and 3 x 1024 bytes)
    spans += [(s, s + n) for s in (0, 3) for base in (384, 768, 3072, 6144, 3072 + 384)
              for n in range(base - 9, base + 10)]
    for start, end in spans:
        expected = crc32c_package.crc32c(data[start:end].tobytes())
        assert crc32c(data, start, end) == expected, (start, end)
        assert crc32c_by_table(data, start, end) == expected, ("table", start, end)  # a CPU without SSE 4.2


def test_batch_crcs_are_checked_and_filled_as_stored() -> None:
    batches = [build_batch([b"v%d" % i] * (i + 1), [b"k%d" % i] * (i + 1), timestamp_ms=1000 + i)
               for i in range(5)]
    data = np.frombuffer(b"".join(batches), np.uint8).copy()
    sizes = np.array([len(b) for b in batches], np.int64)
    positions = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    assert batch_crcs_ok(data, positions, sizes) == 5
    data[positions[3] + sizes[3] - 1] ^= 1  # a bit flipped in the fourth batch's last record
    assert batch_crcs_ok(data, positions, sizes) == 3
    data[positions[3] + sizes[3] - 1] ^= 1
    blank = data.copy()
    for position in positions:
        blank[position + CRC_OFFSET : position + CRC_OFFSET + 4] = 0
    fill_batch_crcs(blank, np.stack([positions, positions + sizes], axis=1))
    assert blank.tobytes() == data.tobytes()
