"""bench/report.py on a small made-up results folder: the ratios, targets, EVT overhead and the
README table it writes (no GPU needed; the plot is skipped without matplotlib)."""
import importlib.util
import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_report"] = module
    spec.loader.exec_module(module)
    return module


def bench(fused, cublas, unfused):
    return {"fused_ms": fused, "cublas_ms": cublas, "unfused_ms": unfused,
            "fused_over_cublas": fused / cublas, "fused_over_unfused": fused / unfused}


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_report_ratios_targets_and_overhead(tmp_path):
    report = load_report()
    raw = tmp_path / "raw"
    write(raw / "W1-4096.json", {"m": 4096, "n": 4096, "k": 4096, "config": "coop_a",
                                 "bench": bench(0.20, 0.19, 0.30), "cache_hit_ms": 6.0,
                                 "dispatch": {"run_us": 4.0, "library_us": 3.5, "library_new_args_us": 9.0,
                                              "cublas_us": 8.0}})
    write(raw / "plain" / "W1-4096.json", {"config": "coop_a", "bench": bench(0.19, 0.19, 0.25)})
    write(raw / "W3-4096.json", {"m": 4096, "n": 4096, "k": 4096, "config": "coop_b",
                                 "bench": bench(0.11, 0.10, 0.16)})
    write(raw / "torch.json", {"device": "NVIDIA H100 80GB HBM3", "workloads": [
        {"id": "W1-4096", "torch_mm_ms": 0.19, "eager_ms": 0.26, "compile_ms": 0.22, "autotune_ms": 0.24},
        {"id": "W3-4096", "scaled_mm_ms": 0.12, "eager_ms": 0.12, "compile_ms": 0.13}]})
    write(raw / "compile.json", {"cold_compile_s": 40.0, "warm_load_s": 0.004, "warm_process_s": 0.1,
                                 "cores": 16, "tune_all": {"workload": "W1-4096", "shape": "4096x4096x4096",
                                                           "candidates": 18, "seconds": 90.0, "best": "coop_a"}})
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:begin -->\nSTALE TABLE\n<!-- results:end -->\nhistory\n")
    report.main(raw, tmp_path / "results", readme, "20260101-0000")

    result = json.loads((tmp_path / "results" / "20260101-0000-h100.json").read_text())
    rows = {r["id"]: r for r in result["workloads"]}
    w1, w3 = rows["W1-4096"], rows["W3-4096"]
    # W1 is held to the cuBLAS GEMM of its own run, W3 to torch._scaled_mm.
    assert w1["target"] == {"bound": 1.02, "reference": "cublas", "ratio": 0.20 / 0.19, "met": False}
    assert w3["target"]["reference"] == "scaled_mm"
    assert abs(w3["target"]["ratio"] - 0.11 / 0.12) < 1e-12 and w3["target"]["met"]
    # The EVT overhead: fused minus the plain epilogue of the same configuration.
    assert abs(w1["evt_overhead"]["overhead_ms"] - 0.01) < 1e-12
    assert w1["evt_overhead"]["config"] == "coop_a"
    assert "evt_overhead" not in w3
    assert abs(w1["speedup_over_autotune"] - 0.24 / 0.20) < 1e-12
    s = result["summary"]
    assert s["autotune_workloads"] == ["W1-4096"]
    assert s["targets_met"] == ["W3-4096"] and s["targets_missed"] == ["W1-4096"]
    assert s["latency"] == {"cold_compile_s": 40.0, "cache_hit_ms": 6.0, "tune_all_s": 90.0, "dispatch_us": 4.0}

    text = readme.read_text()
    assert text.startswith("intro\n<!-- results:begin -->\nMeasured on NVIDIA H100 80GB HBM3, 20260101-0000")
    assert text.endswith("<!-- results:end -->\nhistory\n") and "STALE TABLE" not in text
    assert "| W1-4096 | 1.053× | 0.667× |" in text
    assert "≤ 1.02× cuBLAS (is 1.053×) | no | +10.0 µs (+5.3 %) |" in text
    assert "over all 18 candidates" in text and "on 16 cores" in text
    assert "with new arguments every call (CUTLASS's set-up and TMA descriptors again) 9.00 µs" in text


def load_gemm_shapes():
    sys.path.insert(0, str(ROOT / "bench"))  # its sibling module result_files
    spec = importlib.util.spec_from_file_location("bench_gemm_shapes", ROOT / "bench" / "gemm_shapes.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gemm_shapes"] = module
    spec.loader.exec_module(module)
    return module


def test_the_summary_counts_the_gemms_the_fx_pass_moves_to_evtc():
    g = load_gemm_shapes()
    rows = [{"m": 16, "n": 4096, "k": 4096, "label": "a", "ratio": 0.9, "replaces_cublas": True},
            {"m": 64, "n": 4096, "k": 4096, "label": "b", "ratio": 0.99, "replaces_cublas": False},
            {"m": 4096, "n": 4096, "k": 4096, "label": "c", "ratio": 1.1},
            {"m": 32, "n": 4096, "k": 4096, "label": "d", "ratio": 0.5, "replaces_cublas": True, "failed": True}]
    s = g.ratio_stats(rows)
    assert s["replaced"] == 1 and s["replaced_geomean_ratio"] == 0.9 and s["replaced_max_ratio"] == 0.9
    # A user gets evtc's time where the pass moves the GEMM, cuBLAS's elsewhere.
    assert abs(s["pass_geomean_ratio"] - 0.9 ** (1 / 3)) < 1e-12
    lines = g.summary_lines({"plain": s})
    assert any("alone under the FX pass: 1 shapes move to evtc's kernel, geo-mean 0.900" in line for line in lines)


def test_passes_give_each_shape_the_median_of_its_passes_and_the_summary_their_spread():
    g = load_gemm_shapes()

    def row(m, ratio, failed=False):
        r = {"set": "plain", "label": "x", "model": "X", "layer": "y", "m": m, "n": 4096, "k": 4096, "failed": failed,
             "config": "c", "rel_err": 1.7e-3, "ratio_rounds": [ratio], "predicted_ms": 0.1}
        if not failed:
            r.update(evtc_ms=0.1 * ratio, ref_ms=0.1, ratio=ratio)
        else:
            r["failure"] = "rel-L2 error 1e-01 above 0.02"
        return r

    one = g.merge_passes([row(4096, 1.10)])
    assert one["ratio"] == 1.10 and "pass_ratios" not in one
    steady = g.merge_passes([row(4096, 1.05), row(4096, 1.06), row(4096, 1.08)])
    assert steady["ratio"] == 1.06 and steady["pass_ratios"] == [1.05, 1.06, 1.08] and steady["passes"] == 3
    assert steady["evtc_ms"] == pytest.approx(0.106) and steady["ratio_rounds"] == [1.05, 1.06, 1.08]
    assert steady["predicted_over_measured"] == pytest.approx(0.1 / 0.106)
    noisy = g.merge_passes([row(8192, 1.10), row(8192, 0.99), row(8192, 1.01)])
    assert noisy["ratio"] == 1.01  # above 1.04 once, not in the median
    broken = g.merge_passes([row(16, 0.9), row(16, 0.9, failed=True)])
    assert broken["failed"] and broken["failure"] == "pass 2: rel-L2 error 1e-01 above 0.02"
    s = g.ratio_stats([steady, noisy, broken])
    assert s["above_1.04"] == 1 and s["above_1.04_every_pass"] == 1 and s["failed"] == 1
    assert s["largest_pass_spread"] == pytest.approx(1.10 / 0.99)
    lines = g.summary_lines({"plain": s})
    assert any("1 shapes above 1.04 in every pass; one shape's passes differ by up to 11.1 %" in line
               for line in lines)
    # One pass: no pass statistics.
    single = g.ratio_stats([row(64, 1.2)])
    assert single["largest_pass_spread"] is None and single["above_1.04_every_pass"] == 0
    assert not any("every pass" in line for line in g.summary_lines({"plain": single}))


