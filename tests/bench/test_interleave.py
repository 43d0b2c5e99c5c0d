"""`bench.interleave`'s own rules: where its numbers come from in a bench's JSON, the
order of the trees in each cycle, and the summary (the worktrees and the runs are what
the tool is for: run by hand, as every bench)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.interleave import Tree, cycle_order, last_json, summary, values_at


def test_values_at_follows_keys_and_every_item() -> None:
    doc = {
        "rounds": [
            {"steps_per_s": 300, "cpu_ms_per_step": 2.5},
            {"steps_per_s": 310.5, "cpu_ms_per_step": None},
            {"other": 1},
        ],
        "machine": {"nproc": 2, "ok": True},
    }
    assert values_at(doc, "rounds.*.steps_per_s") == [300.0, 310.5]
    assert values_at(doc, "rounds.*.cpu_ms_per_step") == [2.5]  # None skipped
    assert values_at(doc, "machine.*") == [2.0]  # a bool is no number
    assert values_at(doc, "missing.*.x") == []
    assert values_at(doc, "rounds.steps_per_s") == []  # a list needs its `*`


def test_last_json_takes_the_last_object_line() -> None:
    output = 'warming up\n{"a": 1}\nnot json {\n{"b": [1, 2]}\n'
    assert last_json(output) == {"b": [1, 2]}
    with pytest.raises(ValueError, match="no JSON object"):
        last_json("only words\n")


def test_cycles_alternate_the_order() -> None:
    trees = [Tree("a", Path("a")), Tree("b", Path("b")), Tree("c", Path("c"))]
    assert [t.revision for t in cycle_order(trees, 0)] == ["a", "b", "c"]
    assert [t.revision for t in cycle_order(trees, 1)] == ["c", "b", "a"]
    assert [t.revision for t in cycle_order(trees, 2)] == ["a", "b", "c"]


def test_summary_medians_and_ratios_per_cycle() -> None:
    a = Tree("base", Path("a"), {"m": [100.0, 110.0, 90.0]}, {"m": [100.0, 90.0]})
    b = Tree("new", Path("b"), {"m": [120.0, 130.0, 99.0]}, {"m": [125.0, 99.0]})
    out = summary([a, b], ["m", "absent"])
    assert out["m"]["trees"]["base"] == {"median": 100.0, "min": 90.0, "max": 110.0, "n": 3}
    assert out["m"]["trees"]["new"]["median"] == 120.0
    assert out["m"]["ratio_to_first_per_cycle"] == {"new": [1.25, 1.1]}
    assert out["absent"]["trees"]["base"] == {"n": 0}
    assert out["absent"]["ratio_to_first_per_cycle"] == {"new": []}
