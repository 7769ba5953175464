"""An engine's own Triton kernels (and host functions), read from its source files without importing it.

Importing ``vllm.v1.sample.rejection_sampler`` would import most of vLLM (and pin its torch).
The kernels themselves need only Triton, so the loader parses the module, keeps the
``@triton.jit`` functions (at module level and inside classes such as
``ComputeSlotMappingKernel``) with every module-level constant and helper they name, follows
``from vllm.x import name`` to other modules the same way, and executes just those statements,
compiled from the real file's syntax tree so that line numbers and ``inspect.getsource`` (which
Triton reads) point at vLLM's own text. ``vllm.triton_utils``' names are Triton's own.

The root package is the source's (``Source.package``): SGLang's kernels load the same way, from
``sglang.*`` modules, with no import of SGLang (their module-level imports of ``sglang.srt`` are
never executed: only what a kernel names is).
"""

from __future__ import annotations

import ast
import builtins
import copy
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import triton_impl  # noqa: F401  (first: it decides TRITON_INTERPRET before Triton loads)
from conformance.engine.source import Source, SourceError

# What vllm.triton_utils re-exports (tl, triton, tldevice, ...), by name.
_TRITON_UTILS = {
    "triton": "triton",
    "tl": "triton.language",
    "tldevice": "triton.language.extra.libdevice",
    "libdevice": "triton.language.extra.libdevice",
}


def _is_jit(node: ast.AST) -> bool:
    if not isinstance(node, ast.FunctionDef):
        return False
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if ast.unparse(target) in ("triton.jit", "jit", "triton.autotune", "triton.heuristics"):
            return True
    return False


def _free_names(node: ast.AST) -> set[str]:
    """Names a definition reads that it does not bind itself (a superset is fine)."""
    loads, stores = set(), set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            (loads if isinstance(n.ctx, ast.Load) else stores).add(n.id)
        elif isinstance(n, ast.arg):
            stores.add(n.arg)
    return loads - stores - set(dir(builtins))


class _Module:
    """One engine module's kernels and what they need, executed in a namespace of their own."""

    def __init__(self, loader: KernelLoader, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        try:
            self.tree = ast.parse(path.read_bytes().decode("utf-8"), str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError) as e:  # a tree is a file like any other: one line
            where = f", line {e.lineno}" if isinstance(e, SyntaxError) and e.lineno else ""
            raise SourceError(f"{path}: not a Python module this tool can read ({type(e).__name__}{where}: "
                              f"{e.msg if isinstance(e, SyntaxError) else e})") from None
        self.module = ModuleType(f"specdiff_engine.{name}")
        self.module.__file__ = str(path)
        self.ns = self.module.__dict__
        self.definitions: dict[str, ast.stmt] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (module, attribute)
        for stmt in self.tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
                self.definitions[stmt.name] = stmt
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                    if isinstance(target, ast.Name):
                        self.definitions[target.id] = stmt
            elif isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
                for alias in stmt.names:
                    self.imports[alias.asname or alias.name] = (stmt.module, alias.name)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    self.imports[alias.asname or alias.name.split(".")[0]] = (alias.name, "")
        self.loader = loader
        self._done: set[int] = set()  # statements already executed
        self._seen: set[str] = set()
        self._run(self._jit_roots())

    def _jit_roots(self) -> list[ast.stmt]:
        roots: list[ast.stmt] = []
        for stmt in self.tree.body:
            if _is_jit(stmt):
                roots.append(stmt)
            elif isinstance(stmt, ast.ClassDef) and any(_is_jit(s) for s in stmt.body):
                roots.append(stmt)
        return roots

    def _run(self, roots: list[ast.stmt]) -> None:
        """Executes ``roots`` and every definition they name, each statement once."""
        loader, seen = self.loader, self._seen
        keep: dict[int, ast.stmt] = {}
        pending = list(roots)
        while pending:
            stmt = pending.pop()
            if id(stmt) in keep or id(stmt) in self._done:
                continue
            self._done.add(id(stmt))
            if isinstance(stmt, ast.ClassDef):  # only the class's kernels: its other methods need vLLM
                stmt = copy.copy(stmt)
                stmt.bases, stmt.keywords, stmt.decorator_list = [], [], []
                stmt.body = [s for s in stmt.body if _is_jit(s)]
            elif isinstance(stmt, ast.FunctionDef) and not _is_jit(stmt):
                # A host function (update_num_computed_tokens_for_batch_change is torch.compile'd on
                # current_platform's backend): its decorators need vLLM; its body runs eagerly.
                stmt = copy.copy(stmt)
                stmt.decorator_list = []
            keep[id(stmt)] = stmt
            for name in sorted(_free_names(stmt) - seen):
                seen.add(name)
                if name in self.definitions:
                    pending.append(self.definitions[name])
                elif name in self.imports:
                    self.ns[name] = loader.resolve_import(*self.imports[name])
        body = sorted(keep.values(), key=lambda s: s.lineno)
        code = compile(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])), str(self.path), "exec")
        self.ns["__builtins__"] = builtins
        exec(code, self.ns)  # vLLM's own kernel text, from the files --vllm named

    def get(self, attrs: list[str]) -> Any:
        if attrs and attrs[0] not in self.ns and attrs[0] in self.definitions:
            self._run([self.definitions[attrs[0]]])  # a constant another module imports
        obj: Any = self.module
        for a in attrs:
            obj = getattr(obj, a, None)
            if obj is None:
                return None
        return obj


