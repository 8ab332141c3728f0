"""The package is layered (docs/architecture.md): every import points down, none back up.

    records, progress, dirlock -> verify, data, model -> rollout -> rl -> config -> training, evaluation, server, demo -> scripts

Checked on the source (module-level and function-level imports alike, via the AST): the RL math imports nothing of
ours, nothing below the scripts imports the trainer or the evaluation script (memagent/train.py, memagent/evaluate.py),
the root train.py and evaluate.py only run their cli(), and the trainer never imports the demo except through
memagent/train.py's one optional stage.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"records": 0, "progress": 0, "dirlock": 0, "verify": 1, "data": 1, "model": 1, "rollout": 2, "rl": 3, "config": 4,
         "training": 5, "evaluation": 5, "server": 5, "demo": 5}
SCRIPTS = {"memagent.train", "memagent.evaluate", "memagent.ask", "memagent.serve", "memagent.cli",
           "memagent.data.__main__", "memagent.model.smollm2"}
"""Entry points (console scripts, python -m ...) and the CLI helper they share: the top layer."""
TOP_SCRIPTS = {"memagent.train", "memagent.evaluate"}
"""The trainer and the evaluation script: nothing else of ours imports them."""
RL_MATH = ("advantages", "loss", "kl", "entropy", "shaping")


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
    return out


def package_of(module: str) -> str:
    """memagent.rl.loss -> rl; memagent.records -> records."""
    return module.split(".")[1] if module.count(".") else module


LIBRARY = [p for p in sorted((ROOT / "memagent").rglob("*.py")) if module_name(p) not in SCRIPTS]


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: module_name(p))
def test_library_imports_point_only_to_lower_layers(path: Path) -> None:
    src = package_of(module_name(path))
    for target, line in imports(path):
        if not target.startswith("memagent.") or package_of(target) == src:
            continue
        dst = package_of(target)
        assert target not in SCRIPTS, f"{path.name}:{line} imports the entry point {target}"
        assert LAYER[dst] < LAYER[src], f"{module_name(path)}:{line} imports {target}: {src} sits below {dst}"


def test_rl_math_imports_nothing_of_ours_but_itself() -> None:
    for name in RL_MATH:
        path = ROOT / "memagent" / "rl" / f"{name}.py"
        ours = [(t, line) for t, line in imports(path) if t.startswith("memagent")]
        assert all(t in {f"memagent.rl.{m}" for m in RL_MATH} for t, _ in ours), f"rl/{name}.py imports {ours}"


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """Like `imports`, with `from memagent import train` read as memagent.train."""
    out = imports(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "memagent" and node.level == 0:
            out += [(f"memagent.{alias.name}", node.lineno) for alias in node.names]
    return out


def test_nothing_below_the_scripts_imports_train_or_evaluate() -> None:
    for path in sorted((ROOT / "memagent").rglob("*.py")):
        bad = [(t, line) for t, line in imported_modules(path)
               if t in TOP_SCRIPTS or t.split(".")[0] in ("train", "evaluate")]
        assert not bad, f"{module_name(path)} imports {bad}"


@pytest.mark.parametrize("name", ["train", "evaluate"])
def test_root_scripts_only_run_the_package_cli(name: str) -> None:
    tree = ast.parse((ROOT / f"{name}.py").read_text())
    froms = [(n.module, [a.name for a in n.names]) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert froms == [(f"memagent.{name}", ["cli"])], f"{name}.py must stay a thin script over memagent.{name}.cli"


def test_the_trainer_imports_the_demo_only_in_its_optional_stage() -> None:
    for path in [*sorted((ROOT / "memagent").glob("training/*.py")), *sorted((ROOT / "memagent").glob("rl/*.py")),
                 *sorted((ROOT / "memagent").glob("config/*.py"))]:
        assert not [t for t, _ in imports(path) if t.startswith("memagent.demo")], module_name(path)
    tree = ast.parse((ROOT / "memagent" / "train.py").read_text())
    top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in top_level if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("memagent.demo")]
    stage = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "pre_rl_stage")
    assert any(isinstance(n, ast.ImportFrom) and n.module == "memagent.demo" for n in ast.walk(stage))


def test_importing_train_loads_no_demo_module() -> None:
    code = "import sys; from memagent import train; print(sorted(m for m in sys.modules if m.startswith('memagent.demo')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
