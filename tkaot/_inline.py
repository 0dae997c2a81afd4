"""An op's checker written into the op itself: one Python frame a call instead of two.

`lazy_checker` (tkaot/_validate.py) calls `inline_checker` once, when a checker is first used. Every module-level
function of the op's module that calls the checker as a statement of the form

    a, b, c = _check(x, weight, eps)     (or `checked = _check(...)`, or a bare `_check(...)`)

with plain names for arguments gets a new code object (`function.__code__`), compiled from the function's own source
with that statement replaced by the checker's body: the checker's parameters renamed to the op's argument names, a
local it returns into a plain name of the statement's targets renamed to that name, its other locals and its globals
renamed apart (`_inl<checker>_<name>`, the globals bound in the module under those names), and what is left of its
final `return (...)` turned into assignments. The function object, its defaults, signature and
docstring stay; the new lines keep the call statement's line number, so a traceback points at the `_check(` line.
Measured on norm_forward (dev machine, no-op driver): 0.14 µs a call, the second frame and the returned tuple; the
rewrite costs 5-20 ms once, at the op's first call (dev machine: parsing the checker and the op, compiling the
result; the garbage collector held off meanwhile).

Anything this does not recognise (no source file, a statement of another form, a checker that writes one of its
parameters) is left as it was: the op keeps calling the compiled checker, which raises the same errors.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import gc
import types

_PREFIX = "_inl"
# a rewritten function's tree while it calls another checker, for that one's turn: (module, name) -> FunctionDef
_TREES: dict[tuple[str, str], ast.FunctionDef] = {}
_BUILTINS = frozenset(dir(builtins))


def inline_checker(namespace: dict, name: str, source: str, env: dict) -> list[str]:
    """Inline the checker `source` (a `def check(...)`, its globals in `env`), bound in `namespace` as `name`, into
    the module's functions that call it; returns the names of the functions rewritten."""
    # The trees are thousands of small objects: with torch loaded, the collections they would trigger cost ~100 ms
    # (measured: ast.parse of norm_forward's checker 5 ms, or 110-130 ms when a full collection falls into it)
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _inline(namespace, name, source, env)
    finally:
        if enabled:
            gc.enable()


def _inline(namespace: dict, name: str, source: str, env: dict) -> list[str]:
    path = namespace.get("__file__")
    module = namespace.get("__name__")
    if not path or not module:
        return []
    callers = [
        f for f in list(namespace.values())
        if isinstance(f, types.FunctionType) and f.__module__ == module and f.__code__.co_filename == path
        and name in f.__code__.co_names and not f.__code__.co_freevars
    ]  # fmt: skip
    checker, lines, done = None, None, []
    for function in callers:
        node = _TREES.get((module, function.__name__))
        if node is None:
            if lines is None:
                try:
                    with open(path, encoding="utf-8") as file:
                        lines = file.readlines()
                except (OSError, ValueError):
                    return done
            node = _function_tree(lines, function)
        if node is None:
            continue
        calls = _call_statements(node, name)
        if not calls or len(calls) != sum(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node)):
            continue  # no call, or the checker read some other way: the function keeps calling it
        checker = checker or _Checker(name, source, env)
        if not checker.ok:
            return done
        taken = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
        if any(len(call.args) != len(checker.params) for _, _, call in calls) or taken & checker.renamed_apart:
            continue
        for statements, stmt, call in calls:
            i = next(k for k, s in enumerate(statements) if s is stmt)
            statements[i : i + 1] = checker.expand(stmt, call)
        try:
            code = compile(ast.Module(body=[node], type_ignores=[]), path, "exec", flags=_ANNOTATIONS, dont_inherit=True)
        except (SyntaxError, ValueError, TypeError):
            _TREES.pop((module, function.__name__), None)
            continue
        found = [c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == function.__name__]
        if len(found) != 1:
            _TREES.pop((module, function.__name__), None)
            continue
        for key, value in checker.globals.items():
            namespace.setdefault(key, value)
        function.__code__ = found[0]
        done.append(function.__name__)
        # the tree is kept only while the function still calls another checker (all 41 trees: 14 MB)
        if any(_is_checker(namespace.get(n)) for n in found[0].co_names):
            _TREES[(module, function.__name__)] = node
        else:
            _TREES.pop((module, function.__name__), None)
    return done


_ANNOTATIONS = __future__.annotations.compiler_flag


def _is_checker(value) -> bool:
    """A checker, compiled or still its stand-in: a function carrying its Signature (tkaot/_validate.py)."""
    return isinstance(value, types.FunctionType) and hasattr(value, "signature")


def _function_tree(lines: list[str], function) -> ast.FunctionDef | None:
    """The module-level def of `function`, parsed alone from the module's lines (its line numbers kept)."""
    start = function.__code__.co_firstlineno  # its first decorator's line, or the def's
    end = start
    seen_def = False
    for end in range(start, len(lines) + 1):
        line = lines[end - 1]
        seen_def = seen_def or line.startswith(("def ", "async def "))
        if seen_def and end > start and line.strip() and not line[0].isspace() and not line.startswith((")", "#")):
            end -= 1
            break
    try:
        tree = ast.parse("\n" * (start - 1) + "".join(lines[start - 1 : end]))
    except (SyntaxError, ValueError):
        return None
    node = tree.body[0] if len(tree.body) == 1 else None
    return node if isinstance(node, ast.FunctionDef) and node.name == function.__name__ else None


