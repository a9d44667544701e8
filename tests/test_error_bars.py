"""The rule registered in nbs/results/classes-20-39/README.md (chapter 36_error_bars, convit_edu.tables), each
formula against a computation by hand on small made-up records, then against the audit's numbers recomputed from the
committed records (experiments-audit.md, sections 2 and 3)."""

import json
import math
from pathlib import Path

import pytest

from convit_edu.tables import (answers, compare, difference, format_table_2, format_table_3, pool_class_sets,
                               run_spread, shared_variance, t_p_value, table_2, table_3, verdict)

RESULTS = Path(__file__).resolve().parents[1] / "nbs" / "results"


def run(name: str, seed: int, correct: str, fraction: float = 0.1) -> dict:
    model = "deit" if name == "deit" else "convit"
    return {"model": model, "ablation": None if name in ("convit", "deit") else name, "fraction": fraction,
            "seed": seed, "val_top1": 50.0, "train_top1": 100.0, "test_correct": correct,
            "test_images": len(correct), "test_top1": 100 * correct.count("1") / len(correct)}


def cov(x: str, y: str) -> float:
    """Covariance over images (n - 1) of two answer strings, by hand."""
    a, b = [int(c) for c in x], [int(c) for c in y]
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    return sum((u - ma) * (v - mb) for u, v in zip(a, b)) / (len(a) - 1)


