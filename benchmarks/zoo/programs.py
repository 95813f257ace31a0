"""What the zoo's critic steps compile to on CPU: convolutions by kind, dots, transposes, copies,
XLA's flops and bytes, for each variant of the penalty.

    python -m benchmarks.zoo.programs [critic ...]   -> the tables of zoo_cpu.md's programs

``figures(compiled, batch)`` reads one compiled program (``jax.jit(step).lower(...).compile()``);
``benchmarks/suites/test_bench_zoo.py`` records it for every program it times, and
``benchmarks/zoo/report.py`` renders both in ``benchmarks/results/zoo/zoo_cpu.md``. Run as a
script, it compiles (no timing) and prints the same tables.

Counted over every computation of the optimised HLO, fused ones included (XLA:CPU keeps each
convolution and dot as an op of its own, some inside a fusion with their elementwise epilogue):

    conv            every convolution
    conv_act        convolutions producing activations (result batch = B or 2B): the critic's
                    forward, its JVP tangents and the input-gradients (transposed convolutions,
                    for stride 1 the same shape as the forward)
    conv_wgrad      convolutions contracting over the batch (result = a kernel): weight gradients
    lhs_dilate      transposed convolutions of strided ones (lhs dilated by the stride: 3 of 4
                    window taps of a stride-2 transposed conv fall on inserted zeros)
    rhs_reversal    window-reversed convolutions
    rhs_dilate      weight gradients of strided convolutions (the window dilated by the stride)
    feature_groups, batch_groups   convolutions with feature_group_count / batch_group_count > 1
    conv_loop       convolutions XLA:CPU cannot hand to its Eigen convolution (the conditions of
                    its PotentiallyImplementedAsEigenConvolution: no window reversal, input and
                    output batch-spatial-feature, kernel spatial-in-out, f16/f32): emitted as
                    scalar loops instead, at a small fraction of Eigen's speed
    loop_gflop      their share of conv_gflop
    conv_gflop      2 x MACs of every convolution at every window position (dilation holes and
                    padding included, as a dense kernel would run them), GFLOP
    dot, dot_gflop  dot ops and their 2 x MACs, GFLOP
    transpose       transpose ops (most inside fusions, where they are the fusion's read pattern)
    transpose_mib   the elements they produce, in MiB (kernels swapped in/out for transposed
                    convolutions, activations relaid out for weight gradients)
    copy            copy ops outside fusions (relayouts run on their own)
    fusions         fusion ops
    flops, bytes    XLA's cost analysis: "flops" and "bytes accessed"
    temp_bytes      the memory analysis' temporary buffers
"""

import math
import re
import sys
import time

import jax

from benchmarks import workloads as W

VARIANTS = ("plain", "naive", "fastgp", "fastgp-reverse", "fastgp-remat", "fastgp-dots")

_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \((.*)\) -> .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+?)(?:\{[^}]*\})? ([\w\-]+)\((.*)$")
_HEADER_PARAM = re.compile(r"([\w.\-]+): (\w+\[[\d,]*\])")
_SHAPE = re.compile(r"\w+\[([\d,]*)\]")


def _dims(shape: str) -> list:
    match = _SHAPE.match(shape)
    if not match:
        return []
    return [int(d) for d in match.group(1).split(",") if d]


def _itemsize(shape: str) -> int:
    kind = shape.split("[", 1)[0]
    return {"f64": 8, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "s16": 2, "u16": 2, "pred": 1}.get(
        kind, 1 if kind in ("s8", "u8") else 4
    )


def _instructions(hlo_text: str):
    """(computation, name, shape, opcode, rest of line, {name: shape}) for every instruction."""
    shapes: dict = {}
    rows = []
    computation = None
    for line in hlo_text.splitlines():
        head = _COMPUTATION.match(line)
        if head:
            computation = head.group(1)
            shapes.update(dict(_HEADER_PARAM.findall(head.group(2))))
            continue
        inst = _INSTRUCTION.match(line)
        if inst:
            name, shape, opcode, rest = inst.groups()
            shapes[name] = shape
            rows.append((computation, name, shape, opcode, rest))
    return rows, shapes


def _fused_computations(rows) -> set:
    called = set()
    for _, _, _, opcode, rest in rows:
        if opcode == "fusion":
            called.update(re.findall(r"calls=%([\w.\-]+)", rest))
    return called


def _operands(rest: str) -> list:
    return re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])


