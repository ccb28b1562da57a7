"""The import graph of the shipped packages, read from their source (every import, those inside
functions and under TYPE_CHECKING too): each package imports only the layers below it, and no
module, nor any subfolder taken as one, imports something that imports it back."""
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Each package may import those of a lower layer, never one of its own layer or above.
LAYERS = {"protocol": 0, "client_sdk": 1, "scheduler_svc": 1, "worker_svc": 1, "gateway_svc": 2, "stepserve": 3,
          "benchmarks": 4}


def _modules() -> dict[str, Path]:
    modules = {}
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported_names(module: str, path: Path):
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _import_graph() -> dict[str, set[str]]:
    """module -> the shipped modules it imports (a name resolved to its longest module prefix)."""
    modules = _modules()
    graph = defaultdict(set)
    for module, path in modules.items():
        for name in _imported_names(module, path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                graph[module].add(name)
    return graph


def _folder(module: str) -> str:
    """A module in a package's subfolder counts as that subfolder (worker_svc.models.llama ->
    worker_svc.models): the modules the folder's code imports must not import the folder."""
    return ".".join(module.split(".")[:2])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in list(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_each_package_imports_only_the_layers_below_it():
    upward = sorted(f"{module} -> {target}" for module, targets in _import_graph().items() for target in targets
                    if module.split(".")[0] != target.split(".")[0]
                    and LAYERS[target.split(".")[0]] >= LAYERS[module.split(".")[0]])
    assert not upward


def test_no_module_and_no_subfolder_imports_what_imports_it():
    graph = _import_graph()
    assert not _cycles(graph)
    folders = defaultdict(set)
    for module, targets in graph.items():
        folders[_folder(module)] |= {_folder(t) for t in targets if _folder(t) != _folder(module)}
    assert not _cycles(folders)


def test_the_check_finds_a_cycle_and_an_upward_import():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _folder("worker_svc.models.llama") == "worker_svc.models" and _folder("worker_svc.kv_cache") == "worker_svc.kv_cache"
