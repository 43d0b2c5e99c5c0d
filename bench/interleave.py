"""Two or more trees of this repository measured in turns, on a machine whose speed moves
from minute to minute (docs/benchmarks.md: only interleaved runs compare).

    .venv/bin/python -m bench.interleave REV [REV ...] [--cycles 6] [--copy FILES]
        [--metric PATH ...] [--keep DIR] [--json] -- MODULE [ARGS ...]

Each revision gets a git worktree (the repository's virtualenv linked into it, its
components built by `engine.build_components`; a revision is a commit: uncommitted
changes are not measured); then, cycle after cycle, each tree runs
`python -m bench.MODULE ARGS --json` in turn — in the opposite order every other cycle,
so that a machine getting busier or quieter favours none — and the numbers at each
`--metric` path of its JSON are collected. Printed: each tree's median and range, and
per cycle the ratio of each tree's median to the first tree's, with the load average.

`--copy bench/step_profile.py,bench/procs.py` copies those files from this checkout
into every tree, so that one harness measures trees older than it (what differs is then
only the engine). A metric path is dot-separated, `*` for every item of a list (default
for `step_profile`: `rounds.*.steps_per_s` and `rounds.*.cpu_ms_per_step`).

Example, the issue's tree beside today's (the twenty-fifth session's comparison):

    .venv/bin/python -m bench.interleave 1428b88 HEAD --cycles 8 \\
        --copy bench/step_profile.py,bench/procs.py -- step_profile --scenario many --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

DEFAULT_METRICS = {
    "step_profile": ["rounds.*.steps_per_s", "rounds.*.cpu_ms_per_step"],
    "workflow_throughput": ["many.*.steps_per_s", "serial.*.steps_per_s"],
    "activity_throughput": ["executions_per_s"],
}


def values_at(document: Any, path: str) -> list[float]:
    """The numbers at `path` in a JSON document: keys separated by dots, `*` for every
    item of a list (or value of an object); what is missing or not a number is skipped."""
    found: list[Any] = [document]
    for key in path.split("."):
        step: list[Any] = []
        for node in found:
            if key == "*":
                if isinstance(node, list):
                    step += node
                elif isinstance(node, dict):
                    step += node.values()
            elif isinstance(node, dict) and key in node:
                step.append(node[key])
        found = step
    return [float(v) for v in found if isinstance(v, int | float) and not isinstance(v, bool)]


def last_json(output: str) -> Any:
    """The last line of `output` that is a JSON object (the benches print one with
    `--json`, after whatever they say on the way)."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON object in the output (was --json accepted?)")


@dataclass
class Tree:
    revision: str
    path: Path
    #: metric path → every value collected, and per cycle the median of that cycle's.
    values: dict[str, list[float]] = field(default_factory=dict)
    cycles: dict[str, list[float]] = field(default_factory=dict)


def cycle_order(trees: Sequence[Tree], cycle: int) -> list[Tree]:
    """The trees in turn: forwards in even cycles, backwards in odd ones."""
    return list(trees) if cycle % 2 == 0 else list(reversed(trees))


def summary(trees: Sequence[Tree], metrics: Sequence[str]) -> dict[str, Any]:
    """Per metric: each tree's median, range and count; per cycle each tree's median
    over the first tree's."""
    out: dict[str, Any] = {}
    first = trees[0]
    for metric in metrics:
        per_tree = {}
        for tree in trees:
            values = tree.values.get(metric, [])
            per_tree[tree.revision] = (
                {
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                    "n": len(values),
                }
                if values
                else {"n": 0}
            )
        ratios = {
            tree.revision: [
                round(mine / theirs, 3)
                for mine, theirs in zip(
                    tree.cycles.get(metric, []), first.cycles.get(metric, []), strict=False
                )
                if theirs
            ]
            for tree in trees[1:]
        }
        out[metric] = {"trees": per_tree, "ratio_to_first_per_cycle": ratios}
    return out


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


def prepare(revision: str, path: Path, copy: Sequence[str]) -> Tree:
    commit = _git("rev-parse", "--verify", revision)
    _git("worktree", "add", "--detach", "--force", str(path), commit)
    (path / ".venv").symlink_to(REPO / ".venv")
    for name in copy:
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    build = subprocess.run(
        [sys.executable, "-m", "engine.build_components"], cwd=path, capture_output=True, text=True
    )
    if build.returncode != 0:
        raise SystemExit(f"{revision}: engine.build_components failed:\n{build.stderr[-2000:]}")
    return Tree(revision, path)


def run_once(tree: Tree, command: Sequence[str], metrics: Sequence[str]) -> None:
    done = subprocess.run(command, cwd=tree.path, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree.revision}: {' '.join(command)} failed:\n{done.stderr[-2000:]}")
    document = last_json(done.stdout)
    for metric in metrics:
        values = values_at(document, metric)
        tree.values.setdefault(metric, []).extend(values)
        if values:
            tree.cycles.setdefault(metric, []).append(statistics.median(values))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: python -m bench.interleave REV [REV ...] [options] -- MODULE …")
    split = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m bench.interleave")
    p.add_argument("revisions", nargs="+")
    p.add_argument("--cycles", type=int, default=6)
    p.add_argument("--copy", default="", help="files copied from this checkout into each tree")
    p.add_argument("--metric", action="append", help="a JSON path to collect (repeatable)")
    p.add_argument("--keep", type=Path, help="make the worktrees here and keep them")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv[:split])
    module, *bench_args = argv[split + 1 :] or ["step_profile"]
    metrics = args.metric or DEFAULT_METRICS.get(module, [])
    if not metrics:
        raise SystemExit(f"no default metric for bench.{module}: name them with --metric")
    command = [sys.executable, "-m", f"bench.{module}", *bench_args, "--json"]
    copy = [name for name in args.copy.split(",") if name]
    root = args.keep or Path(tempfile.mkdtemp(prefix="obelisk-interleave-"))
    trees: list[Tree] = []
    loads: list[float] = []
    try:
        for index, revision in enumerate(args.revisions):
            path = root / f"{index}-{revision.replace('/', '_')}"
            trees.append(prepare(revision, path, copy))
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        for cycle in range(args.cycles):
            loads.append(os.getloadavg()[0])
            for tree in cycle_order(trees, cycle):
                run_once(tree, command, metrics)
            if not args.json:
                print(f"cycle {cycle + 1}/{args.cycles} done (load {loads[-1]:.2f})", flush=True)
        result: dict[str, Any] = {
            "started": started,
            "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "command": command[1:],
            "load_per_cycle": loads,
            "metrics": summary(trees, metrics),
        }
    finally:
        if args.keep is None:
            for tree in trees:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(tree.path)],
                    cwd=REPO,
                    capture_output=True,
                )
            _git("worktree", "prune")
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['started']} – {result['ended']}; load per cycle {loads}")
    for metric, found in result["metrics"].items():
        print(metric)
        for revision, s in found["trees"].items():
            if s["n"]:
                print(
                    f"  {revision:>14}: median {s['median']:g} ({s['min']:g}–{s['max']:g}, n={s['n']})"
                )
        for revision, ratios in found["ratio_to_first_per_cycle"].items():
            print(f"  {revision:>14} / {trees[0].revision}, per cycle: {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