def test_the_summary_checks_the_cost_model_by_time_by_ratio_and_by_its_cublas_time():
    g = load_gemm_shapes()
    # Both kernels ran 10 % faster than when the table measured them: the model's times miss by
    # 10 %, its ratio (what the FX pass's decisions compare) holds.
    clocks = {"m": 8192, "n": 4096, "k": 4096, "label": "a", "ratio": 1.0, "evtc_ms": 0.9, "ref_ms": 0.9,
              "predicted_ms": 1.0, "predicted_cublas_ms": 1.0, "predicted_over_measured": 1.0 / 0.9}
    # The model's time holds, but it expected cuBLAS to be 10 % slower than it ran.
    ratio = {"m": 64, "n": 4096, "k": 4096, "label": "b", "ratio": 1.0, "evtc_ms": 1.0, "ref_ms": 1.0,
             "predicted_ms": 1.0, "predicted_cublas_ms": 1.1, "predicted_over_measured": 1.0}
    unpriced = {"m": 16, "n": 4096, "k": 4096, "label": "c", "ratio": 1.0, "evtc_ms": 1.0, "ref_ms": 1.0}
    assert g.model_checks(clocks) == (pytest.approx(1.0), pytest.approx(1.0 / 0.9))
    assert g.model_checks(unpriced) == (None, None)
    s = g.ratio_stats([clocks, ratio, unpriced])
    assert (s["model_checked"], s["model_within_5pct"], s["model_ratio_within_5pct"], s["model_cublas_within_5pct"]) \
        == (2, 1, 1, 0)
    assert any("cost model, within 5 % of the measurement at: evtc's time 1 of 2 shapes; evtc / cuBLAS 1; "
               "cuBLAS's time" in line for line in g.summary_lines({"plain": s}))


def test_refined_sweeps_and_tables_take_each_shape_from_the_latest_sweep(tmp_path):
    g = load_gemm_shapes()

    def sweep(path, date, shapes):
        write(path, {"mode": "sweep", "gpu": "NVIDIA H100 80GB HBM3", "sm_count": 132, "command": str(path.name),
                     "date": date, "shapes": shapes})
        return str(path)

    def result(m, candidates):
        ranked = sorted(candidates.items(), key=lambda c: c[1])
        return {"m": m, "n": 4096, "k": 4096, "label": "x", "cublas_ms": 1.0, "candidates": dict(ranked),
                "errors": {"broken": "did not compile"}, "best": ranked[0][0], "best_ms": ranked[0][1]}

    old = sweep(tmp_path / "old.json", "2026-01-01", [result(16, {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}),
                                                      result(32, {"a": 1.0})])
    new = sweep(tmp_path / "new.json", "2026-01-02", [result(16, {"e": 0.5, "a": 1.1})])
    shape16, shape64 = g.Shape("M", "L", 16, 4096, 4096), g.Shape("M", "L", 64, 4096, 4096)
    listed = {shape16: ["a", "b", "c", "d", "e", "f", "broken"], shape64: ["a", "z"]}
    # one earlier sweep: the untried (e, f) and its two fastest (a, b); a shape it lacks keeps all
    assert g.refine_candidates(listed, [old], 2) == {shape16: ["e", "f", "a", "b"], shape64: ["a", "z"]}
    # two: what either tried (a to e and broken), and the later one's fastest (e, a)
    assert g.refine_candidates(listed, [old, new], 2)[shape16] == ["f", "e", "a"]
    # --retime: tried candidates whose kernels changed (c, d) are timed again as if new
    assert g.refine_candidates(listed, [old], 2, re.compile("^[cd]$")) == {shape16: ["c", "d", "e", "f", "a", "b"],
                                                                             shape64: ["a", "z"]}
    # --skip drops matching candidates before refining (and before anything compiles)
    kept = g.skip_candidates(listed, re.compile("^[bf]$|roke"))
    assert kept == {shape16: ["a", "c", "d", "e"], shape64: ["a", "z"]}
    assert g.refine_candidates(kept, [old], 2) == {shape16: ["e", "a"], shape64: ["a", "z"]}
    out = tmp_path / "table.json"
    assert g.table_from_sweeps([old, new], str(out)) == 0
    table = json.loads(out.read_text())
    assert [(e["m"], e["config"]) for e in table["entries"]] == [(16, "e"), (32, "a")]
    assert table["sm_count"] == 132 and table["command"] == "old.json && new.json"


def test_a_seeded_sweep_times_another_gpu_s_fastest_candidates_that_are_still_offered(tmp_path):
    g = load_gemm_shapes()

    def sweep(path, shapes):
        write(path, {"mode": "sweep", "gpu": "NVIDIA H100 80GB HBM3", "date": "2026-01-01", "shapes": shapes})
        return str(path)

    def result(m, candidates):
        return {"m": m, "n": 4096, "k": 4096, "label": "x", "candidates": candidates, "errors": {}}

    seed = sweep(tmp_path / "h100.json", [
        result(16, {"p_swap": 1.0, "q_swap": 1.1, "r": 1.3, "s": 1.2, "t": 1.4}),
        result(1024, {"a": 2.0, "b": 1.0, "gone": 0.5, "c": 3.0})])
    s16, s1024, s64 = (g.Shape("M", "L", m, 4096, 4096) for m in (16, 1024, 64))
    listed = {s16: ["t", "s", "r", "q_swap", "p_swap", "new"], s1024: ["a", "b", "c", "d"], s64: ["x", "y"]}
    picked = g.seeded_candidates(listed, [seed], 2)
    # the two fastest there; both transposed, so the fastest untransposed one (s) too
    assert picked[s16] == ["p_swap", "q_swap", "s"]
    # a candidate no longer offered is skipped; a shape not measured there keeps all of its own
    assert picked[s1024] == ["b", "a"] and picked[s64] == ["x", "y"]
    assert g.seeded_candidates(listed, [seed], 1)[s1024] == ["b"]
    # with neighbours: the unmeasured M = 64 takes the candidates of M = 16, then of M = 1024
    # (the nearest in N and K at each), those the listing offers
    listed[s64] = ["t", "s", "q_swap", "p_swap", "b", "a", "c"]
    assert g.seeded_candidates(listed, [seed], 1, neighbours=1)[s64] == ["p_swap", "s", "b"]
    assert g.seeded_candidates(listed, [seed], 1)[s64] == listed[s64]


def test_table_times_come_from_a_compare_run_of_the_same_kernel(tmp_path, capsys):
    g = load_gemm_shapes()
    table = {"format": 1, "gpu": "NVIDIA H100 80GB HBM3", "gpu_class": "h100", "dtype": "bf16", "measured": "then",
             "command": "sweep", "entries": [
                 {"m": 16, "n": 64, "k": 64, "config": "a", "ms": 1.0, "cublas_ms": 1.1},
                 {"m": 32, "n": 64, "k": 64, "config": "b", "ms": 1.0, "cublas_ms": 1.1, "order": "along_n"},
                 {"m": 64, "n": 64, "k": 64, "config": "c", "ms": 1.0, "cublas_ms": 1.1},
                 {"m": 128, "n": 64, "k": 64, "config": "d", "ms": 1.0, "cublas_ms": 1.1}]}

    def row(m, config, order="heuristic", **kw):
        return {"set": "plain", "m": m, "n": 64, "k": 64, "config": config, "visit_order": order,
                "evtc_ms": 1.2, "ref_ms": 1.15, **kw}

    compare = {"mode": "compare", "gpu": "NVIDIA H100 80GB HBM3", "date": "now", "rows": [
        row(16, "a"),                                # retimed
        row(32, "b"),                                # timed with another visiting order: kept
        row(64, "other"),                            # another configuration: kept
        row(128, "d", failed=True),                  # a failed row: kept
        {**row(16, "a"), "set": "silu", "evtc_ms": 9.0}]}  # another epilogue: ignored
    base, run, out = tmp_path / "table.json", tmp_path / "compare.json", tmp_path / "out.json"
    write(base, table)
    write(run, compare)
    assert g.main(["--table-times-from", str(run), "--table-base", str(base), "--table-out", str(out)]) == 0
    entries = {e["m"]: e for e in json.loads(out.read_text())["entries"]}
    assert (entries[16]["ms"], entries[16]["cublas_ms"]) == (1.2, 1.15)
    assert all((entries[m]["ms"], entries[m]["cublas_ms"]) == (1.0, 1.1) for m in (32, 64, 128))
    assert "times of 1 entries from compare runs now" in json.loads(out.read_text())["measured"]
    write(run, {**compare, "gpu": "NVIDIA H200"})
    with pytest.raises(SystemExit, match="was measured on NVIDIA H200, the table is for h100"):
        g.main(["--table-times-from", str(run), "--table-base", str(base), "--table-out", str(out)])


