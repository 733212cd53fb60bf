"""The small deliberate bugs of the mutation tier: every place in a module where one operator,
constant or keyword can be swapped for a near neighbour, numbered so a mutant can be rebuilt
from its number alone (in the forked child that runs the tests against it)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_COMPARE: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_BINARY: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
    ast.BitOr: ast.BitAnd, ast.BitAnd: ast.BitOr, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
}
_SWAPPED_CALLS = {"min": "max", "max": "min", "any": "all", "all": "any"}
_LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


@dataclass(frozen=True)
class Mutant:
    """One swap: where it is (line, enclosing function) and what it changes, as source."""

    number: int
    line: int
    where: str
    before: str
    after: str

    @property
    def key(self) -> str:
        """Stable across edits elsewhere in the file (no line number): how equivalents are named."""
        return f"{self.where}: {self.before} -> {self.after}"


def _unseen(node: ast.AST) -> bool:
    """A TYPE_CHECKING block, `__all__` or an f-string: nothing a test of behaviour sees."""
    if isinstance(node, ast.If):
        return "TYPE_CHECKING" in ast.unparse(node.test)
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    return isinstance(node, ast.JoinedStr)


def _skipped_nodes(tree: ast.Module) -> set[int]:
    """Nodes whose change no user could notice: docstrings, annotations, log and raise
    messages, f-string text, `__all__`, TYPE_CHECKING blocks. Their subtrees are not mutated."""
    skipped: set[int] = set()

    def skip(node: ast.AST | None) -> None:
        if node is not None:
            skipped.update(id(child) for child in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skip(node)  # a docstring, of a module, class, function or attribute
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            skip(node.returns)
            for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs,
                        node.args.vararg, node.args.kwarg]:
                if arg is not None:
                    skip(arg.annotation)
        elif isinstance(node, ast.AnnAssign):
            skip(node.annotation)
        elif _unseen(node):
            skip(node)
        elif isinstance(node, ast.Raise):
            for child in ast.walk(node):
                if isinstance(child, ast.Call):
                    for message in child.args:
                        if isinstance(message, ast.Constant):
                            skip(message)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in _LOG_METHODS):
            for logged in node.args:
                skip(logged)
    return skipped


def _variants(node: ast.AST) -> Iterator[Callable[[ast.AST], ast.AST]]:
    """Each way to mutate `node`: a function that changes a copy of it in place."""
    if isinstance(node, ast.Compare):
        for index, op in enumerate(node.ops):
            if type(op) in _COMPARE:
                def swap(n: ast.AST, i: int = index) -> ast.AST:
                    assert isinstance(n, ast.Compare)
                    n.ops[i] = _COMPARE[type(n.ops[i])]()
                    return n
                yield swap
    elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINARY:
        def swap_op(n: ast.AST) -> ast.AST:
            assert isinstance(n, (ast.BinOp, ast.AugAssign))
            n.op = _BINARY[type(n.op)]()
            return n
        yield swap_op
    elif isinstance(node, ast.BoolOp):
        def swap_bool(n: ast.AST) -> ast.AST:
            assert isinstance(n, ast.BoolOp)
            n.op = ast.Or() if isinstance(n.op, ast.And) else ast.And()
            return n
        yield swap_bool
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        yield lambda n: n.operand  # type: ignore[attr-defined]
    elif isinstance(node, (ast.Break, ast.Continue)):
        yield lambda n: ast.Continue() if isinstance(n, ast.Break) else ast.Break()
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in _SWAPPED_CALLS:
        def swap_call(n: ast.AST) -> ast.AST:
            assert isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            n.func = ast.Name(id=_SWAPPED_CALLS[n.func.id], ctx=ast.Load())
            return n
        yield swap_call
    elif isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            yield lambda n: ast.Constant(value=not value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield lambda n: ast.Constant(value=value + 1)
        elif isinstance(value, str):
            yield lambda n: ast.Constant(value=f"XX{value}XX")


class _Numbered(ast.NodeTransformer):
    """Walks the tree in a fixed order, numbering each variant; replaces the `target` one."""

    def __init__(self, source: str, target: int | None) -> None:
        self.source = source
        self.target = target
        self.found: list[Mutant] = []
        self.scope: list[str] = []
        self.skipped: set[int] = set()
        self.replaced = False

    def run(self, tree: ast.Module) -> ast.Module:
        self.skipped = _skipped_nodes(tree)
        return self.visit(tree)  # type: ignore[no-any-return]

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> ast.AST:
        self.scope.append(node.name)
        try:
            return self._mutate(node)
        finally:
            self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def generic_visit(self, node: ast.AST) -> ast.AST:
        return self._mutate(node)

    def _mutate(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        if id(node) in self.skipped:
            return node
        for variant in _variants(node):
            number = len(self.found)
            before = ast.get_source_segment(self.source, node) or ast.unparse(node)
            after = ast.unparse(variant(_copy(node)))
            if isinstance(node, ast.AugAssign):
                before, after = before.splitlines()[0], after.splitlines()[0]
            self.found.append(Mutant(number, getattr(node, "lineno", 0),
                                     ".".join(self.scope) or "<module>", before, after))
            if number == self.target:
                replaced = ast.copy_location(variant(node), node)
                self.replaced = True
                return ast.fix_missing_locations(replaced)
        return node


def _copy(node: ast.AST) -> ast.AST:
    return ast.parse(ast.unparse(node), mode="exec").body[0] if isinstance(
        node, ast.stmt) else ast.parse(ast.unparse(node), mode="eval").body


def mutants(source: str) -> list[Mutant]:
    """Every mutant of a module's source, in the order their numbers follow."""
    walker = _Numbered(source, None)
    walker.run(ast.parse(source))
    return walker.found


def mutated_tree(source: str, number: int) -> ast.Module:
    """The module's syntax tree with mutant `number` applied (compile it with the file's name)."""
    walker = _Numbered(source, number)
    tree = walker.run(ast.parse(source))
    if not walker.replaced:
        raise LookupError(f"no mutant number {number}")
    return tree
