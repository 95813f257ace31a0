"""Every Python code block of README.md and docs/*.md runs, and equals the naive penalty.

Each page's blocks run in order in one namespace (a later block may use an earlier one's names),
after a prelude that supplies what the prose says the reader has (``real``, ``fake``, ``key``,
and for the README's quickstart a critic and its parameters). Each page runs twice: as written,
and with ``fastgp.gradient_penalty`` replaced by the naive nested-``jax.grad`` penalty (a
``pmean`` of it inside ``shard_map``, whose shards are equal). Every array the blocks bind must
agree between the two runs: the penalties, losses, gradients and updated parameters. (The
``fastgp.testing`` example in docs/api.md compares with the naive penalty itself.)
"""

import ast
import pathlib
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import fastgp
from fastgp._penalty import reference

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
RTOL = 1e-5

PRELUDE = """
import jax, jax.numpy as jnp, numpy as np
real = jnp.asarray(np.random.default_rng(1).standard_normal((16, 2)), jnp.float32)
fake = jnp.asarray(np.random.default_rng(2).standard_normal((16, 2)), jnp.float32)
key = jax.random.key(3)
"""
QUICKSTART = """
def apply_critic(p, x):
    return jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"]
params = {"w1": jnp.asarray(np.random.default_rng(4).standard_normal((2, 32)), jnp.float32),
          "b1": jnp.zeros(32), "w2": jnp.full((32,), 0.1)}
"""
PRELUDES = {"README.md": PRELUDE + QUICKSTART}


def blocks(page):
    return [textwrap.dedent(block) for block in BLOCK.findall(page.read_text())]


def naive_penalty(
    critic,
    x,
    *,
    axis_name=None,
    sample_axis_name=None,
    backend=None,
    second_order=None,
    remat=None,
    **kwargs,
):
    if sample_axis_name is not None:
        value = naive_sliced_penalty(critic, x, sample_axis_name, **kwargs)
    else:
        value = reference.naive_gradient_penalty(critic, x, **kwargs)
    return value if axis_name is None else lax.pmean(value, axis_name)


def naive_sliced_penalty(critic, x, sample_axis_name, kind="wgan-gp", target=1.0, weight=10.0):
    """The penalty of samples split over ``sample_axis_name``, by nested ``jax.grad``: each
    slice's squared input-gradient, psum'd over the slices inside the norm."""
    grads = jax.grad(lambda y: jnp.sum(critic(y)))(x)
    sumsq = lax.psum(jnp.sum(grads**2, axis=tuple(range(1, grads.ndim))), sample_axis_name)
    norm = jnp.sqrt(sumsq)
    per_sample = {
        "wgan-gp": (norm / target - 1) ** 2,
        "wgan-lp": jnp.maximum(norm / target - 1, 0) ** 2,
        "r1": sumsq,
    }[kind]
    return weight * jnp.mean(per_sample)


def run_page(page, penalty):
    namespace = {"__name__": f"docs_{page.stem}"}
    exec(PRELUDES.get(page.name, PRELUDE), namespace)
    original = fastgp.gradient_penalty
    fastgp.gradient_penalty = penalty
    try:
        for index, code in enumerate(blocks(page)):
            try:
                exec(compile(code, f"{page.name} block {index + 1}", "exec"), namespace)
            except Exception as err:
                err.add_note(f"in {page.relative_to(ROOT)}, Python block {index + 1}")
                raise
    finally:
        fastgp.gradient_penalty = original
    return namespace


def arrays_of(value):
    """The leaves of ``value`` if it is an array or a pytree of arrays, else None."""
    leaves = jax.tree.leaves(value)
    if leaves and all(isinstance(leaf, (jax.Array, np.ndarray)) for leaf in leaves):
        return [
            np.asarray(leaf)
            for leaf in leaves
            if not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        ]
    return None


PAGES_WITH_CODE = [page for page in PAGES if blocks(page)]


def test_the_pages_with_code_are_found():
    names = {page.name for page in PAGES_WITH_CODE}
    assert {"README.md", "recipes.md", "api.md"} <= names, names


@pytest.mark.slow  # every block of a page, twice: end-to-end runs of the docs
@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=lambda page: page.name)
def test_page_code_runs_and_equals_the_naive_penalty(page):
    ours = run_page(page, fastgp.gradient_penalty)
    naive = run_page(page, naive_penalty)
    compared = []
    for name, value in ours.items():
        mine, theirs = arrays_of(value), arrays_of(naive.get(name))
        if mine is None or theirs is None or name in ("real", "fake", "key"):
            continue
        assert len(mine) == len(theirs), name
        for a, b in zip(mine, theirs, strict=True):
            if not np.issubdtype(a.dtype, np.floating):
                continue
            scale = float(np.max(np.abs(b))) if b.size else 0.0
            np.testing.assert_allclose(
                a, b, rtol=0, atol=RTOL * max(scale, 1e-30), err_msg=f"{page.name}: {name}"
            )
        compared.append(name)
    assert compared, f"{page.name}: no array was compared"