def test_orders_agree_changes_an_entry_only_where_every_sweep_times_the_pick_faster(tmp_path, capsys):
    g = load_gemm_shapes()
    gpu = "NVIDIA H200"
    table = {"format": 1, "gpu": gpu, "gpu_class": "h200", "dtype": "bf16", "epilogue": g.SETS["plain"].expr,
             "measured": "then", "command": "sweep", "entries": [
                 {"m": 1024, "n": 64, "k": 64, "config": "a", "ms": 1.0, "cublas_ms": 1.0, "runner_up": "b",
                  "runner_up_ms": 1.1},
                 {"m": 2048, "n": 64, "k": 64, "config": "a", "ms": 1.0, "cublas_ms": 1.0, "order": "along_n"},
                 {"m": 4096, "n": 64, "k": 64, "config": "a", "ms": 1.0, "cublas_ms": 1.0},
                 {"m": 8192, "n": 64, "k": 64, "config": "a", "ms": 1.0, "cublas_ms": 1.0, "order": "along_m"},
                 {"m": 16, "n": 64, "k": 64, "config": "s_swap", "ms": 1.0, "cublas_ms": 1.0,
                  "unswapped_config": "u", "unswapped_ms": 1.2},
                 {"m": 32, "n": 64, "k": 64, "config": "u", "ms": 1.0, "cublas_ms": 1.0}]}

    def shape(m, cublas, orders):
        return {"m": m, "n": 64, "k": 64, "cublas_ms": cublas, "orders": orders}

    first = {"mode": "sweep", "gpu": gpu, "set": "plain", "date": "one", "shapes": [
        # b (along_m_s4) beats a's heuristic order by 5 % here and by 3 % in the second sweep: changed.
        shape(1024, 1.0, {"a": {"heuristic": 1.00, "along_n": 1.01}, "b": {"heuristic": 1.02, "along_m_s4": 0.95}}),
        # a with CUTLASS's order beats a's along_n in both: changed, and the entry drops its order.
        shape(2048, 1.0, {"a": {"heuristic": 0.96, "along_n": 1.00}, "b": {"heuristic": 1.10}}),
        # 4 % faster here, 0.5 % slower in the second sweep: the sweeps disagree, kept.
        shape(4096, 1.0, {"a": {"heuristic": 1.00}, "b": {"heuristic": 0.96}}),
        # timed by the first sweep only: kept.
        shape(8192, 1.0, {"a": {"along_m": 1.00}, "b": {"heuristic": 0.90}}),
        # transposed to untransposed: the untransposed fallback goes; and the other way: the old
        # untransposed configuration becomes the fallback of the transposed pick.
        shape(16, 1.0, {"s_swap": {"heuristic": 1.00}, "v": {"heuristic": 0.90}}),
        shape(32, 1.0, {"u": {"heuristic": 1.00}, "t_swap": {"heuristic": 0.90}})]}
    second = {"mode": "sweep", "gpu": gpu, "set": "plain", "date": "two", "shapes": [
        # torch.mm ran slower in this run: ratios, not times, are compared.
        shape(1024, 2.0, {"a": {"heuristic": 2.00, "along_n": 2.02}, "b": {"heuristic": 2.04, "along_m_s4": 1.94}}),
        shape(2048, 1.0, {"a": {"heuristic": 0.97, "along_n": 1.00}, "b": {"heuristic": 1.10}}),
        shape(4096, 1.0, {"a": {"heuristic": 1.00}, "b": {"heuristic": 1.005}}),
        shape(16, 1.0, {"s_swap": {"heuristic": 1.00}, "v": {"heuristic": 0.90}}),
        shape(32, 1.0, {"u": {"heuristic": 1.00}, "t_swap": {"heuristic": 0.90}})]}
    paths = [tmp_path / "first.json", tmp_path / "second.json"]
    for path, data in zip(paths, (first, second)):
        write(path, data)
    base, out = tmp_path / "table.json", tmp_path / "out.json"
    write(base, table)
    assert g.main(["--orders-agree", *map(str, paths), "--table-base", str(base), "--table-out", str(out)]) == 0
    doc = json.loads(out.read_text())
    entries = {e["m"]: e for e in doc["entries"]}
    assert (entries[1024]["config"], entries[1024]["order"]) == ("b", "along_m_s4")
    assert (entries[1024]["ms"], entries[1024]["cublas_ms"]) == (1.94, 2.0)  # the last sweep's times
    assert (entries[1024]["runner_up"], entries[1024]["runner_up_ms"]) == ("a", 2.0)
    assert entries[2048]["config"] == "a" and "order" not in entries[2048] and entries[2048]["ms"] == 0.97
    assert entries[4096] == table["entries"][2] and entries[8192] == table["entries"][3]
    assert entries[16]["config"] == "v" and "unswapped_config" not in entries[16]
    assert (entries[32]["config"], entries[32]["unswapped_config"], entries[32]["unswapped_ms"]) == ("t_swap", "u", 1.0)
    assert "4 entries changed where the orders sweeps of one, two agree" in doc["measured"]
    printed = capsys.readouterr().out
    assert "1024x64x64: a (heuristic) -> b (along_m_s4)" in printed
    assert "4096x64x64: kept: b (heuristic) is not 1 % faster than it in sweep(s) 2 (1.005 against 1.000)" in printed
    assert "8192x64x64: kept: its orders were timed by 1 of the 2 sweeps" in printed
    write(paths[1], {**second, "gpu": "NVIDIA H100 80GB HBM3"})
    with pytest.raises(SystemExit, match="was measured on NVIDIA H100 80GB HBM3, the table is for h200"):
        g.main(["--orders-agree", *map(str, paths), "--table-base", str(base), "--table-out", str(out)])
    write(paths[1], {**second, "shapes": [{k: v for k, v in s.items() if k != "orders"} for s in second["shapes"]]})
    with pytest.raises(SystemExit, match="has no visiting-order timings"):
        g.main(["--orders-agree", *map(str, paths), "--table-base", str(base), "--table-out", str(out)])
    with pytest.raises(SystemExit):
        g.main(["--orders-agree", str(paths[0]), "--table-out", str(out)])  # no --table-base
    assert "--orders-agree needs --table-base TABLE.json and --table-out FILE" in capsys.readouterr().err


