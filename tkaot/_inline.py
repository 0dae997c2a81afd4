"""An op's checker written into the op itself: one Python frame a call instead of two.

`lazy_checker` (tkaot/_validate.py) calls `inline_checker` once, when a checker is first used. Every module-level
function of the op's module that calls the checker as a statement of the form

    a, b, c = _check(x, weight, eps)     (or `checked = _check(...)`, or a bare `_check(...)`)

with plain names for arguments gets a new code object (`function.__code__`), compiled from the function's own source
with that statement replaced by the checker's body: the checker's parameters renamed to the op's argument names, its
other locals and its globals renamed apart (`_inl<checker>_<name>`, the globals bound in the module under those
names), and its final `return (...)` turned into the assignment. The function object, its defaults, signature and
docstring stay; the new lines keep the call statement's line number, so a traceback points at the `_check(` line.
Measured on norm_forward (dev machine, no-op driver): 0.14 µs a call, the second frame and the returned tuple.

Anything this does not recognise (no source file, a statement of another form, a checker that writes one of its
parameters) is left as it was: the op keeps calling the compiled checker, which raises the same errors.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import types

_PREFIX = "_inl"
# a rewritten function's tree, for its next checker (an op calling two checkers gets both): (module, name) -> FunctionDef
_TREES: dict[tuple[str, str], ast.FunctionDef] = {}


def inline_checker(namespace: dict, name: str, source: str, env: dict) -> list[str]:
    """Inline the checker `source` (a `def check(...)`, its globals in `env`), bound in `namespace` as `name`, into
    the module's functions that call it; returns the names of the functions rewritten."""
    path = namespace.get("__file__")
    module = namespace.get("__name__")
    if not path or not module:
        return []
    callers = [
        f for f in list(namespace.values())
        if isinstance(f, types.FunctionType) and f.__module__ == module and f.__code__.co_filename == path
        and name in f.__code__.co_names and not f.__code__.co_freevars
    ]  # fmt: skip
    if not callers:
        return []
    try:
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read(), path)
    except (OSError, SyntaxError, ValueError):
        return []
    checker = _Checker(name, source, env)
    if not checker.ok:
        return []
    defs = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    done = []
    for function in callers:
        node = _TREES.get((module, function.__name__)) or defs.get(function.__name__)
        if node is None or min([node.lineno, *(d.lineno for d in node.decorator_list)]) != function.__code__.co_firstlineno:
            continue  # the file changed since import, or another definition
        rewritten = checker.inline_into(node, function.__name__, path)
        if rewritten is None:
            continue
        code, _TREES[(module, function.__name__)] = rewritten
        for key, value in checker.globals.items():
            namespace.setdefault(key, value)
        function.__code__ = code
        done.append(function.__name__)
    return done