def sd(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def top1(correct: str) -> float:
    return 100 * correct.count("1") / len(correct)


A = ["11011100", "10111010", "11110100"]  # three seeds of arm A, 8 test images
B = ["10010100", "01010110", "10011000"]  # three of arm B


def hand_shared(a: list[str], b: list[str]) -> float:
    within_a = [cov(x, y) for i, x in enumerate(a) for j, y in enumerate(a) if i != j]
    within_b = [cov(x, y) for i, x in enumerate(b) for j, y in enumerate(b) if i != j]
    cross = [cov(x, y) for x in a for y in b]
    return max(0.0, sum(within_a) / len(within_a) + sum(within_b) / len(within_b) - 2 * sum(cross) / len(cross))


def test_shared_variance_is_the_mean_covariance_between_distinct_runs_clipped_at_zero():
    runs_a, runs_b = answers([run("convit", s, c) for s, c in enumerate(A)]), answers(
        [run("deit", s, c) for s, c in enumerate(B)])
    assert shared_variance(runs_a, runs_b) == pytest.approx(hand_shared(A, B))
    same = answers([run("convit", 0, "1100"), run("convit", 1, "1100")])
    opposite = answers([run("deit", 0, "0011"), run("deit", 1, "0011")])
    assert shared_variance(same, same) == 0.0  # identical arms: nothing shared differs
    assert shared_variance(same, opposite) == pytest.approx(4 * cov("1100", "1100"))
    assert shared_variance(opposite, opposite) == 0.0 and shared_variance(same, 1 - same) > 0


def test_an_arm_of_one_run_takes_the_pooled_within_arm_covariance():
    one, two = answers([run("convit", 0, "1101")]), answers([run("deit", 0, "1001"), run("deit", 1, "0101")])
    hand = 0.2 + cov("1001", "0101") - 2 * (cov("1101", "1001") + cov("1101", "0101")) / 2
    assert shared_variance(one, two, pooled_within=0.2) == pytest.approx(max(0.0, hand))
    with pytest.raises(ValueError, match="pooled within-arm covariance"):
        shared_variance(one, two)


def test_run_spread_pools_the_variances_of_arms_with_two_seeds_or_more_weighted_by_their_df():
    records = ([run("convit", s, c) for s, c in enumerate(A)] + [run("deit", s, c) for s, c in enumerate(B[:2])]
               + [run("psa", 0, "11111111")])  # one seed: left out of the pool
    spread = run_spread(records)
    var_a, var_b = sd([top1(c) for c in A]) ** 2, sd([top1(c) for c in B[:2]]) ** 2
    assert spread["df"] == 2 + 1 and spread["sd"] == pytest.approx(((2 * var_a + 1 * var_b) / 3) ** 0.5)
    within_a = sum(cov(x, y) for i, x in enumerate(A) for j, y in enumerate(A) if i != j) / 6
    assert spread["within"] == pytest.approx((2 * within_a + 1 * cov(B[0], B[1])) / 3)
    assert spread["arms"] == [("convit", 0.1), ("deit", 0.1)]
    assert run_spread([run("psa", 0, "1111")]) is None


def test_compare_takes_all_seeds_of_each_arm_and_the_registered_standard_error():
    a, b = [run("convit", s, c) for s, c in enumerate(A)], [run("deit", s + 5, c) for s, c in enumerate(B)]
    c = compare(a, b, run_spread(a + b))  # no seed in common: nothing pairs them, all runs count
    top_a, top_b = [top1(x) for x in A], [top1(x) for x in B]
    diff = sum(top_a) / 3 - sum(top_b) / 3
    se = (sd(top_a) ** 2 / 3 + sd(top_b) ** 2 / 3 + 1e4 * hand_shared(A, B) / 8) ** 0.5
    assert c["diff"] == pytest.approx(diff) and c["se"] == pytest.approx(se) and c["z"] == pytest.approx(diff / se)
    assert c["pooled"] == (False, False) and c["verdict"] == verdict(diff, se) and c["paired"]["seeds"] == []
    va, vb = sd(top_a) ** 2 / 3, sd(top_b) ** 2 / 3
    assert c["t"] == pytest.approx(diff / (va + vb) ** 0.5)
    assert c["df"] == pytest.approx((va + vb) ** 2 / (va**2 / 2 + vb**2 / 2))  # Welch-Satterthwaite
    assert c["p"] == pytest.approx(t_p_value(c["t"], c["df"]))


def test_an_arm_of_fewer_than_three_seeds_takes_the_pooled_sd_and_counts_it_once_in_the_df():
    pool = {"sd": 2.0, "df": 7, "within": 0.05}
    c = difference([40.0, 42.0], [41.0], 0.01, 100, pool)
    assert c["pooled"] == (True, True) and c["sd"] == (2.0, 2.0)
    seeds = 4.0 / 2 + 4.0 / 1
    assert c["se"] == pytest.approx((seeds + 1e4 * 0.01 / 100) ** 0.5) and c["diff"] == pytest.approx(0.0)
    assert c["df"] == pytest.approx(7.0)  # one pooled estimate, not two: its 7 df
    mixed = difference([40.0, 42.0, 45.0], [41.0, 44.0], 0.0, 100, pool)
    own = sd([40.0, 42.0, 45.0]) ** 2 / 3
    assert mixed["pooled"] == (False, True)
    assert mixed["df"] == pytest.approx((own + 2.0) ** 2 / (own**2 / 2 + 2.0**2 / 7))
    assert difference([40.0, 42.0], [41.0], 0.01, 100, None)["se"] is None  # no spread known: no SE_total


def test_verdict_is_two_standard_errors_either_way():
    assert [verdict(2.1, 1.0), verdict(-2.1, 1.0), verdict(1.9, 1.0), verdict(-2.0, 1.0)] == [
        "larger", "smaller", "within noise", "within noise"]


def test_t_p_value_matches_the_printed_tables_of_students_t():
    for df, critical in ((1, 12.706), (3, 3.182), (10, 2.228), (30, 2.042)):  # two-sided 5 % points
        assert t_p_value(critical, df) == pytest.approx(0.05, abs=2e-4)
    assert t_p_value(0.0, 4) == pytest.approx(1.0) and t_p_value(-3.182, 3) == pytest.approx(0.05, abs=2e-4)
    with pytest.raises(ValueError, match="must be >= 1"):
        t_p_value(2.0, 0.5)


def test_seed_paired_differences_stand_beside_the_verdict():
    a = [run("convit", 1, "1110"), run("convit", 2, "1100"), run("convit", 3, "1111")]
    b = [run("deit", 1, "1100"), run("deit", 3, "1000"), run("deit", 4, "0000")]
    paired = compare(a, b, run_spread(a + b))["paired"]
    assert paired["seeds"] == [1, 3] and paired["diffs"] == pytest.approx([25.0, 75.0])
    assert paired["t"] == pytest.approx(50.0 / (sd([25.0, 75.0]) / 2**0.5)) and paired["df"] == 1


def test_one_seed_per_arm_without_any_spread_is_judged_on_the_images_alone():
    c = compare([run("convit", 1, "11110000")], [run("deit", 1, "11100000")], None)
    d = [int(x) - int(y) for x, y in zip("11110000", "11100000")]
    se_images = 100 * (sd(d) ** 2 / 8) ** 0.5
    assert c["se"] is None and c["basis"] == "images only" and c["se_images"] == pytest.approx(se_images)
    assert c["verdict"] == "within noise"  # 12.5 points < 2 x 12.5: counting seeds could only widen it
    big = compare([run("convit", 1, "11111111")], [run("deit", 1, "00000000")], None)
    assert big["verdict"] == "not decided"
    with pytest.raises(ValueError, match="not the same ones"):
        compare([run("convit", 1, "1111")], [run("deit", 1, "111")], None)


def test_class_sets_pool_weighted_by_their_test_images_as_registered():
    parts = [{"diff": -0.3, "se": 0.7, "images": 1500}, {"diff": 2.6, "se": 0.8, "images": 1500},
             {"diff": 1.0, "se": 0.6, "images": 3000}]
    pooled = pool_class_sets(parts)
    assert pooled["diff"] == pytest.approx((-0.3 + 2.6 + 2 * 1.0) / 4)  # D40 of the README
    assert pooled["se"] == pytest.approx((0.7**2 + 0.8**2 + 4 * 0.6**2) ** 0.5 / 4)  # SE40 of the README
    assert pooled["verdict"] == verdict(pooled["diff"], pooled["se"]) and pooled["images"] == 6000
    with pytest.raises(ValueError, match="SE_total"):
        pool_class_sets([{"diff": 1.0, "se": None, "images": 10}])


def test_tables_2_and_3_follow_the_rule_and_print_its_verdict():
    records = ([run("convit", s, c) for s, c in enumerate(A)] + [run("deit", s, c) for s, c in enumerate(B)]
               + [run("frozen_gpsa", s, c) for s, c in enumerate(B[:2])])
    (row,) = table_2(records)
    c = compare(records[:3], records[3:6], run_spread(records))
    assert row["paired"] and row["seeds"] == 3 and row["diff"] == pytest.approx(c["diff"])
    assert row["diff_se"] == pytest.approx(c["se"]) and row["gain_se"] == pytest.approx(100 * c["se"] / row["deit_top1"])
    assert c["verdict"] in format_table_2([row])
    frozen = {r["name"]: r for r in table_3(records, 0.1)}["frozen_gpsa"]
    assert frozen["comparison"]["pooled"] == (True, False) and frozen["verdict"] == frozen["comparison"]["verdict"]
    assert "pooled run-to-run SD" in format_table_3(table_3(records, 0.1))


# ------------------------------------------------------------------ the audit's numbers, from the committed records


def class_set(folder: str) -> tuple[list[dict], dict]:
    records = json.loads((RESULTS / folder / "summary.json").read_text())
    return records, run_spread(records)


def arm(records: list[dict], name: str, fraction: float = 0.1) -> list[dict]:
    return [r for r in records if (r["ablation"] or r["model"]) == name and r["fraction"] == fraction]


def test_the_audits_table_2_numbers_from_the_committed_records():
    first, first_spread = class_set("second-design")
    nxt, next_spread = class_set("other-classes")
    low = compare(arm(first, "convit"), arm(first, "deit"), first_spread)
    full = compare(arm(first, "convit", 1.0), arm(first, "deit", 1.0), first_spread)
    gap = compare(arm(nxt, "convit"), arm(nxt, "deit"), next_spread)
    assert round(low["diff"], 2) == -0.27 and round(full["diff"], 2) == -1.10 and round(gap["diff"], 2) == 2.62
    assert [round(c["shared"], 3) for c in (low, full, gap)] == [0.035, 0.023, 0.032]  # audit: .035 .022 .032
    assert round(gap["paired"]["t"], 1) == 3.4 and gap["paired"]["df"] == 3  # the audit's t(3) = 3.4
    assert round(gap["paired"]["p"], 3) == pytest.approx(0.041, abs=0.002)
    assert [c["verdict"] for c in (low, full, gap)] == ["within noise", "within noise", "larger"]
    assert round(first_spread["sd"], 2) == 0.73  # the audit's pooled run-to-run SD 0.74 (both sets together)
    twenty = pool_class_sets([low, gap])
    assert round(twenty["diff"], 1) == 1.2 and round(twenty["se"], 2) == 0.53  # registered rule, 20 classes


def test_the_audits_all_seed_ablation_differences_from_the_committed_records():
    first, first_spread = class_set("second-design")
    nxt, next_spread = class_set("other-classes")
    diffs = {(folder, a, b): round(compare(arm(records, a), arm(records, b), spread)["diff"], 2)
             for folder, records, spread in (("first", first, first_spread), ("next", nxt, next_spread))
             for a in ("frozen_gpsa", "psa") for b in ("convit", "deit")}
    assert diffs == {("first", "frozen_gpsa", "convit"): 2.15, ("first", "frozen_gpsa", "deit"): 1.88,
                     ("first", "psa", "convit"): 2.82, ("first", "psa", "deit"): 2.55,
                     ("next", "frozen_gpsa", "convit"): 0.12, ("next", "frozen_gpsa", "deit"): 2.73,
                     ("next", "psa", "convit"): -0.22, ("next", "psa", "deit"): 2.40}
    paired = compare(arm(first, "no_conv_init"), arm(first, "convit"), first_spread)["paired"]
    assert paired["seeds"] == [1, 3] and round(paired["mean"], 2) == 2.37  # the review's +2.37 (seeds 1, 3)