def test_a_kept_visiting_order_must_beat_cutlass_s_by_the_margin_and_reaches_the_table():
    g = load_gemm_shapes()
    # 0.5 % faster than CUTLASS's heuristic order: noise, not kept; 2 % faster: kept.
    assert g.best_order({"heuristic": 1.0, "along_n_s8": 0.995, "along_m": 1.1}) == ("heuristic", 1.0)
    assert g.best_order({"heuristic": 1.0, "along_n_s8": 0.98, "along_m": 0.99}) == ("along_n_s8", 0.98)
    result = {"m": 1024, "n": 3584, "k": 4096, "label": "x", "cublas_ms": 0.05, "best": "a", "best_ms": 0.050,
              "candidates": {"a": 0.050, "b": 0.051}, "errors": {}}
    # The orders' timing decides, with its own torch.mm time: b with along_m_s4 beats a's best.
    g.apply_orders(result, {"cublas_ms": 0.048, "errors": {},
                            "times": {"a": {"heuristic": 0.049, "along_n": 0.0488},
                                      "b": {"heuristic": 0.050, "along_m_s4": 0.047}}})
    assert (result["best"], result["best_order"], result["best_ms"]) == ("b", "along_m_s4", 0.047)
    assert (result["runner_up"], result["runner_up_ms"], result["cublas_ms"]) == ("a", 0.049, 0.048)
    doc = g.table_document([result, dict(result, m=2048, best_order="heuristic")], "NVIDIA H100 80GB HBM3",
                           "cmd", "date", 132, g.SETS["plain"])
    entries = doc["entries"]
    assert entries[0]["order"] == "along_m_s4" and "order" not in entries[1]
    assert (doc["dtype"], doc["epilogue"]) == ("bf16", "out D: bf16 = acc")


def test_a_sweep_times_the_default_kernel_apart_from_the_candidates():
    g = load_gemm_shapes()
    shape = g.Shape("custom", "", 48, 9216, 3072)
    medians = {g.REFERENCE: 0.020, g.DEFAULT_VARIANT: 0.023, "a": 0.021, "b": 0.022}
    r = g.sweep_result(shape, "b", medians, {}, "along_n_s4")
    # The default kernel (configuration b with its own order) is timed as a user's call runs it,
    # and is no candidate: it can neither win nor reach the table.
    assert set(r["candidates"]) == {"a", "b"} and r["best"] == "a"
    assert (r["default_config"], r["default_order"], r["default_ms"]) == ("b", "along_n_s4", 0.023)
    assert abs(r["default_over_best"] - 0.023 / 0.021) < 1e-12
    assert abs(r["default_over_cublas"] - 0.023 / 0.020) < 1e-12
    doc = g.table_document([r], "NVIDIA H200", "cmd", "date", 132, g.SETS["plain"])
    assert [e["config"] for e in doc["entries"]] == ["a"]
    # Where the default kernel could not be timed, its configuration's candidate time stands in.
    old = g.sweep_result(shape, "b", {g.REFERENCE: 0.020, "a": 0.021, "b": 0.022}, {})
    assert old["default_ms"] == 0.022 and "default_order" not in old


def test_an_fp8_sweep_lists_candidates_with_declared_f32_scales_and_writes_the_fp8_table():
    g = load_gemm_shapes()
    spec = g.SETS["fp8"]
    cmd = g.candidate_command("evtc", g.Shape("m", "l", 16, 6144, 4096), spec)
    assert cmd[2] == "input sa[m]: f32\ninput sb[n]: f32\nout D: bf16 = acc * sa[m] * sb[n]"
    assert cmd[cmd.index("--dtype") + 1] == "f8e4m3" and cmd[cmd.index("--layout-b") + 1] == "c"
    assert "--dtype" not in g.candidate_command("evtc", g.Shape("m", "l", 16, 6144, 4096), g.SETS["plain"])
    result = {"m": 16, "n": 6144, "k": 4096, "label": "x", "cublas_ms": 0.02, "best": "a", "best_ms": 0.019,
              "candidates": {"a": 0.019}, "errors": {}}
    doc = g.table_document([result], "NVIDIA H100 80GB HBM3", "cmd", "date", 132, spec)
    assert (doc["dtype"], doc["epilogue"]) == ("f8e4m3", spec.expr)
    # One set per sweep, plain or fp8.
    with pytest.raises(SystemExit):
        g.main(["--sweep", "--set", "silu", "--evtc", "evtc", "--table-out", "t.json", "--dry-run"])
    with pytest.raises(SystemExit):
        g.main(["--sweep", "--set", "plain,fp8", "--evtc", "evtc", "--table-out", "t.json", "--dry-run"])
    assert g.main(["--sweep", "--set", "fp8", "--quick", "--evtc", "evtc", "--table-out", "t.json", "--dry-run"]) == 0


def test_layouts_reach_the_candidate_listing_and_kernels_and_only_rc_writes_a_table(capsys):
    g = load_gemm_shapes()
    shape = g.Shape("m", "l", 4096, 2048, 8192)
    cmd = g.candidate_command("evtc", shape, g.SETS["plain"], "cr")
    assert (cmd[cmd.index("--layout-a") + 1], cmd[cmd.index("--layout-b") + 1]) == ("c", "r")
    assert g.SETS["residual"].compile_options("rr") == {"a_layout": "row", "b_layout": "row"}
    assert g.SETS["fp8"].compile_options()["b_layout"] == "col"
    # A residual table says what it was measured with; the D = acc ones have no kind.
    result = {"m": 1024, "n": 4096, "k": 4096, "label": "x", "cublas_ms": 0.05, "best": "a", "best_ms": 0.05,
              "candidates": {"a": 0.05}, "errors": {}}
    assert g.table_document([result], "NVIDIA H200", "cmd", "date", 132, g.SETS["residual"])["kind"] == "residual"
    assert "kind" not in g.table_document([result], "NVIDIA H200", "cmd", "date", 132, g.SETS["plain"])
    # A --configs sweep writes no table without --table-out, in any layout.
    configs = ["--sweep", "--configs", "coop_256x128x64_c1x2_persistent", "--dry-run"]
    assert g.main([*configs, "--set", "residual", "--layout", "rr"]) == 0
    assert "table: (none" in capsys.readouterr().out
    for argv, message in (
            ([*configs, "--set", "silu", "--table-out", "t.json"], "another set sweeps --configs only"),
            ([*configs, "--table-out", "t.json", "--layout", "rr"], "--table-out: the selection tables are measured"),
            (["--set", "fp8", "--layout", "rr", "--dry-run"], "the fp8 set's reference"),
            (["--sweep", "--evtc", "x", "--dry-run"], "--sweep needs --evtc PATH and --table-out FILE")):
        with pytest.raises(SystemExit):
            g.parse_args(argv)
        assert message in capsys.readouterr().err


def test_matmul_heuristics_matches_evtc_candidates_by_tile_cluster_and_split():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_matmul_heuristics", ROOT / "bench" / "matmul_heuristics.py")
    h = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(h)
    assert h.key_of_name("coop_128x256x64_c2x1_persistent") == (128, 256, 64, 2, 1, 1)
    assert h.key_of_name("pingpong_64x128x64_c1x2_splitk3") == (64, 128, 64, 1, 2, 3)
    assert h.key_of_name("coop_128x256x64_c1x1_streamk") is None  # no split-K factor to match
    assert h.key_of_name("pingpong_64x16x128_c1x1_persistent_swap") is None
    config = {"tile": [128, 256, 64], "cluster": [2, 1], "split_k": 0}
    candidates = {"coop_128x256x64_c2x1_persistent": 1.2, "pingpong_128x256x64_c2x1_persistent": 1.1,
                  "coop_128x256x64_c1x1_persistent": 1.0}
    # Either schedule of the same tile, cluster and split-K (0 and 1 both mean none), fastest first.
    assert h.measured(candidates, h.key_of_config(config)) == [1.1, 1.2]