def api_table_names():
    """The names in the first column of docs/api.md's API table (every backticked name there)."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = text[text.index("## API") :]
    section = section[: section.index("\n## ", 1)]
    table = section[section.index("| function |") :].split("\n\n")[0]
    names = set()
    for row in table.splitlines()[2:]:
        first = row.split(" | ")[0]
        names |= set(re.findall(r"`([A-Za-z_]\w*)", first))
    return names


def test_api_md_documents_exactly_the_public_api():
    """``fastgp.__all__`` is the public API: docs/api.md's table names every name in it and no
    other, and nothing else that ``import fastgp`` exposes (bar submodules) is public."""
    documented, public = api_table_names(), set(fastgp.__all__)
    assert documented - public == set(), "documented but not in fastgp.__all__"
    assert public - documented == set(), "in fastgp.__all__ but not in docs/api.md's table"
    exposed = {
        name
        for name, value in vars(fastgp).items()
        if not name.startswith("_") and not isinstance(value, type(fastgp))
    }
    assert exposed <= public, exposed - public


def layout_map_paths() -> set[str]:
    """The module paths docs/development.md's layout map names: full paths, and names indented
    under a folder line (``fastgp/_penalty/`` then ``  api.py``)."""
    text = (ROOT / "docs" / "development.md").read_text()
    paths, folder = set(), None
    for line in text.splitlines():
        if not line.startswith("    "):
            continue
        words = line.split()
        first = words[0] if words else ""
        if first.endswith("/"):
            folder = first if first.startswith(("fastgp/", "kernels/")) else None
        elif first.endswith(".py") and "/" in first:
            paths.add(first)
        elif first.endswith(".py") and folder and line.startswith("      "):
            paths.add(folder + first)
    return paths


def test_development_md_maps_every_module_of_the_library_and_the_kernels():
    modules = {
        path.relative_to(ROOT).as_posix()
        for top in ("fastgp", "kernels")
        for path in (ROOT / top).rglob("*.py")
    }
    missing = sorted(modules - layout_map_paths())
    assert not missing, f"docs/development.md's layout map omits {missing}"


def test_development_md_maps_every_module_of_the_benchmarks():
    """benchmarks/'s map names each top-level module on a line of its own and each folder's
    modules in that folder's entry."""
    text = (ROOT / "docs" / "development.md").read_text()
    block = text[text.index("`benchmarks/` is a package") : text.index("`tests/` holds")]
    entries = dict(re.findall(r"^    (\S+)\s+(.*?)(?=^    \S|\Z)", block, re.M | re.S))
    missing = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        relative = path.relative_to(ROOT / "benchmarks")
        if relative.name == "__init__.py" or relative.parts[0] == "results":
            continue
        if len(relative.parts) == 1:
            named = relative.name in entries
        else:
            named = relative.name in entries.get(f"{relative.parts[0]}/", "")
        if not named:
            missing.append(relative.as_posix())
    assert not missing, f"docs/development.md's map of benchmarks/ omits {missing}"


def prose_paragraphs(page: pathlib.Path) -> list[str]:
    """The page's paragraphs and list items of prose: code fences, tables, headings and the
    results markers left out."""
    paragraphs: list[str] = []
    current: list[str] = []
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        new_item = line.startswith("- ") or not line.strip()
        if in_code or new_item or line.startswith(("|", "#", "<!--")):
            if current:
                paragraphs.append(" ".join(current))
            current = [line[2:]] if line.startswith("- ") and not in_code else []
            continue
        current.append(line.strip())
    return paragraphs + ([" ".join(current)] if current else [])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_paragraph_of_a_page_stands_twice(page):
    """A paragraph pasted in two places of a page (after another table's "How to read it") is a
    claim read beside figures it is not about."""
    seen: set[str] = set()
    twice = []
    for paragraph in prose_paragraphs(page):
        if len(paragraph) > 200 and paragraph in seen:
            twice.append(paragraph[:80])
        seen.add(paragraph)
    assert not twice, f"{page.name} repeats: {twice}"


# The sizes docs/development.md holds the library and the kernels to, and what may exceed them:
# path or "path:function" -> the reason (none at present).
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 60
OVERSIZE: dict[str, str] = {}


def test_no_module_or_function_is_over_its_size():
    over = []
    for path in sorted([*(ROOT / "fastgp").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]):
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES and name not in OVERSIZE:
            over.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES and f"{name}:{node.name}" not in OVERSIZE:
                    over.append(f"{name}:{node.name}: {length} lines")
    assert not over, (
        f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function: {over}"
    )


def test_no_benchmark_function_is_over_its_size():
    """benchmarks/ is held to the library's function size (its modules are not yet: the
    published blocks and the studies' pages run longer)."""
    over = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    over.append(f"{path.relative_to(ROOT).as_posix()}:{node.name}: {length}")
    assert not over, f"over {MAX_FUNCTION_LINES} lines a function: {over}"
