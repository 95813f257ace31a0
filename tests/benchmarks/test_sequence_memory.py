"""``benchmarks.attention.sequence_memory``: the ring's floor beside each cell, and the XLA:CPU
scheduler a run compiles with."""

import jax
import pytest

from benchmarks import xla_flags
from benchmarks.attention import sequence_memory as sm


def _temp(compiled) -> int:
    analysis = compiled.memory_analysis()
    assert analysis is not None
    return analysis.temp_size_in_bytes


def test_the_floor_is_the_step_at_t_over_n_plus_the_ring_state():
    """Each floor adds the one-device program compiled at T / n tokens (compiled here again,
    apart) and RING_STATE arrays the size of a device's q, over the whole program's temporaries
    it is given."""
    tokens, shards = 512, [2, 4]
    whole = sm.attention_inputs(tokens, sm.HEADS)
    one = {
        (tokens, name): _temp(jax.jit(program).lower(*whole).compile())
        for name, program in sm.programs(sm.one_device).items()
    }
    rows = sm.floors(tokens, shards, one)
    assert [(r["program"], r["shards"]) for r in rows] == [
        (p, n) for p in ("gradient", "reverse-over-forward") for n in shards
    ]
    q_bytes = sm.BATCH * tokens * sm.HEADS * sm.HEAD_DIM * 4
    for r in rows:
        program = sm.programs(sm.one_device)[r["program"]]
        part = sm.attention_inputs(tokens // r["shards"], sm.HEADS)
        base, step = one[(tokens, r["program"])], _temp(jax.jit(program).lower(*part).compile())
        assert r["step"] == step < base
        assert r["state"] == sm.RING_STATE[r["program"]] * q_bytes // r["shards"]
        assert r["floor"] == pytest.approx((step + r["state"]) / base)
    by = {(r["program"], r["shards"]): r["floor"] for r in rows}
    assert by[("gradient", 4)] < by[("gradient", 2)] < 1
    assert by[("reverse-over-forward", 4)] < by[("reverse-over-forward", 2)]


def _result(with_floors: bool) -> dict:
    rows = [
        {"tokens": 4096, "program": "gradient", "shards": 1, "temp": 100},
        {"tokens": 4096, "program": "gradient", "shards": 4, "mode": "shard_map"}
        | {"scheme": "ring", "temp": 40, "of_one": 0.4, "collectives": {}},
    ]
    floors = [{"tokens": 4096, "program": "gradient", "shards": 4, "floor": 0.375}]
    return {"rows": rows} | ({"floors": floors} if with_floors else {})


def test_the_table_sets_each_cell_beside_its_floor():
    head, _, row = sm.table(_result(True))
    assert head.split(" | ")[4] == "ring floor" and row.split(" | ")[4:6] == ["0.375", "0.400 |"]
    head, _, row = sm.table(_result(False))  # records before the floors: rendered as they were
    assert "ring floor" not in head and row.split(" | ")[4] == "0.400 |"


def test_the_memory_scheduler_is_probed_and_refused_where_xla_lacks_it(monkeypatch):
    flag = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    monkeypatch.setattr(xla_flags, "known", lambda flags: tuple(flags))
    sm._schedule("concurrency")
    assert flag not in sm.os.environ["XLA_FLAGS"]
    sm._schedule("memory")
    assert sm.os.environ["XLA_FLAGS"].split()[-1] == flag
    monkeypatch.setattr(xla_flags, "known", lambda flags: ())
    missing = r"no .*concurrency_optimized_scheduler.*--scheduler memory"
    with pytest.raises(ValueError, match=missing):
        sm._schedule("memory")


def _ring_result(cells: dict, floors: dict, one: dict) -> dict:
    """A result with one device's temporaries ``one`` {(T, program): bytes}, the ring's cells
    {(T, program, n, mode): temp} and floors {(T, program, n): floor}."""
    rows = [{"tokens": t, "program": p, "shards": 1, "temp": temp} for (t, p), temp in one.items()]
    for (t, p, n, mode), temp in cells.items():
        rows.append(
            {"tokens": t, "program": p, "shards": n, "mode": mode, "scheme": "ring"}
            | {"temp": temp, "of_one": temp / one[(t, p)], "collectives": {}}
        )
    floor_rows = [
        {"tokens": t, "program": p, "shards": n, "floor": f} for (t, p, n), f in floors.items()
    ]
    return {"rows": rows, "floors": floor_rows}


def test_the_floor_summary_counts_cells_within_the_margin_and_names_the_others():
    one = {(4096, "gradient"): 100}
    floors = {(4096, "gradient", 4): 0.5, (4096, "gradient", 8): 0.25}
    cells = {(4096, "gradient", 4, "shard_map"): 57, (4096, "gradient", 4, "explicit"): 58}
    cells |= {(4096, "gradient", 8, "shard_map"): 30, (4096, "gradient", 8, "explicit"): 20}
    summary = sm.floor_summary(_ring_result(cells, floors, one))
    # 57 / 50 = 1.14 holds, 58 / 50 = 1.16 does not; 30 / 25 = 1.20 does not, 20 / 25 holds
    assert summary == (
        "2 of 4 ring cells within 15 % of their floor; over it: "
        "4,096 tokens, gradient, n = 4: 1.14-1.16x; 4,096 tokens, gradient, n = 8: 0.80-1.20x"
    )
    held = {k: 0.9 * v for k, v in floors.items()}
    within = _ring_result({(4096, "gradient", 4, "shard_map"): 40}, held, one)
    assert sm.floor_summary(within) == "1 of 1 ring cells within 15 % of their floor"


def test_the_scheduler_summary_sets_each_program_s_memory_against_the_default():
    default = _ring_result(
        {(4096, p, 4, "shard_map"): 50 for p in ("gradient", "reverse-over-forward")},
        {},
        {(4096, "gradient"): 100, (4096, "reverse-over-forward"): 200},
    )
    memory = _ring_result(
        {
            (4096, "gradient", 4, "shard_map"): 40,
            (4096, "reverse-over-forward", 4, "shard_map"): 25,
        },
        {},
        {(4096, "gradient"): 90, (4096, "reverse-over-forward"): 160},
    )
    assert sm.scheduler_summary(default, memory) == (
        "gradient: one device 0.90x, the ring 0.80x; "
        "reverse-over-forward: one device 0.80x, the ring 0.50x"
    )


def test_the_page_lists_each_floor_with_what_it_adds_up():
    result = _ring_result(
        {(4096, "gradient", 4, "shard_map"): 50}, {}, {(4096, "gradient"): 100 * 2**20}
    )
    result |= {"argv": [], "machine": "m", "commit": "c"}
    assert "floor" not in sm.markdown(result)  # records before the floors
    result["floors"] = [
        {"tokens": 4096, "program": "gradient", "shards": 4}
        | {"step": 30 * 2**20, "state": 7 * 2**20, "floor": 0.37}
    ]
    page = sm.markdown(result)
    assert "| 4,096 | gradient | 4 | 30.0 | 7.0 | 0.370 |" in page
    assert "concurrency scheduler" in page


def test_the_auto_jit_sentence_reads_the_all_to_all_rows_of_each_mode():
    """Each program's span of temporaries x n under Auto jit and its all-to-alls beside
    shard_map's; the ring's rows and the other modes' ratios do not enter."""

    def row(program, n, mode, scheme, of_one, trades):
        cell = {"tokens": 4096, "program": program, "shards": n, "mode": mode}
        return cell | {"scheme": scheme, "of_one": of_one, "collectives": {"all-to-all": trades}}

    rows = [
        row("gradient", 2, "auto jit", "all-to-all", 0.5, 11),
        row("gradient", 4, "auto jit", "all-to-all", 0.26, 11),
        row("gradient", 4, "shard_map", "all-to-all", 0.25, 8),
        row("gradient", 4, "auto jit", "ring", 0.9, 0),
        row("reverse-over-forward", 2, "auto jit", "all-to-all", 0.6, 25),
        row("reverse-over-forward", 4, "auto jit", "all-to-all", 0.3, 25),
        row("reverse-over-forward", 4, "shard_map", "all-to-all", 0.25, 11),
    ]
    sentence = sm.auto_jit_summary({"heads": 8, "rows": rows})
    assert sentence == (
        "with 4,096 tokens over 2 and 4 CPU devices (8 heads), the all-to-all's gradient "
        "program holds 1.00-1.04x of 1 / n of one device's temporaries per device, with 11 "
        "all-to-alls (8 in shard_map), and its R1 program 1.20x, with 25 all-to-alls (11 in "
        "shard_map)"
    )