def test_orders_from_keeps_the_untransposed_configuration_the_old_table_measured():
    g = load_gemm_shapes()
    old = {"command": "a", "measured": "then", "entries": [
        {"m": 16, "n": 4096, "k": 4096, "config": "pingpong_64x16x128_c1x1_persistent_swap", "ms": 1.0,
         "unswapped_config": "pingpong_64x64x128_c1x1_persistent", "unswapped_ms": 1.2},
        {"m": 32, "n": 4096, "k": 4096, "config": "pingpong_64x64x128_c1x1_persistent", "ms": 2.0},
        {"m": 64, "n": 4096, "k": 4096, "config": "coop_128x256x64_c2x1_persistent", "ms": 3.0}]}
    doc = {"command": "b", "measured": "now", "entries": [
        {"m": 16, "n": 4096, "k": 4096, "config": "pingpong_64x16x256_c1x1_persistent_swap", "ms": 0.9},
        {"m": 32, "n": 4096, "k": 4096, "config": "pingpong_64x16x128_c1x1_persistent_swap", "ms": 1.9}]}
    g.merge_tables(doc, old, "orders")
    by_m = {e["m"]: e for e in doc["entries"]}
    assert (by_m[16]["unswapped_config"], by_m[16]["unswapped_ms"]) == ("pingpong_64x64x128_c1x1_persistent", 1.2)
    # the old untransposed winner becomes the new transposed winner's fallback
    assert (by_m[32]["unswapped_config"], by_m[32]["unswapped_ms"]) == ("pingpong_64x64x128_c1x1_persistent", 2.0)
    assert by_m[64] == old["entries"][2] and doc["command"] == "a && b" and doc["measured"] == "then; orders now"


def test_a_refining_sweep_keeps_the_faster_untransposed_fallback():
    g = load_gemm_shapes()
    old = {"command": "a", "measured": "then", "entries": [
        {"m": 16, "n": 4096, "k": 4096, "config": "pingpong_64x16x128_c1x1_persistent_swap", "ms": 1.0,
         "unswapped_config": "pingpong_64x64x128_c1x1_persistent", "unswapped_ms": 1.2},
        {"m": 32, "n": 4096, "k": 4096, "config": "pingpong_64x16x128_c1x1_persistent_swap", "ms": 1.0,
         "unswapped_config": "pingpong_64x64x128_c1x1_persistent", "unswapped_ms": 1.2}]}
    doc = {"command": "b", "measured": "now", "entries": [
        # the refining sweep timed a slower untransposed candidate: the old fallback stays
        {"m": 16, "n": 4096, "k": 4096, "config": "pingpong_64x16x128_c1x1_persistent_swap", "ms": 0.9,
         "unswapped_config": "pingpong_64x80x128_c1x1_persistent", "unswapped_ms": 1.5},
        # and a faster one: it replaces the old fallback
        {"m": 32, "n": 4096, "k": 4096, "config": "pingpong_64x16x128_c1x1_persistent_swap", "ms": 0.9,
         "unswapped_config": "pingpong_64x112x128_c1x1_persistent", "unswapped_ms": 1.1}]}
    g.merge_tables(doc, old, "refined")
    by_m = {e["m"]: e for e in doc["entries"]}
    assert (by_m[16]["unswapped_config"], by_m[16]["unswapped_ms"]) == ("pingpong_64x64x128_c1x1_persistent", 1.2)
    assert (by_m[32]["unswapped_config"], by_m[32]["unswapped_ms"]) == ("pingpong_64x112x128_c1x1_persistent", 1.1)
    assert doc["measured"] == "then; refined now"


@pytest.mark.parametrize("argv, message", [
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--retime", "x112x"],
     "--retime belongs to --refine .it says which earlier timings to repeat."),
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--table-base", "old.json"],
     "--table-base belongs to --refine .--orders-from merges into its own table."),
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--refine", "a.json", "--retime", "("],
     "argument --retime: not a regular expression: '\\(' "),
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--refine", "a.json", "--seed-from", "b.json"],
     "--seed-from picks the candidates itself: give it without --refine and --orders-from"),
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--seed-from", "b.json", "--seed-top", "0"],
     "--seed-top must be 1 or more"),
    (["--seed-from", "b.json"], "--seed-from belongs to --sweep"),
    (["--configs", "coop_128x128x64_c1x1_persistent"], "--configs belongs to --sweep"),
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--configs", "coop_128x128x64_c1x1_persistent,128x64"],
     "argument --configs: not a configuration name: 128x64 "),
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--configs", "coop_128x128x64_c1x1_persistent",
      "--refine", "a.json"],
     "--configs names the configurations itself: give it without --refine, --seed-from and --orders-from"),
    (["--table-times-from", "c.json", "--table-out", "t.json"],
     "--table-times-from needs --table-base TABLE.json and --table-out FILE"),
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--table-times-from", "c.json"],
     "--table-times-from reads compare runs: give it without --sweep"),
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--orders-agree", "s.json"],
     "--orders-agree reads earlier sweeps' results: give it without --sweep"),
    (["--orders-agree", "s.json", "--table-times-from", "c.json", "--table-base", "b.json", "--table-out", "t.json"],
     "--table-times-from and --orders-agree each write a table: give one"),
    (["--skip", "_128x"], "--skip belongs to --sweep"),
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--configs", "coop_128x128x64_c1x1_persistent",
      "--skip", "_128x"],
     "--skip filters the listed candidates: give it without --configs and --orders-from"),
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--skip", "["],
     "argument --skip: not a regular expression"),
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--compile-only"],
     "--compile-only belongs to the comparison .the sweep compiles its own candidates."),
    (["--passes", "0"], "--passes must be at least 1"),
    (["--sweep", "--evtc", "x", "--table-out", "t.json", "--passes", "2"],
     "--passes belongs to the comparison"),
])
def test_sweep_options_that_need_refine_or_a_regex_say_so(argv, message, capsys):
    g = load_gemm_shapes()
    with pytest.raises(SystemExit):
        g.parse_args(argv)
    assert re.search(message, capsys.readouterr().err)


def load_train_steps():
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "bench"))  # its sibling modules models and result_files
    spec = importlib.util.spec_from_file_location("bench_train_steps", ROOT / "bench" / "train_steps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_models_merge_stacked_expert_weights_outside_training_only():
    import torch

    models = load_train_steps().models

    def moe():
        torch.manual_seed(0)
        return models.MoE(hidden=64, experts=2, top_k=1, ffn=32)

    def shared(m):
        return m.w1.untyped_storage().data_ptr() == m.w3.untyped_storage().data_ptr()

    inference, before = moe(), moe()
    assert models.merge_projections(inference, "moe", "prefill") == ["MoE: w1 + w3"]
    assert shared(inference)
    assert torch.equal(inference.w1, before.w1) and torch.equal(inference.w3, before.w3)
    training = moe()
    assert models.merge_projections(training, "moe", "train") == []
    assert not shared(training)


def test_train_steps_judges_evtc_by_the_spread_of_the_two_plain_variants():
    t = load_train_steps()
    compile_ = [2.0, 1.5, 1.25]
    losses = {"compile": compile_, "control": list(compile_), "eager": [2.0, 1.51, 1.24],
              "evtc": [2.0, 1.505, 1.255]}
    verdict = t.judge(losses)
    assert verdict["spread"] == pytest.approx(0.01) and verdict["within_spread"]
    assert verdict["max_deviation"]["evtc"] == pytest.approx(0.005)
    # Further from plain compile than eager is: outside; a NaN loss is the worst deviation.
    assert not t.judge({**losses, "evtc": [2.0, 1.5, 1.27]})["within_spread"]
    assert t.judge({**losses, "evtc": [2.0, float("nan"), 1.25]})["max_deviation"]["evtc"] == float("inf")
    row = {"model": "llama_mlp", "mode": "default", "losses": losses, "fused": 2, "gemms": 8, **verdict}
    table = t.markdown_table({"gpu": "G", "torch": "2", "date": "d", "steps": 3, "lr": 1e-4, "rows": [row]})
    assert "| llama_mlp | default | 2 | 1.25 | 0.005 | 0.01 | 0 | yes | 2 / 8 | – |" in table
    # With the float64 loss of the first batch: each variant's first loss minus it.
    errors = t.first_step_errors(losses, 1.9996)
    assert errors["compile"] == pytest.approx(4e-4) and errors["eager"] == pytest.approx(4e-4)
    row["first_step_error"] = errors
    table = t.markdown_table({"gpu": "G", "torch": "2", "date": "d", "steps": 3, "lr": 1e-4, "rows": [row]})
    assert "| 2 / 8 | +0.0004 / +0.0004 |" in table


def test_train_steps_passes_evtc_options_to_the_evtc_backend():
    t = load_train_steps()
    args = t.parse_args(["--evtc-options", '{"evtc.precise_math": true}'])
    assert args.evtc_options == {"evtc.precise_math": True}
    kwargs = t.models.compile_kwargs(False, args.evtc_options, True)
    assert kwargs == {"options": {"evtc.precise_math": True}}
    assert t.models.compile_kwargs(False, args.evtc_options, False) == {"options": {}}


@pytest.mark.parametrize("option, attribute", [("--decode-batch", "decode_batch"), ("--train-batch", "train_batch")])
def test_models_batch_options_must_be_positive(option, attribute, monkeypatch, capsys):
    models = load_train_steps().models
    monkeypatch.setattr(sys, "argv", ["models.py", option, "0"])
    with pytest.raises(SystemExit):
        models.parse_args()
    assert f"{option} must be at least 1, got 0" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["models.py", option, "16"])
    assert getattr(models.parse_args(), attribute) == 16


