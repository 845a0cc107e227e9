"""The runtime (a config load, a run's start, the engine, the loaders) never imports the shard
tools or an importer: every import statement of every module a run reaches, read with ``ast``,
those inside functions too."""

from __future__ import annotations

import pytest

from tests.test_layers import PACKAGE, imported_modules, module_name

RUNTIME = ("largebatch.config", "largebatch.train_command", "largebatch.start", "largebatch.launch", "largebatch.engine", "largebatch.data")
OFFLINE = ("largebatch.shards", "largebatch.importers")


def import_graph() -> dict[str, set[str]]:
    """Each module of largebatch -> the modules of largebatch it imports."""
    paths = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}

    def owner(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    return {module: {m for _, name in imported_modules(path) if (m := owner(name)) not in (None, module)} for module, path in paths.items()}


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def offline_reached(graph: dict[str, set[str]], roots: tuple[str, ...], offline: tuple[str, ...]) -> list[str]:
    """The import chains from a module under ``roots`` to one under ``offline``, one per
    offline module reached (``a -> b -> c``)."""
    chains: dict[str, list[str]] = {root: [root] for root in sorted(graph) if _within(root, roots)}
    queue = list(chains)
    while queue:
        module = queue.pop(0)
        for imported in sorted(graph.get(module, ())):
            if imported not in chains:
                chains[imported] = [*chains[module], imported]
                queue.append(imported)
    return [" -> ".join(chain) for module, chain in sorted(chains.items()) if _within(module, offline)]


def test_the_runtime_imports_no_shard_tool_and_no_importer():
    graph = import_graph()
    assert {"largebatch.shards.convert", "largebatch.importers.colossalai.importer", "largebatch.data.native"} <= graph.keys()
    assert "largebatch.shards.cli" in graph["largebatch.cli"]  # the command line does
    wrong = offline_reached(graph, RUNTIME, OFFLINE)
    assert not wrong, "the runtime reaches offline tools:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    "edge",
    [
        ("largebatch.data.native", "largebatch.shards.records"),
        ("largebatch.engine.engine", "largebatch.cli"),
        ("largebatch.config.loader", "largebatch.importers.colossalai.vocabulary"),
    ],
)
def test_the_check_finds_an_edge_added_against_it(edge):
    graph = {module: set(imported) for module, imported in import_graph().items()}
    graph[edge[0]].add(edge[1])
    assert offline_reached(graph, RUNTIME, OFFLINE)