def _call_statements(node: ast.FunctionDef, name: str) -> list:
    """(statement list, statement, call) of each `targets = name(a, b)` or `name(a, b)` in the def, arguments plain."""
    found = []

    def visit(statements: list) -> None:
        for stmt in statements:
            value = stmt.value if isinstance(stmt, ast.Expr) or (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1) else None
            if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == name and not value.keywords
                    and all(isinstance(a, ast.Name) for a in value.args)):  # fmt: skip
                found.append((statements, stmt, value))
                continue
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    visit(inner)
            for handler in getattr(stmt, "handlers", ()):
                visit(handler.body)

    visit(node.body)
    return found


class _Checker:
    """The checker's body, its names sorted into parameters, locals and globals."""

    def __init__(self, name: str, source: str, env: dict):
        self.name, self.source, self.ok = name, source, False
        func = ast.parse(source).body[0]
        if not isinstance(func, ast.FunctionDef) or func.args.vararg or func.args.kwarg or func.args.kwonlyargs:
            return
        self.params = [a.arg for a in func.args.args]
        stored, loaded, returns, nested = set(), set(), 0, False
        for stmt in func.body:
            for n in ast.walk(stmt):
                if isinstance(n, ast.Name):
                    (loaded if isinstance(n.ctx, ast.Load) else stored).add(n.id)
                elif isinstance(n, ast.ExceptHandler) and n.name:
                    stored.add(n.name)
                elif isinstance(n, ast.Return):
                    returns += 1
                elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.Global, ast.Nonlocal)):
                    nested = True
        if nested or returns != 1 or not isinstance(func.body[-1], ast.Return) or stored & set(self.params):
            return  # a parameter rebound would change the op's variable of that name
        if loaded - stored - set(self.params) - set(env) - _BUILTINS:
            return
        self.locals = stored
        self.env_names = (loaded - stored - set(self.params)) & set(env)
        self.globals = {self._global(g): env[g] for g in self.env_names}
        self.renamed_apart = {self._local(v) for v in stored} | set(self.globals)
        self._body = func.body  # the first expansion takes it; a later one parses the source again
        self.ok = True

    def _global(self, g: str) -> str:
        return f"{_PREFIX}{self.name}_{g}"

    def _local(self, v: str) -> str:
        return f"{_PREFIX}{self.name}__{v}"

    def expand(self, stmt: ast.stmt, call: ast.Call) -> list:
        """The checker's statements for one call statement, the result assigned to the statement's targets: a checker
        local returned into a plain name target is that name throughout (no copy at the end)."""
        body, self._body = self._body or ast.parse(self.source).body[0].body, None
        result = body[-1].value if body[-1].value is not None else ast.Constant(None)
        renames = {p: a.id for p, a in zip(self.params, call.args)}
        renames.update({v: self._local(v) for v in self.locals})
        renames.update({g: self._global(g) for g in self.env_names})
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
        pairs = []  # (target, value) still to assign after the checker's statements
        if isinstance(target, ast.Tuple) and isinstance(result, ast.Tuple) and len(target.elts) == len(result.elts):
            names = [t.id for t in target.elts if isinstance(t, ast.Name)]
            args = {a.id for a in call.args}
            for t, v in zip(target.elts, result.elts):
                if (isinstance(t, ast.Name) and isinstance(v, ast.Name) and v.id in self.locals and names.count(t.id) == 1
                        and t.id not in args and t.id not in _BUILTINS and renames[v.id] == self._local(v.id)):  # fmt: skip
                    renames[v.id] = t.id
                else:
                    pairs.append((t, v))
        elif target is not None:
            pairs = [(target, result)]  # `checked = _check(...)`, or a starred target
        statements = body[:-1]
        line, col = stmt.lineno, stmt.col_offset
        for n in (n for s in [*statements, result] for n in ast.walk(s)):  # one pass: names, and the call's line
            if isinstance(n, ast.Name):
                n.id = renames.get(n.id, n.id)
            elif isinstance(n, ast.ExceptHandler) and n.name:
                n.name = renames.get(n.name, n.name)
            if "lineno" in n._attributes:
                n.lineno, n.col_offset, n.end_lineno, n.end_col_offset = line, col, line, col
        values = [v for _, v in pairs]
        read = {n.id for v in values for n in ast.walk(v) if isinstance(n, ast.Name)}
        if all(isinstance(t, ast.Name) for t, _ in pairs) and not {t.id for t, _ in pairs} & read:  # one statement a value
            statements += [ast.Assign(targets=[ast.Name(t.id, ast.Store())], value=v) for t, v in pairs]
        elif len(pairs) == 1:
            statements.append(ast.Assign(targets=[pairs[0][0]], value=values[0]))
        else:
            statements.append(ast.Assign(targets=[ast.Tuple([t for t, _ in pairs], ast.Store())], value=ast.Tuple(values, ast.Load())))
        for s in statements[len(body) - 1 :]:  # the assignments added
            for n in ast.walk(s):
                n.lineno, n.col_offset, n.end_lineno, n.end_col_offset = line, col, line, col
        return statements