def test_models_batches_reach_the_row_notes(monkeypatch):
    from types import SimpleNamespace

    models = load_train_steps().models
    layer, mlp = SimpleNamespace(heads=32), SimpleNamespace(heads=0)
    assert "batch 4 x 1024 (memory)" in models.row_notes("llama_mlp", "train", "default", mlp)
    monkeypatch.setattr(models, "DECODE_BATCH", 16)
    monkeypatch.setattr(models, "TRAIN_BATCH", 8)
    assert "batch 16, KV cache of 1023 positions, static address" in models.row_notes("llama", "decode", "cudagraphs",
                                                                                        layer)
    assert "input (16, 1, hidden)" in models.row_notes("llama_mlp", "decode", "cudagraphs", mlp)
    notes = models.row_notes("llama_mlp", "train", "default", mlp)
    assert "batch 8 x 1024" in notes and "batch 8 x 1024 (memory)" not in notes


def test_models_notes_a_host_bound_step_from_its_profile():
    models = load_train_steps().models
    # The gpt2 training row on an H200 (bench/results/20261201-0141-h200-models-train-gpt2-profile.json).
    gpt2 = {"compile": {"span_us": 4463.8, "busy_us": 1663.0}, "evtc": {"span_us": 4021.9, "busy_us": 1598.2}}
    assert models.host_bound_note(gpt2) == ("host-bound: the GPU was busy 1663 of 4464 us per call under compile "
                                            "(37%), 1598 of 4022 us per call under evtc (40%)")
    # A step whose GPU is busy for most of its span, under either variant, is not noted.
    busy = {"compile": {"span_us": 1000.0, "busy_us": 950.0}, "evtc": {"span_us": 1000.0, "busy_us": 700.0}}
    assert models.host_bound_note(busy) == ""
    assert models.host_bound_note({"compile": {}, "evtc": {}}) == ""  # no kernel events recorded


@pytest.mark.parametrize("script, argv, message", [
    ("train_steps", ["--steps", "0"], "--steps must be 1 or more"),
    ("train_steps", ["--lr", "0"], "--lr must be positive"),
    ("train_steps", ["--models", "llama,bert"], "unknown \\['bert'\\]; choose from"),
    ("epilogue_sizes", ["--sizes", "4096x11008"], "--sizes: a size is MxNxK with three positive integers, got '4096x11008'"),
    ("epilogue_sizes", ["--sizes", "0x8x8"], "--sizes: a size is MxNxK"),
    ("epilogue_sizes", ["--exprs", "dswiglu,gelu"], "--exprs: unknown 'gelu'; choose from plain, dswiglu, swiglu_forward"),
    ("epilogue_sizes", ["--expr", "relu"], "--expr takes NAME=EXPR_OR_FILE, got 'relu'"),
    ("epilogue_sizes", ["--rounds", "0"], "--rounds must be at least 1, got 0"),
])
def test_bench_option_errors(script, argv, message, capsys):
    bench = load_train_steps() if script == "train_steps" else load_epilogue_sizes()
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert re.search(message, capsys.readouterr().err)


def test_alternating_rounds_call_the_variants_in_turn_and_find_one_that_raises(monkeypatch):
    g = load_gemm_shapes()
    clock = [0.0]

    class FakeEvent:
        def __init__(self, **_):
            self.t = None

        def record(self):
            clock[0] += 1.0
            self.t = clock[0]

        def elapsed_time(self, end):
            return end.t - self.t

    class Cuda:
        Event = FakeEvent

        @staticmethod
        def synchronize():
            pass

    fake = type("torch", (), {"cuda": Cuda})
    monkeypatch.setitem(sys.modules, "torch", fake)
    timer = g.Timer(backlog=False, alternate=True)
    calls = []

    def variant(name, cost=0.0, fails=False):
        def call():
            if fails:
                raise RuntimeError(f"{name} failed")
            calls.append(name)
            clock[0] += cost
        return call

    medians, rounds, errors = timer.interleaved({"a": variant("a", 2.0), "b": variant("b", 4.0)}, 2, 3)
    assert calls == ["a", "b"] * 3 + ["b", "a"] * 3  # in turn; the order rotates each round
    assert medians == {"a": 3.0, "b": 5.0} and len(rounds) == 2 and not errors
    calls.clear()
    medians, _, errors = timer.interleaved({"a": variant("a"), "x": variant("x", fails=True)}, 2, 2)
    assert set(errors) == {"x"} and "x failed" in errors["x"] and set(medians) == {"a"}


def test_token_scoring_refuses_a_token_count_that_is_not_whole_sequences(monkeypatch, capsys):
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_token_scoring", ROOT / "bench" / "token_scoring.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["token_scoring.py", "--tokens", "1000"])
    with pytest.raises(SystemExit):
        module.main()
    assert "--tokens must be a positive multiple of 1024" in capsys.readouterr().err


@pytest.fixture
def result_files_at_a_fixed_minute(monkeypatch):
    """bench/result_files.py with its clock stopped at 2026-11-28 12:12 UTC."""
    sys.path.insert(0, str(ROOT / "bench"))
    import datetime

    import result_files

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 11, 28, 12, 12, tzinfo=tz)

    monkeypatch.setattr(result_files.datetime, "datetime", Frozen)
    return result_files


def test_a_second_result_of_the_same_kind_in_the_same_minute_keeps_the_first(tmp_path, result_files_at_a_fixed_minute):
    result_files = result_files_at_a_fixed_minute
    first = result_files.result_base(str(tmp_path), "NVIDIA H200", "gemm-shapes")
    assert first == str(tmp_path / "20261128-1212-h200-gemm-shapes")
    (tmp_path / "20261128-1212-h200-gemm-shapes.json").write_text("{}")
    second = result_files.result_base(str(tmp_path), "NVIDIA H200", "gemm-shapes")
    assert second == first + "-2"
    (tmp_path / "20261128-1212-h200-gemm-shapes-2.png").write_bytes(b"")
    assert result_files.result_base(str(tmp_path), "NVIDIA H200", "gemm-shapes") == first + "-3"
    assert result_files.result_base(str(tmp_path), "NVIDIA H200", "models") == str(tmp_path / "20261128-1212-h200-models")


