"""Build the WASM components of the repo from their sources, with a cache.

Two kinds of component are built: Python-authored ones with componentize-py (`PyComponent`),
and hand-written WAT ones with wasm-tools (`WatComponent`, via `engine.wat_build`).

Run `python -m engine.build_components [NAME ...]` to build every component in `COMPONENTS`
(or only the named ones). Each build lands in `.cache/components/<sha256>/<name>.wasm`, where
the hash covers every source and WIT file of the component, the table entry itself and the
version of the tool (componentize-py or wasm-tools); the result is then hard-linked (or copied)
to the path the demo deployment expects, e.g. `demo/build/activity_py.wasm`. A run with nothing
changed only hashes the inputs and compares files, so it takes milliseconds.

Tests use `ensure_built(name)`, which returns the deployment path, building only if needed,
and `load_component(engine, path)`, which caches wasmtime's compiled code next to the builds:
compiling an ~18 MB componentize-py component takes seconds, deserializing it milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import filecmp
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import wasmtime
    import wasmtime.component

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".cache" / "components"
COMPILED_DIR = CACHE_DIR / "compiled"
COMPONENTIZE_PY = "componentize-py"
WASM_TOOLS = "wasm-tools"
SETUP_COMMAND = ".venv/bin/pip install -e '.[dev]'"
# Bump when the way a build is produced changes in a way the inputs do not show.
BUILD_FORMAT = 1
# Cache entries kept per component (older ones are pruned after a build).
KEEP_PER_COMPONENT = 3
# Compiled (serialized) components kept by `load_component`.
KEEP_COMPILED = 6
SKIPPED_DIRS = frozenset({"build", "__pycache__", "node_modules"})
SKIPPED_SUFFIXES = (".pyc", ".pyo", ".wasm", ".cwasm")


class BuildError(Exception):
    """A component could not be built; the message says why and what to do."""


@dataclass(frozen=True)
class PyComponent:
    """One Python-authored component: `componentize-py -d WIT... -w WORLD componentize MODULE`.

    Paths are relative to the repo root. `wit_dirs` defaults to `<app_dir>/wit`. Every file
    under `app_dir` and each of `wit_dirs` (except build outputs and bytecode) is part of the
    cache key, and so is the entry itself. `componentize_args` are extra options of the
    `componentize` subcommand, e.g. `("--stub-wasi",)` for a deterministic workflow.
    """

    name: str
    app_dir: str
    module: str
    world: str
    output: str
    wit_dirs: tuple[str, ...] = ()
    componentize_args: tuple[str, ...] = ()

    @property
    def app_path(self) -> Path:
        return REPO_ROOT / self.app_dir

    @property
    def wit_paths(self) -> tuple[Path, ...]:
        dirs = self.wit_dirs or (f"{self.app_dir}/wit",)
        return tuple(REPO_ROOT / d for d in dirs)

    @property
    def output_path(self) -> Path:
        return REPO_ROOT / self.output


@dataclass(frozen=True)
class WatComponent:
    """One hand-written component: a core module in WAT plus the WIT world it implements.

    Paths are relative to the repo root: `wat` is the WAT file, `wit_dir` (default
    `<app_dir>/wit`) the WIT directory (`deps/` inside it for imported packages), `world`
    the world to build when the package has more than one. Every file under `app_dir` (and
    `wit_dir`) is part of the cache key, and so is the entry itself.
    """

    name: str
    app_dir: str
    wat: str
    output: str
    world: str | None = None
    wit_dir: str | None = None

    @property
    def app_path(self) -> Path:
        return REPO_ROOT / self.app_dir

    @property
    def wit_paths(self) -> tuple[Path, ...]:
        return (REPO_ROOT / (self.wit_dir or f"{self.app_dir}/wit"),)

    @property
    def output_path(self) -> Path:
        return REPO_ROOT / self.output


Component = PyComponent | WatComponent

# To add a component (e.g. a Python workflow), add one entry here.
COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        PyComponent(
            name="activity_py",
            app_dir="demo/activity_py",
            module="app",
            world="activity-py",
            output="demo/build/activity_py.wasm",
        ),
        WatComponent(
            name="activity_wat",
            app_dir="demo/activity_wat",
            wat="demo/activity_wat/activity.wat",
            world="activity-wat",
            output="demo/build/activity_wat.wasm",
        ),
        PyComponent(
            name="workflow_py",
            app_dir="demo/workflow_py",
            module="app",
            world="workflow-py",
            output="demo/build/workflow_py.wasm",
            componentize_args=("--stub-wasi",),
        ),
    )
}


@dataclass(frozen=True)
class BuildResult:
    name: str
    output: Path
    cached: Path
    digest: str
    built: bool  # False when the cache already had it
    linked: bool  # False when `output` was already up to date
    seconds: float


def componentize_py_version() -> str:
    """The installed componentize-py version, or a BuildError telling how to install it."""
    if importlib.util.find_spec("componentize_py") is None:
        raise BuildError(
            f"{COMPONENTIZE_PY} is not installed in {sys.executable}: "
            f"run the setup command `{SETUP_COMMAND}` "
            f"(or `.venv/bin/pip install componentize-py==0.25.1`)"
        )
    try:
        return importlib.metadata.version(COMPONENTIZE_PY)
    except importlib.metadata.PackageNotFoundError as e:
        raise BuildError(
            f"{COMPONENTIZE_PY} is importable but has no package metadata; "
            f"reinstall it with `{SETUP_COMMAND}`"
        ) from e


def wasm_tools_version() -> str:
    """The bundled wasm-tools version, or a BuildError telling how to install it."""
    from engine.wat_build import WatBuildError
    from engine.wat_build import wasm_tools_version as version

    try:
        return version()
    except WatBuildError as e:
        raise BuildError(str(e)) from None


def tool_of(spec: Component) -> tuple[str, str]:
    """(tool name, installed version) of the tool that builds `spec`."""
    if isinstance(spec, WatComponent):
        return WASM_TOOLS, wasm_tools_version()
    return COMPONENTIZE_PY, componentize_py_version()


def _input_files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith("."))
        for f in sorted(filenames):
            if f.startswith(".") or f.endswith(SKIPPED_SUFFIXES):
                continue
            yield Path(dirpath) / f


def input_digest(spec: Component, tool_version: str) -> str:
    """sha256 over the table entry, the tool version and every input file (path and bytes)."""
    entry: dict[str, object] = {
        "format": BUILD_FORMAT,
        "world": spec.world,
        "app_dir": spec.app_dir,
        "wit_dirs": [str(p.relative_to(REPO_ROOT)) for p in spec.wit_paths],
    }
    if isinstance(spec, WatComponent):
        entry |= {"tool": f"{WASM_TOOLS}=={tool_version}", "wat": spec.wat}
    else:
        entry |= {
            "tool": f"{COMPONENTIZE_PY}=={tool_version}",
            "module": spec.module,
            "componentize_args": list(spec.componentize_args),
        }
    h = hashlib.sha256()
    h.update(json.dumps(entry, sort_keys=True).encode())
    roots = [spec.app_path, *spec.wit_paths]
    seen: set[Path] = set()
    for root in roots:
        if not root.is_dir():
            raise BuildError(f"component {spec.name!r}: directory {root} does not exist")
        for path in _input_files(root):
            if path in seen:  # the default wit dir lies inside app_dir
                continue
            seen.add(path)
            data = path.read_bytes()
            rel = path.relative_to(REPO_ROOT).as_posix().encode()
            h.update(b"%d:%s%d:" % (len(rel), rel, len(data)))
            h.update(data)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock, so concurrent test runs do not build twice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run_componentize(spec: PyComponent, out: Path, log: Callable[[str], None]) -> None:
    cmd = [
        sys.executable,
        "-c",
        "import sys; from componentize_py import script; "
        f"sys.argv[0] = {COMPONENTIZE_PY!r}; sys.exit(script())",
    ]
    for wit in spec.wit_paths:
        cmd += ["-d", str(wit)]
    cmd += ["-w", spec.world, "componentize", *spec.componentize_args]
    cmd += ["-p", str(spec.app_path), "-o", str(out)]
    cmd.append(spec.module)
    shown = [os.path.relpath(a, REPO_ROOT) if a.startswith("/") else a for a in cmd[3:]]
    log(f"  $ {COMPONENTIZE_PY} {' '.join(shown)}")
    proc = subprocess.run(
        cmd,
        cwd=spec.app_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not out.is_file():
        raise BuildError(
            f"{COMPONENTIZE_PY} failed for component {spec.name!r} "
            f"(exit code {proc.returncode}):\n{proc.stdout.strip()}"
        )


def _run_wat_build(spec: WatComponent, out: Path, log: Callable[[str], None]) -> None:
    from engine.wat_build import WatBuildError, componentize, read_wit_dir

    wat = REPO_ROOT / spec.wat
    (wit,) = spec.wit_paths
    log(
        f"  $ {WASM_TOOLS} component embed {wit.relative_to(REPO_ROOT)} "
        f"<{wat.relative_to(REPO_ROOT)} assembled> && {WASM_TOOLS} component new"
    )
    try:
        componentize(wat.read_text(encoding="utf-8"), read_wit_dir(wit), out, world=spec.world)
    except OSError as e:
        raise BuildError(f"component {spec.name!r}: cannot read {wat}: {e.strerror}") from None
    except WatBuildError as e:
        raise BuildError(f"component {spec.name!r}: {e}") from None


def _run_build(spec: Component, out: Path, log: Callable[[str], None]) -> None:
    if isinstance(spec, WatComponent):
        _run_wat_build(spec, out, log)
    else:
        _run_componentize(spec, out, log)


def _prune(name: str, keep: str, log: Callable[[str], None]) -> None:
    entries: list[tuple[float, Path]] = []
    for meta in CACHE_DIR.glob("*/build.json"):
        try:
            info = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if info.get("name") == name and meta.parent.name != keep:
            entries.append((meta.stat().st_mtime, meta.parent))
    entries.sort(reverse=True)
    for _, old in entries[KEEP_PER_COMPONENT - 1 :]:
        log(f"  pruning old cache entry {old.relative_to(REPO_ROOT)}")
        shutil.rmtree(old, ignore_errors=True)


def _install(cached: Path, output: Path) -> bool:
    """Make `output` a copy of `cached` (a hard link when possible). True if it changed."""
    if output.is_file():
        with contextlib.suppress(OSError):
            if output.samefile(cached):
                return False
        if filecmp.cmp(output, cached, shallow=False):
            return False
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(cached, tmp)
    except OSError:
        shutil.copyfile(cached, tmp)
    os.replace(tmp, output)  # atomic: a file watcher never sees half a component
    return True


def build(name: str, *, force: bool = False, log: Callable[[str], None] = print) -> BuildResult:
    """Build component `name` unless the cache has it; install it at its output path."""
    try:
        spec = COMPONENTS[name]
    except KeyError:
        raise BuildError(
            f"unknown component {name!r}; known: {', '.join(sorted(COMPONENTS))}"
        ) from None
    start = time.perf_counter()
    tool, version = tool_of(spec)
    digest = input_digest(spec, version)
    entry = CACHE_DIR / digest
    cached = entry / f"{spec.name}.wasm"
    built = False
    with _locked(CACHE_DIR / f"{spec.name}.lock"):
        if force or not cached.is_file():
            log(f"{spec.name}: building with {tool} {version} (inputs {digest[:12]})")
            entry.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=entry) as tmpdir:
                tmp_out = Path(tmpdir) / cached.name
                t0 = time.perf_counter()
                _run_build(spec, tmp_out, log)
                seconds = time.perf_counter() - t0
                os.replace(tmp_out, cached)
            meta = {
                "name": spec.name,
                "tool": f"{tool}=={version}",
                "seconds": round(seconds, 3),
                "size": cached.stat().st_size,
            }
            (entry / "build.json").write_text(json.dumps(meta, indent=2) + "\n")
            log(f"  built {cached.relative_to(REPO_ROOT)} ({meta['size']} bytes, {seconds:.1f} s)")
            built = True
            _prune(spec.name, digest, log)
        linked = _install(cached, spec.output_path)
    rel_out = spec.output_path.relative_to(REPO_ROOT)
    if linked:
        log(f"{spec.name}: installed {rel_out}")
    elif not built:
        log(f"{spec.name}: up to date ({rel_out}, inputs {digest[:12]})")
    return BuildResult(
        name=spec.name,
        output=spec.output_path,
        cached=cached,
        digest=digest,
        built=built,
        linked=linked,
        seconds=time.perf_counter() - start,
    )


def ensure_built(name: str) -> Path:
    """Path of the deployable `.wasm` of component `name`, building it first if needed."""
    return build(name, log=lambda _msg: None).output


def load_component(
    engine: wasmtime.Engine,
    wasm: Path,
    *,
    config_tag: str = "",
    cache_dir: Path | None = None,
) -> wasmtime.component.Component:
    """`Component.from_file`, with the compiled code cached in `.cache/components/compiled/`.

    The cache key is the sha256 of the wasm bytes, the wasmtime version and `config_tag`
    (pass a distinct tag per non-default engine `Config`). A cached artifact that this engine
    rejects (e.g. compiled with another `Config`) is recompiled and replaced.
    Only ever deserialize artifacts this process tree wrote: wasmtime trusts them blindly.
    """
    from wasmtime import WasmtimeError
    from wasmtime.component import Component

    data = wasm.read_bytes()
    try:
        wt_version = importlib.metadata.version("wasmtime")
    except importlib.metadata.PackageNotFoundError:
        wt_version = "unknown"
    h = hashlib.sha256(data)
    h.update(f"\0wasmtime=={wt_version}\0{config_tag}".encode())
    key = h.hexdigest()
    cwasm = (cache_dir or COMPILED_DIR) / f"{key}.cwasm"
    if cwasm.is_file():
        try:
            return Component.deserialize_file(engine, str(cwasm))
        except WasmtimeError:
            pass  # incompatible engine config or a damaged file: recompile
    component = Component(engine, data)
    cwasm.parent.mkdir(parents=True, exist_ok=True)
    tmp = cwasm.with_name(f".{cwasm.name}.{os.getpid()}.tmp")
    tmp.write_bytes(component.serialize())
    os.replace(tmp, cwasm)
    _prune_compiled(cwasm.parent)
    return component


def _prune_compiled(directory: Path) -> None:
    dated: list[tuple[float, Path]] = []
    for path in directory.glob("*.cwasm"):
        with contextlib.suppress(OSError):  # another process may be pruning too
            dated.append((path.stat().st_mtime, path))
    dated.sort(reverse=True)
    for _, stale in dated[KEEP_COMPILED:]:
        with contextlib.suppress(OSError):
            stale.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.build_components",
        description="Build the repo's WASM components from source (cached by input hash).",
    )
    parser.add_argument(
        "names", nargs="*", help=f"components to build (default: all of {', '.join(COMPONENTS)})"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)
    names: list[str] = args.names or list(COMPONENTS)
    try:
        for name in names:
            build(name, force=args.force)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