class KernelLoader:
    """Resolves kernel qualnames (``vllm.v1.sample.rejection_sampler.expand_kernel``,
    ``vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel``) against one engine's source,
    whose root package (``vllm``, ``sglang``) is the source's."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.root = source.package
        self._modules: dict[str, _Module] = {}

    def _module(self, name: str) -> _Module | None:
        if name not in self._modules:
            path = self.source.module_file(name)
            if path is None:
                return None
            self._modules[name] = _Module(self, name, path)
        return self._modules[name]

    def resolve_import(self, module: str, attr: str) -> Any:
        if module == "vllm.triton_utils" and attr in _TRITON_UTILS:
            return importlib.import_module(_TRITON_UTILS[attr])
        if module == "vllm.triton_utils" and attr == "HAS_TRITON":
            return True  # this backend runs vLLM's Triton kernels: constants take their Triton form
        if module.split(".")[0] != self.root:
            m = importlib.import_module(module)
            return getattr(m, attr) if attr else m
        loaded = self._module(module)
        value = loaded.get([attr]) if loaded is not None else None
        if value is None:
            raise LookupError(f"{module}.{attr} is needed by a kernel of {self.root} but is not a kernel or constant of its source")
        return value

    def parse(self, qualname: str) -> None:
        """Reads and parses the module of ``qualname`` without running any of it: a file that is not
        Python this tool can read is one line (SourceError) before any case."""
        parts = qualname.split(".")
        module = next((".".join(parts[:cut]) for cut in range(len(parts) - 1, 0, -1)
                       if self.source.module_file(".".join(parts[:cut])) is not None), None)
        if module is not None:
            self._module(module)

    def is_triton(self, qualname: str) -> bool:
        """Whether ``qualname`` names a ``@triton.jit`` function of this source (at module level or in
        a class), told from the syntax tree alone: nothing of the module runs, and a host function
        (whose imports would reach the rest of the engine) is never executed to find out."""
        parts = qualname.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            if self.source.module_file(".".join(parts[:cut])) is not None:
                loaded = self._module(".".join(parts[:cut]))
                node = loaded.definitions.get(parts[cut]) if loaded is not None else None
                for attr in parts[cut + 1:]:
                    node = next((s for s in getattr(node, "body", []) if getattr(s, "name", None) == attr), None)
                return node is not None and _is_jit(node)
        return False

    def kernel(self, qualname: str) -> Any:
        """The kernel at ``qualname``, or None when this source has no such module or attribute."""
        parts = qualname.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:cut])
            if self.source.module_file(module) is not None:
                loaded = self._module(module)
                return loaded.get(parts[cut:]) if loaded is not None else None
        return None