def test_result_base_claims_its_name_so_that_runs_started_together_get_different_ones(tmp_path, monkeypatch,
                                                                                       result_files_at_a_fixed_minute):
    result_files = result_files_at_a_fixed_minute
    earlier = tmp_path / "20261128-1212-h200-models.json"
    earlier.write_text('{"rows": [1]}')
    # Neither caller writes anything between the calls: only the claim tells them apart.
    first = result_files.result_base(str(tmp_path), "NVIDIA H200", "models")
    second = result_files.result_base(str(tmp_path), "NVIDIA H200", "models")
    assert first == str(tmp_path / "20261128-1212-h200-models-2")
    assert second == str(tmp_path / "20261128-1212-h200-models-3")
    assert pathlib.Path(first + ".json").exists() and pathlib.Path(second + ".json").exists()
    assert earlier.read_text() == '{"rows": [1]}'
    # A name claimed after the folder was listed (another process) is skipped, not shared.
    listdir = result_files.os.listdir
    monkeypatch.setattr(result_files.os, "listdir", lambda d: [f for f in listdir(d) if "-4" not in f])
    (tmp_path / "20261128-1212-h200-models-4.json").write_text("{}")
    assert result_files.result_base(str(tmp_path), "NVIDIA H200", "models") == str(tmp_path / "20261128-1212-h200-models-5")
    assert (tmp_path / "20261128-1212-h200-models-4.json").read_text() == "{}"
    assert result_files.result_base(str(tmp_path), None, "compile-phases", slug="Node7") == str(
        tmp_path / "20261128-1212-Node7-compile-phases")


def test_the_recorded_command_names_no_path_of_the_working_tree(monkeypatch, tmp_path):
    g = load_gemm_shapes()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["gemm_shapes.py", "--sweep", "--evtc", str(tmp_path / "build" / "evtc"),
                                      "--table-out", "/elsewhere/t.json"])
    assert g.command_line() == "python3 bench/gemm_shapes.py --sweep --evtc build/evtc --table-out /elsewhere/t.json"



def test_configs_are_deduplicated_in_order():
    g = load_gemm_shapes()
    args = g.parse_args(["--sweep", "--evtc", "x", "--table-out", "t.json", "--configs",
                         "pingpong_64x80x128_c1x1_persistent_swap, pingpong_64x64x128_c1x1_persistent_swap,"
                         "pingpong_64x80x128_c1x1_persistent_swap"])
    assert args.configs == ["pingpong_64x80x128_c1x1_persistent_swap", "pingpong_64x64x128_c1x1_persistent_swap"]