class _Checker:
    """The checker's body, its names sorted into parameters, locals and globals."""

    def __init__(self, name: str, source: str, env: dict):
        self.name = name
        self.ok = False
        func = ast.parse(source).body[0]
        if not isinstance(func, ast.FunctionDef) or func.args.vararg or func.args.kwarg or func.args.kwonlyargs:
            return
        self.params = [a.arg for a in func.args.args]
        body = func.body
        returns = [n for n in ast.walk(func) if isinstance(n, ast.Return)]
        if not body or not isinstance(body[-1], ast.Return) or len(returns) != 1:
            return
        if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.Global, ast.Nonlocal))
               for stmt in body for n in ast.walk(stmt)):  # fmt: skip
            return
        self.body, self.result = body[:-1], body[-1].value
        stored = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        stored |= {n.name for n in ast.walk(func) if isinstance(n, ast.ExceptHandler) and n.name}
        if stored & set(self.params):
            return  # a parameter rebound: renaming it to the op's argument would change the op's variable
        loaded = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        unknown = loaded - stored - set(self.params) - set(env) - set(dir(builtins))
        if unknown:
            return
        self.locals = stored
        self.env_names = (loaded - stored - set(self.params)) & set(env)
        self.globals = {self._global(g): env[g] for g in self.env_names}
        self.ok = True

    def _global(self, g: str) -> str:
        return f"{_PREFIX}{self.name}_{g}"

    def _local(self, v: str) -> str:
        return f"{_PREFIX}{self.name}__{v}"

    def inline_into(self, node: ast.FunctionDef, function: str, path: str):
        """The code object of `node` (the op's def) with each call statement of the checker replaced, and the
        rewritten def; None when there is none or one of another form."""
        node = _copy(node)
        taken = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
        if taken & ({self._local(v) for v in self.locals} | set(self.globals)):
            return None
        replaced = [0]

        def rewrite(statements: list) -> list | None:
            out = []
            for stmt in statements:
                call = _checker_call(stmt, self.name)
                if call is not None:
                    new = self._expand(stmt, call)
                    if new is None:
                        return None
                    replaced[0] += 1
                    out.extend(new)
                    continue
                for field in ("body", "orelse", "finalbody"):
                    inner = getattr(stmt, field, None)
                    if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                        new_inner = rewrite(inner)
                        if new_inner is None:
                            return None
                        setattr(stmt, field, new_inner)
                for handler in getattr(stmt, "handlers", ()):
                    new_inner = rewrite(handler.body)
                    if new_inner is None:
                        return None
                    handler.body = new_inner
                out.append(stmt)
            return out

        body = rewrite(node.body)
        if body is None or not replaced[0]:
            return None
        if any(isinstance(n, ast.Name) and n.id == self.name for stmt in body for n in ast.walk(stmt)):
            return None  # still read some other way: keep the function as it is
        node.body = body
        module = ast.Module(body=[_copy(node)], type_ignores=[])  # compiled, never run: its decorators are not called
        ast.fix_missing_locations(module)
        flags = __future__.annotations.compiler_flag
        code = compile(module, path, "exec", flags=flags, dont_inherit=True)
        found = [c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == function]
        return (found[0], node) if len(found) == 1 else None

    def _expand(self, stmt: ast.stmt, call: ast.Call) -> list | None:
        """The checker's statements for one call statement, the result assigned to the statement's targets: a checker
        local returned into a plain name target is that name throughout (no copy at the end)."""
        if len(call.args) != len(self.params):
            return None
        renames = {p: a.id for p, a in zip(self.params, call.args)}
        renames.update({v: self._local(v) for v in self.locals})
        renames.update({g: self._global(g) for g in self.env_names})
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
        result = self.result if self.result is not None else ast.Constant(None)
        if target is None:
            pairs = []
        elif isinstance(target, ast.Tuple) and isinstance(result, ast.Tuple) and len(target.elts) == len(result.elts):
            pairs = []  # (target, value) still to assign after the checker's statements
            names = [t.id for t in target.elts if isinstance(t, ast.Name)]
            args = {a.id for a in call.args}
            builtin = set(dir(builtins))
            for t, v in zip(target.elts, result.elts):
                if (isinstance(t, ast.Name) and isinstance(v, ast.Name) and v.id in self.locals and names.count(t.id) == 1
                        and t.id not in args and t.id not in builtin and renames[v.id] == self._local(v.id)):  # fmt: skip
                    renames[v.id] = t.id
                else:
                    pairs.append((t, v))
        else:
            pairs = [(target, result)]  # `checked = _check(...)`, or a starred target
        statements = [_renamed(s, renames) for s in self.body]
        values = [_renamed(v, renames) for _, v in pairs]
        read = {n.id for v in values for n in ast.walk(v) if isinstance(n, ast.Name)}
        if all(isinstance(t, ast.Name) for t, _ in pairs) and not {t.id for t, _ in pairs} & read:  # one statement a value
            statements += [ast.Assign(targets=[ast.Name(t.id, ast.Store())], value=v) for (t, _), v in zip(pairs, values)]
        elif len(pairs) == 1:
            statements.append(ast.Assign(targets=[_copy(pairs[0][0])], value=values[0]))
        else:
            targets = [_copy(t) for t, _ in pairs]
            statements.append(ast.Assign(targets=[ast.Tuple(targets, ast.Store())], value=ast.Tuple(values, ast.Load())))
        for s in statements:
            for n in ast.walk(s):
                if isinstance(n, (ast.stmt, ast.expr, ast.excepthandler)):
                    n.lineno, n.col_offset = stmt.lineno, stmt.col_offset
                    n.end_lineno, n.end_col_offset = stmt.lineno, stmt.col_offset
        return statements


def _checker_call(stmt: ast.stmt, name: str) -> ast.Call | None:
    """The call of `name` that `stmt` is (`targets = name(a, b)` or `name(a, b)`), its arguments plain names."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        value = stmt.value
    elif isinstance(stmt, ast.Expr):
        value = stmt.value
    else:
        return None
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == name):
        return None
    if value.keywords or not all(isinstance(a, ast.Name) for a in value.args):
        return None
    return value


def _renamed(node: ast.AST, renames: dict):
    node = _copy(node)
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in renames:
            n.id = renames[n.id]
        elif isinstance(n, ast.ExceptHandler) and n.name in renames:
            n.name = renames[n.name]
    return node


def _copy(node):
    """A deep copy of an AST (node types only hold nodes, lists and constants)."""
    import copy

    return copy.deepcopy(node)
