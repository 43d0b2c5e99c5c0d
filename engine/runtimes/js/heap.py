"""QuickJS heap images that restore by writing only the pages that matter.

A JS workflow run starts from a heap image instead of compiling and running the prelude
(and, where possible, the workflow's module) again: `engine.runtimes.js.workflow`.
quickjs-rs 0.2.6 restores its whole-memory snapshots by copying the image three times
and writing all of it into the fresh instance's memory, touching (page-faulting) every
page although three quarters of a typical image are zeros: ~0.8 ms per run.

`HeapImage` keeps only the pages that are non-zero in the image or in the memory of a
fresh sandbox (set up the same way, before anything ran in it), and restores by copying
those into the guest's linear memory; every other page is zero in both, so the memory
ends up byte for byte the image (a test compares it with quickjs-rs's own restore).
This relies on a fresh sandbox's memory having the same layout every time (same guest
build, same set-up calls): what the new context writes lands on the same pages.
Pinned to quickjs-rs 0.2.6's `_Instance` (`mem`, `store`, `sp`, `build_id`, `snapshot()`).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import wasmtime
from quickjs_rs import Runtime
from quickjs_rs import _engine as qjs_engine  # noqa: PLC2701 (quickjs_rs internals, version pinned)
from wasmtime import _ffi as wasmtime_ffi  # noqa: PLC2701 (wasmtime internals, version pinned)

from engine.runtimes.gil import memmove_keeping_gil, zero_memory

log = logging.getLogger("obelisk.js_heap")
K = TypeVar("K", bound=Hashable)

PAGE = 4096
_WASM_PAGE = 65536


def memory_of(inst: Any) -> bytes:
    """A copy of the guest's whole linear memory."""
    return bytes(inst.mem.read(inst.store, 0, inst.mem.data_len(inst.store)))


def _nonzero(data: bytes) -> bool:
    return data.count(0) != len(data)


def _set_i32_global(store: Any, global_: Any, value: int) -> None:
    """`global_.set_value(store, value)` for an i32 global, without wasmtime-py's type
    lookup and value conversion (~27 µs of Python calls per JS run start)."""
    raw = wasmtime_ffi.wasmtime_val_t(
        kind=wasmtime_ffi.WASMTIME_I32.value, of=wasmtime_ffi.wasmtime_valunion_t(i32=value)
    )
    error = wasmtime_ffi.wasmtime_global_set(
        store._context(), ctypes.byref(global_._global), ctypes.byref(raw)
    )
    if error:
        raise wasmtime.WasmtimeError._from_ptr(error)