def load_bench(name):
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_main_error(name, argv, monkeypatch, capsys) -> str:
    """bench/<name>.py's main() run with `argv`, which must exit (argparse's error): its stderr."""
    module = load_bench(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    with pytest.raises(SystemExit):
        module.main()
    return capsys.readouterr().err


def test_lm_head_dw_chunks_one_chunk_is_plain_and_a_bf16_accumulator_adds_error(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    module = load_bench("lm_head_dw_chunks")
    monkeypatch.setattr(sys, "argv", ["lm_head_dw_chunks.py", "--tokens", "256", "--vocab", "512", "--hidden", "64",
                                      "--chunks", "1,8", "--out", str(tmp_path)])
    assert module.main() == 0
    (result,) = tmp_path.glob("*-cpu-lm-head-dw-chunks.json")
    rows = {r["chunks"]: r for r in json.loads(result.read_text())["rows"]}
    # One chunk: both accumulators round once, as plain compile does.
    assert rows[1]["bf16_accumulator"] == rows[1]["f32_accumulator"]
    # Eight: the f32 accumulator still rounds once; the bf16 one eight times.
    assert rows[8]["f32_accumulator"] == pytest.approx(rows[1]["f32_accumulator"], rel=1e-3)
    assert rows[8]["bf16_accumulator"] > 1.2 * rows[1]["bf16_accumulator"]


@pytest.mark.parametrize("argv, message", [
    (["--chunks", "2,x"], "'2,x' is not a comma-separated list of integers"),
    (["--chunks", "0"], "must list chunk counts of at least 1"),
    (["--tokens", "100", "--chunks", "3"], "3 does not divide --tokens 100"),
])
def test_lm_head_dw_chunks_option_errors(argv, message, monkeypatch, capsys):
    pytest.importorskip("torch")
    assert message in bench_main_error("lm_head_dw_chunks", argv, monkeypatch, capsys)


@pytest.mark.parametrize("argv, message", [
    (["--timeline", "--calls", "1"], "--calls: 1; the gap between calls needs at least 2"),
    (["--rows", "W1-8192,decode-1x2x3"], "--rows: unknown row(s) decode-1x2x3; known: W1-8192,"),
    (["--rows", "W1-8192,W6", "--configs", "pingpong_64x16x128_c1x1_persistent_kparts4_swap"],
     "--configs: dense rows only"),
])
def test_profile_rows_option_errors(argv, message, monkeypatch, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("evtc")
    assert message in bench_main_error("profile_rows", argv, monkeypatch, capsys)


@pytest.mark.parametrize("argv, message", [
    (["--m", "64,x"], "'64,x' is not a comma-separated list of integers"),
    (["--m", "64,0"], "--m: every M must be positive"),
    (["--calls", "0"], "--rounds, --calls and --rotate-mb must be positive"),
])
@pytest.mark.parametrize("bench", ["residual_forms", "stacked_gemms"])
def test_timed_benchmarks_option_errors(bench, argv, message, monkeypatch, capsys):
    assert message in bench_main_error(bench, argv, monkeypatch, capsys)


def test_residual_forms_says_it_needs_a_gpu(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("evtc")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmark would run")
    module = load_bench("residual_forms")
    monkeypatch.setattr(sys, "argv", ["residual_forms.py", "--quick"])
    assert module.main() == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def load_epilogue_sizes():
    sys.path.insert(0, str(ROOT / "bench"))  # its sibling modules result_files and models
    spec = importlib.util.spec_from_file_location("bench_epilogue_sizes", ROOT / "bench" / "epilogue_sizes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_epilogue_sizes_builds_every_kernel_before_timing_and_reports_the_model(tmp_path):
    bench = load_epilogue_sizes()
    expr_file = tmp_path / "relu.evt"
    expr_file.write_text("out D: bf16 = relu(acc)")
    args = bench.parse_args(["--exprs", "dswiglu", "--expr", f"relu:row={expr_file}",
                             "--configs", "default,pingpong_128x128x64_c2x1_persistent", "--sizes", "520x1032x264"])
    assert args.sizes == [(520, 1032, 264)]
    assert args.epilogues["relu"] == ("out D: bf16 = relu(acc)", "row")
    entries = bench.kernels(args)
    assert [(e["expr"], e["config"], e["b_layout"]) for e in entries] == [
        ("dswiglu", "default", "row"), ("dswiglu", "pingpong_128x128x64_c2x1_persistent", "row"),
        ("relu", "default", "row"), ("relu", "pingpong_128x128x64_c2x1_persistent", "row")]
    assert {o.name for o in entries[0]["kernel"].inputs} == {"g", "u"}
    assert entries[1]["kernel"].config_for(4096, 11008, 4096) == "pingpong_128x128x64_c2x1_persistent"
    numbers = bench.model(entries[0]["kernel"], 4096, 11008, 4096)
    assert numbers["model_fused_us"] > numbers["model_cublas_us"] > 0
    # A configuration that does not exist fails before any GPU work, naming it.
    bad = bench.parse_args(["--exprs", "plain", "--configs", "coop_999x1x64_c1x1_persistent"])
    with pytest.raises(Exception, match="999"):
        bench.kernels(bad)
    rows = [{"expr": "dswiglu", "config": "default", "runs": "pingpong_128x128x64_c2x1_persistent", "b_layout": "row",
             "m": 4096, "n": 11008, "k": 4096, "fused_ms": 0.5, "mm_ms": 0.48, "fused_over_mm": 0.5 / 0.48,
             "model_fused_us": 550.0, "model_cublas_us": 494.7}]
    assert "| dswiglu | 4096×11008×4096 | default | pingpong_128x128x64_c2x1_persistent | 0.5000 | 0.4800 | 1.042 | 1.100 |" \
        in bench.table(rows)
    assert "+10.0% of the measured" in bench.line(rows[0])
    assert "[ran the" not in bench.line(rows[0])
    assert "(pingpong_128x128x64_c2x1_persistent) [ran the fallback path]: fused" in bench.line({**rows[0], "path": "fallback"})
    bench.plot(rows, str(tmp_path / "plot"))
    assert (tmp_path / "plot.png").exists() or "matplotlib" not in sys.modules


def test_models_flag_a_fused_op_far_from_the_cost_models_ratio():
    models = load_train_steps().models
    assert models.model_gap_note(0.941, 1.075) == ""  # within the gap
    assert models.model_gap_note(1.913, 1.050) == " << 1.82x the model's ratio: look at its configuration"
    assert models.model_gap_note(0.70, 1.0).startswith(" << 0.70x")


def test_rounding_study_rounds_only_the_stages_it_names():
    pytest.importorskip("torch")
    study = load_bench("rounding_study")
    layer = study.Layer(tokens=1024, seed=3, hidden=64, heads=4, ffn=256)
    reference = layer.objective(())
    # Every stage's rounding moves the objective by itself, and the rows are what they say.
    alone = {s: layer.objective((s,)) - reference for s in study.STAGES}
    assert all(offset != 0 for offset in alone.values()), alone
    data = study.study(layer)
    assert data["reference"] == reference
    assert len(data["offsets"]) == 1 + 2 * len(study.STAGES)
    assert data["offsets"]["only fc"] == alone["fc"]
    every = layer.objective(study.STAGES) - reference
    assert data["offsets"]["every stage"] == every
    assert data["offsets"]["all but fc"] == layer.objective([s for s in study.STAGES if s != "fc"]) - reference
    # Each pipeline is its roundings: plain compile never rounds the first residual sum (Inductor
    # recomputes it where it is read); evtc stores it rounded, as eager does.
    pipes = data["pipelines"]
    assert set(study.PIPELINES["eager"]) - set(study.PIPELINES["plain compile"]) == {"y", "y_ln"}
    assert pipes["evtc"]["rounded"] == list(study.STAGES)
    assert set(study.STAGES) - set(pipes["evtc before the cast-mode fix"]["rounded"]) == {"proj", "mlp", "fc"}
    assert pipes["evtc, residual_sums f32 or recomputed"]["rounded"] == list(study.PIPELINES["plain compile"])
    exact = layer.forward(())
    for name, rounded in study.PIPELINES.items():
        out = layer.forward(rounded)
        assert pipes[name]["rel_l2"] == float((out - exact).norm() / exact.norm()) > 0
        assert pipes[name]["offset"] == float(out.pow(2).mean()) - reference
    assert layer.forward(("y_ln",)).equal(layer.forward(("y_ln", "y_ln")))
    assert not layer.forward(("y_ln",)).equal(layer.forward(("y",)))
    table = study.markdown_table({"tokens": 1024, "seed": 3, **data})
    assert f"| all but fc | {data['offsets']['all but fc']:+.3e} |" in table
    assert f"| plain compile | y, y_ln | {pipes['plain compile']['rel_l2']:.3e} |" in table


@pytest.mark.parametrize("tokens", ["0", "1500"])
def test_rounding_study_takes_whole_sequences(tokens, monkeypatch, capsys):
    assert "--tokens must be a positive multiple of 1024" in bench_main_error(
        "rounding_study", ["--tokens", tokens], monkeypatch, capsys)


def test_models_check_each_parameters_gradient_against_plain_compiles():
    torch = pytest.importorskip("torch")
    models = load_train_steps().models
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1, bias=False))
    ref = models.copy.deepcopy(net).double()
    x = torch.randn(5, 8)

    def step(m, inp):
        def run():
            m.zero_grad(set_to_none=True)
            out = m(inp)
            out.square().mean().backward()
            return out
        return run

    _, ref_grads = models.outputs(step(ref, x.double()), ref, "train")
    assert list(ref_grads) == ["0.weight", "0.bias", "2.weight"]
    _, grads = models.outputs(step(net, x), net, "train")
    rel, max_abs, per = models.gradient_errors(grads, ref_grads)
    assert 0 < rel < 1e-5 and 0 < max_abs < 1e-5 and set(per) == set(ref_grads)
    with pytest.raises(ValueError, match=r"\['0.bias'\]"):
        models.gradient_errors({k: v for k, v in grads.items() if k != "0.bias"}, ref_grads)
    # A reference gradient of zeros: the absolute error, not a division by zero.
    assert models.deviation(torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64))[0] == 2.0

    row = {"grad_param_errors": {"a.weight": {"eager": 3e-3, "compile": 2e-3, "evtc": 2.2e-3},
                                 "a.bias": {"eager": 1e-3, "compile": 1e-3, "evtc": 5e-4},
                                 "b.weight": {"eager": 0.0, "compile": 0.0, "evtc": 0.0}}}
    check = models.parameter_check(row)
    assert check == {"params": 3, "above_compile": 1, "worst_param": "a.weight",
                     "worst_ratio": pytest.approx(1.1), "eager_ratio_there": pytest.approx(1.5)}
    assert models.parameter_check({}) is None
    table = models.markdown_table({"gpu": "G", "torch": "t", "date": "d", "rows": [
        {**models.new_row("gpt2", "train", "default"), "grad_param_check": check}]})
    assert "| 1 of 3 (1.10× at a.weight; eager 1.50×) |" in table


def test_models_alternative_variant_is_checked_and_tabled_beside_evtc(monkeypatch):
    pytest.importorskip("torch")
    models = load_train_steps().models
    row = {"grad_param_errors": {"a.weight": {"eager": 3e-3, "compile": 2e-3, "evtc": 2.2e-3, "evtc_alt": 1.8e-3},
                                 "a.bias": {"eager": 1e-3, "compile": 1e-3, "evtc": 5e-4, "evtc_alt": 1.2e-3}}}
    alt = models.parameter_check(row, "evtc_alt")
    assert alt["above_compile"] == 1 and alt["worst_param"] == "a.bias" and alt["worst_ratio"] == pytest.approx(1.2)
    assert models.parameter_check(row)["worst_param"] == "a.weight"
    # A row timed without the alternative has no check for it.
    assert models.parameter_check({"grad_param_errors": {"w": {"compile": 1.0, "evtc": 1.0}}}, "evtc_alt") is None
    monkeypatch.setattr(models.sys, "argv", ["models.py", "--alternative", '{"evtc.residual_sums": "f32"}'])
    assert models.parse_args().alternative == {"evtc.residual_sums": "f32"}
    table = models.markdown_table({"gpu": "G", "torch": "t", "date": "d", "rows": [
        {**models.new_row("gpt2", "train", "default"), "eager_ms": 3.0, "compile_ms": 2.0, "evtc_ms": 1.9,
         "speedup": 2.0 / 1.9, "speedup_rounds": [1.05], "alt_speedup": 2.0 / 1.95, "error_evtc_alt": 2.5e-3,
         "grad_param_check": models.parameter_check(row), "grad_param_check_alt": alt}]})
    assert "; alternative 1.026×" in table and "; alternative 2.5e-03" in table
    assert "; alternative 1 of 2 (1.20× at a.bias)" in table
