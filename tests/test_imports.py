"""The package's imports run one way: no module imports, even inside a function, a module that
imports it back (directly or through others)."""

import ast
from pathlib import Path

import django_resourcesync

PACKAGE = "django_resourcesync"
ROOT = Path(django_resourcesync.__file__).resolve().parent  # the checkout's, or the installed one


def module_name(path):
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules():
    found = {module_name(path): path for path in ROOT.rglob("*.py") if "migrations" not in path.parts}
    assert "django_resourcesync.tracking" in found, ROOT
    return found


def imported(name, path, known):
    """The package's modules that the module ``name`` imports, anywhere in it."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # "from .x import y": y is a module of x, or a name defined in x.
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in known else origin for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in known and target != name)
    return found


def cycles(graph):
    """Each strongly connected group of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for following in graph[node]:
            if following not in index:
                visit(following)
                low[node] = min(low[node], low[following])
            elif following in on_stack:
                low[node] = min(low[node], index[following])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_import_graph_walker_finds_a_cycle(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_package():
    known = modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(group) for group in found)