def _conv(rest: str, shape: str, shapes: dict, batch: int) -> dict:
    lhs = _dims(shapes.get(_operands(rest)[0], ""))
    out = _dims(shape)
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", rest)
    window = re.search(r"window=\{([^}]*)\}", rest)
    win = window.group(1) if window else ""
    size = re.search(r"size=([\dx]+)", win)
    window_elems = math.prod(int(s) for s in size.group(1).split("x")) if size else 1
    groups = re.search(r"feature_group_count=(\d+)", rest)
    feature_groups = int(groups.group(1)) if groups else 1
    bgroups = re.search(r"batch_group_count=(\d+)", rest)
    lhs_f = lhs[labels.group(1).index("f")] if labels and lhs else 0
    out_b = out[labels.group(3).index("b")] if labels and out else 0
    spatial = "".join(str(i) for i in range(len(out) - 2))
    canonical = labels is not None and labels.groups() == (
        f"b{spatial}f",
        f"{spatial}io",
        f"b{spatial}f",
    )
    float_type = shape.split("[", 1)[0] in ("f32", "f16")
    return {
        "eigen": canonical and float_type and "rhs_reversal" not in win,
        "act": out_b in (batch, 2 * batch),
        "lhs_dilate": "lhs_dilate" in win,
        "rhs_reversal": "rhs_reversal" in win,
        "rhs_dilate": "rhs_dilate" in win,
        "feature_groups": feature_groups > 1,
        "batch_groups": bgroups is not None and int(bgroups.group(1)) > 1,
        "flop": 2 * math.prod(out) * window_elems * lhs_f / feature_groups,
    }


def _dot_flop(rest: str, shape: str, shapes: dict) -> float:
    lhs = _dims(shapes.get(_operands(rest)[0], ""))
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
    dims = [int(d) for d in contracting.group(1).split(",") if d] if contracting else []
    return 2 * math.prod(_dims(shape)) * math.prod(lhs[d] for d in dims)


def hlo_counts(hlo_text: str, batch: int) -> dict:
    """The op counts and convolution/dot GFLOP of one optimised HLO module (see the docstring)."""
    rows, shapes = _instructions(hlo_text)
    fused = _fused_computations(rows)
    keys = ("conv", "conv_act", "conv_wgrad", "lhs_dilate", "rhs_reversal", "rhs_dilate")
    counts: dict = dict.fromkeys(keys + ("feature_groups", "batch_groups", "conv_loop"), 0)
    counts.update(conv_gflop=0.0, loop_gflop=0.0, dot=0, dot_gflop=0.0)
    counts.update(transpose=0, transpose_mib=0.0, copy=0, fusions=0)
    for computation, _, shape, opcode, rest in rows:
        if opcode == "convolution":
            conv = _conv(rest, shape, shapes, batch)
            counts["conv"] += 1
            counts["conv_act" if conv["act"] else "conv_wgrad"] += 1
            for key in ("lhs_dilate", "rhs_reversal", "rhs_dilate", "feature_groups"):
                counts[key] += int(conv[key])
            counts["batch_groups"] += int(conv["batch_groups"])
            counts["conv_gflop"] += conv["flop"] / 1e9
            if not conv["eigen"]:
                counts["conv_loop"] += 1
                counts["loop_gflop"] += conv["flop"] / 1e9
        elif opcode == "dot":
            counts["dot"] += 1
            counts["dot_gflop"] += _dot_flop(rest, shape, shapes) / 1e9
        elif opcode == "transpose":
            counts["transpose"] += 1
            counts["transpose_mib"] += math.prod(_dims(shape)) * _itemsize(shape) / 2**20
        elif opcode == "copy" and computation not in fused:
            counts["copy"] += 1
        elif opcode == "fusion":
            counts["fusions"] += 1
    return counts


def figures(compiled, batch: int) -> dict:
    """``hlo_counts`` of a compiled program plus XLA's flops, bytes accessed and temp bytes."""
    out = hlo_counts(compiled.as_text(), batch)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    out["flops"] = float(cost.get("flops", 0.0))
    out["bytes"] = float(cost.get("bytes accessed", 0.0))
    memory = compiled.memory_analysis()
    out["temp_bytes"] = int(getattr(memory, "temp_size_in_bytes", 0) or 0)
    return out


def compile_step(spec, variant):
    return jax.jit(W.critic_step(spec, variant)).lower(*W.inputs(spec)).compile()


def main(argv=None):
    """Compile each named zoo critic's steps (all of ``ZOO_CPU`` by default), print the tables."""
    from benchmarks.zoo import critics as zoo
    from benchmarks.zoo import report as zoo_report

    argv = sys.argv[1:] if argv is None else argv
    programs: dict[str, dict] = {}
    for name in argv or list(zoo.ZOO_CPU):
        spec = zoo.ZOO_CPU[name]
        programs[name] = {}
        for variant in VARIANTS:
            start = time.perf_counter()
            programs[name][variant] = figures(compile_step(spec, variant), spec.batch)
            print(f"{name} {variant}: compiled in {time.perf_counter() - start:.1f} s", flush=True)
    print("\n".join(zoo_report.render_zoo_programs(programs)))


if __name__ == "__main__":
    main()
