"""`zero_memory`: zeros written by giving whole pages back, the unaligned ends by memset."""

from __future__ import annotations

import ctypes
import mmap

import pytest

from engine.runtimes import gil

SIZE = 16 * 4096


@pytest.fixture
def mapping() -> tuple[mmap.mmap, int]:
    # Private and anonymous, as a wasmtime linear memory without an initial image.
    m = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.write(b"\xab" * SIZE)
    view = (ctypes.c_char * SIZE).from_buffer(m)
    yield m, ctypes.addressof(view)
    del view
    m.close()


@pytest.mark.parametrize(
    ("start", "size", "memset_bytes"),
    [
        (0, SIZE, 0),  # whole pages only: no memset
        (100, 3 * 4096, 4096),  # unaligned at both ends: the ends
        (4096, 4096, 0),  # one page
        (10, 50, 50),  # inside one page: memset alone
        (4000, 200, 200),  # across a page boundary, no whole page
    ],
)
def test_exactly_the_range_becomes_zeros(
    mapping: tuple[mmap.mmap, int],
    monkeypatch: pytest.MonkeyPatch,
    start: int,
    size: int,
    memset_bytes: int,
) -> None:
    m, address = mapping
    memset = gil.memset_keeping_gil
    memset_sizes: list[int] = []

    def counting_memset(at: int, value: int, n: int) -> None:
        memset_sizes.append(n)
        memset(at, value, n)

    monkeypatch.setattr(gil, "memset_keeping_gil", counting_memset)
    gil.zero_memory(address + start, size)
    assert sum(memset_sizes) == memset_bytes
    data = m[:]
    assert data[start : start + size] == bytes(size)
    assert data[:start] == b"\xab" * start
    assert data[start + size :] == b"\xab" * (SIZE - start - size)


def test_without_madvise_it_falls_back_to_memset(
    mapping: tuple[mmap.mmap, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gil, "_madvise_fn", None)
    m, address = mapping
    gil.zero_memory(address + 5, 3 * 4096)
    assert m[5 : 5 + 3 * 4096] == bytes(3 * 4096) and m[4:5] == b"\xab"