@dataclass(frozen=True, slots=True)
class HeapImage:
    build_id: Any
    memory_size: int
    stack_pointer: int
    #: (offset, bytes) of every run of adjacent pages to write, in address order.
    pages: tuple[tuple[int, bytes], ...]
    #: Offsets of the pages a fresh sandbox has written (shared by the images restored
    #: into the same kind of sandbox: `capture_more`).
    fresh_pages: frozenset[int]

    @classmethod
    def capture(cls, inst: Any, fresh: bytes) -> HeapImage:
        """The heap of `inst` as it is now; `fresh` is `memory_of` a new sandbox, set up
        as the ones this image will be restored into, taken before it ran anything."""
        fresh_pages = frozenset(
            offset
            for offset in range(0, len(fresh), PAGE)
            if _nonzero(fresh[offset : offset + PAGE])
        )
        return cls._capture(inst, fresh_pages)

    def capture_more(self, inst: Any) -> HeapImage:
        """The heap of `inst` now, for the same kind of sandbox as this image's."""
        return self._capture(inst, self.fresh_pages)

    @classmethod
    def _capture(cls, inst: Any, fresh_pages: frozenset[int]) -> HeapImage:
        snapshot = inst.snapshot()
        header = qjs_engine._SNAP_HEADER
        _magic, _format, build_id, size, sp = header.unpack_from(snapshot, 0)
        image = memoryview(snapshot)[header.size :]
        if len(image) != size or any(offset >= size for offset in fresh_pages):
            raise ValueError(f"heap image of {len(image)} bytes, smaller than a fresh sandbox")
        # Runs of adjacent pages to write, each copied at once.
        runs: list[tuple[int, int]] = []
        for offset in range(0, size, PAGE):
            if offset in fresh_pages or _nonzero(bytes(image[offset : offset + PAGE])):
                if runs and runs[-1][1] == offset:
                    runs[-1] = (runs[-1][0], offset + PAGE)
                else:
                    runs.append((offset, offset + PAGE))
        pages = tuple((start, bytes(image[start:end])) for start, end in runs)
        return cls(build_id, size, sp, pages, fresh_pages)

    @property
    def written_bytes(self) -> int:
        return sum(len(page) for _, page in self.pages)

    def restore(self, inst: Any) -> None:
        """Make the guest's memory and stack pointer this image (a fresh sandbox only)."""
        if inst.build_id != self.build_id:
            raise ValueError("heap image of another QuickJS guest build")
        store, memory = inst.store, inst.mem
        current = memory.data_len(store)
        if current > self.memory_size:
            raise ValueError(f"guest memory ({current} bytes) larger than the image")
        if self.memory_size > current:
            memory.grow(store, (self.memory_size - current + _WASM_PAGE - 1) // _WASM_PAGE)
        base = ctypes.addressof(memory.data_ptr(store).contents)
        move = memmove_keeping_gil  # a few runs of pages: no GIL hand-off per copy
        for offset, page in self.pages:
            move(base + offset, page, len(page))
        _set_i32_global(store, inst.sp, self.stack_pointer)

    def reset(self, inst: Any) -> None:
        """Make the memory of a sandbox that has run code this image again, byte for byte
        what `restore` makes of a fresh sandbox: the image's pages, zeros everywhere
        else (a fresh sandbox has zeros there too), and the stack pointer. Only for a
        sandbox of this image's size: a memory that grew cannot shrink."""
        if inst.build_id != self.build_id:
            raise ValueError("heap image of another QuickJS guest build")
        store, memory = inst.store, inst.mem
        if memory.data_len(store) != self.memory_size:
            raise ValueError("the sandbox's memory is not the image's size")
        base = ctypes.addressof(memory.data_ptr(store).contents)
        move = memmove_keeping_gil
        done = 0
        for offset, page in self.pages:
            if offset > done:
                zero_memory(base + done, offset - done)
            move(base + offset, page, len(page))
            done = offset + len(page)
        if done < self.memory_size:
            zero_memory(base + done, self.memory_size - done)
        _set_i32_global(store, inst.sp, self.stack_pointer)


class SandboxImages(Generic[K]):
    """Heap images of sandboxes set up one way per key, each built once, on first use,
    in a sandbox of its own: `prepare(key, context)` registers host functions and
    evaluates code in a new context. None for a key whose image cannot be taken (runs
    then set themselves up). At most `keep` keys are kept."""

    def __init__(self, prepare: Callable[[K, Any], None], *, keep: int = 64) -> None:
        self._prepare = prepare
        self._keep = keep
        self._images: dict[K, HeapImage | None] = {}
        self._lock = threading.Lock()

    def peek(self, key: K) -> HeapImage | None:
        """The image of `key` if it was built."""
        return self._images.get(key)

    def get(self, key: K, memory_limit: int, inst: Any) -> HeapImage | None:
        """The image of `key`; `inst` is a fresh sandbox of `memory_limit` (it tells
        which pages such a sandbox has written before anything ran)."""
        if key in self._images:
            return self._images[key]
        with self._lock:
            if key in self._images:
                return self._images[key]
            fresh = memory_of(inst)
            rt = Runtime(memory_limit=memory_limit)
            image: HeapImage | None
            try:
                ctx = rt.new_context(timeout=_A_YEAR)
                self._prepare(key, ctx)
                image = HeapImage.capture(ctx._engine_ctx._inst, fresh)
            except Exception:
                log.debug("no heap image for %r", key, exc_info=True)
                image = None
            finally:
                rt.close()
            if len(self._images) >= self._keep:
                self._images.clear()
            self._images[key] = image
            return image


_A_YEAR = 365 * 24 * 3600.0
