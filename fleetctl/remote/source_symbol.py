"""``source.py``'s symbol mode: where a name is defined (def, class, assignment, enum member,
import-as) versus only used, from each file's AST. Included by source.py (``# fleetctl-include``),
whose file helpers and fan-out it uses; stdlib only, Python >= 3.8."""

import os
import time


ENUM_BASES = ("Enum", "IntEnum", "StrEnum", "Flag", "IntFlag")


def load_ast():
    """Import ast on first use (a few ms of a grep's interpreter start otherwise)."""
    global ast
    if ast is None:
        import ast as module
        ast = module


def dotted(node):
    """'a.b.c' for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def assigned_names(target):
    if isinstance(target, ast.Name):
        return [target]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in assigned_names(elt)]
    if isinstance(target, ast.Starred):
        return assigned_names(target.value)
    return []


class SymbolFinder:
    """Definitions of NAME (or Class.member) apart from references to it, with their scope.

    An ``ast.NodeVisitor`` (visit and generic_visit as there), written out so that this module
    needs ast only once a symbol is searched for."""

    def __init__(self, name):
        load_ast()
        self.parts = name.split(".")
        self.name = self.parts[-1]
        self.qual = self.parts[:-1]
        self.scope = []  # [(kind, name, is_enum)], kind "class" | "def"
        self.calls = set()  # id() of nodes that are called: their references are "call"
        self.found = []  # (role, node, kind, scope)

    def visit(self, node):
        return getattr(self, "visit_" + node.__class__.__name__, self.generic_visit)(node)

    def generic_visit(self, node):
        for child in ast.iter_child_nodes(node):
            self.visit(child)

    def where(self):
        return ".".join(s[1] for s in self.scope)

    def in_qualifier(self):
        """Whether the innermost scopes are the classes named by the qualifier (Class of Class.x)."""
        if not self.qual:
            return True
        tail = self.scope[-len(self.qual):]
        return len(tail) == len(self.qual) and all(s[0] == "class" and s[1] == q for s, q in zip(tail, self.qual))

    def add(self, role, node, kind):
        self.found.append((role, node, kind, self.where()))

    def visit_ClassDef(self, node):
        if node.name == self.name and self.in_qualifier():
            self.add("definition", node, "class")
        enum = any((dotted(b) or "").split(".")[-1] in ENUM_BASES for b in node.bases)
        self.scope.append(("class", node.name, enum))
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node, kind="function"):
        if node.name == self.name and self.in_qualifier():
            in_class = bool(self.scope) and self.scope[-1][0] == "class"
            self.add("definition", node, ("async " if kind == "async" else "") + ("method" if in_class else "function"))
        self.scope.append(("def", node.name, False))
        self.generic_visit(node)
        self.scope.pop()

    def visit_AsyncFunctionDef(self, node):
        self.visit_FunctionDef(node, "async")

    def assignment(self, node, targets, kind):
        in_def = any(s[0] == "def" for s in self.scope)  # locals are not symbols
        if not in_def and self.in_qualifier():
            for target in targets:
                for name in assigned_names(target):
                    if name.id == self.name:
                        enum = bool(self.scope) and self.scope[-1][2]
                        self.add("definition", name, "enum member" if enum else kind)
        self.generic_visit(node)

    def visit_Assign(self, node):
        self.assignment(node, node.targets, "assignment")

    def visit_AnnAssign(self, node):
        self.assignment(node, [node.target], "annotated assignment")

    def visit_Call(self, node):
        self.calls.add(id(node.func))
        self.generic_visit(node)

    def visit_Name(self, node):
        # A bare name is the member itself only inside its class's own body (Class.member).
        bare_ok = not self.qual or (self.scope and self.scope[-1][0] == "class" and self.in_qualifier())
        if bare_ok and node.id == self.name and isinstance(node.ctx, ast.Load):
            self.add("reference", node, "call" if id(node) in self.calls else "name")

    def visit_Attribute(self, node):
        if node.attr == self.name and self.attribute_matches(node):
            kind = "call" if id(node) in self.calls else "attribute"
            self.add("reference", node, kind if isinstance(node.ctx, ast.Load) else "attribute store")
        self.generic_visit(node)

    def attribute_matches(self, node):
        if not self.qual:
            return True
        text = dotted(node)
        if text is not None and (text == ".".join(self.parts) or text.endswith("." + ".".join(self.parts))):
            return True
        # self.member / cls.member inside a method of the class itself
        return (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                and any(s[0] == "class" and s[1] == self.qual[-1] for s in self.scope))

    def visit_ImportFrom(self, node):
        self.imports(node, node.names)

    def visit_Import(self, node):
        self.imports(node, node.names)

    def imports(self, node, names):
        if self.qual:
            return
        for alias in names:
            if alias.name.split(".")[-1] == self.name:
                self.add("reference", node, "import")
            elif alias.asname == self.name:  # binds the name, but defines nothing
                self.add("reference", node, "import alias")


def symbol_file(data, rel, name):
    """(definitions, references) of one file; raises what ast raises on a bad file."""
    load_ast()
    tree = ast.parse(data, filename=rel)
    finder = SymbolFinder(name)
    finder.visit(tree)
    lines = data.split(b"\n")
    out = ([], [])
    for role, node, kind, scope in finder.found:
        lineno = getattr(node, "lineno", 0)
        text = lines[lineno - 1].decode("utf-8", "replace").rstrip("\r").strip() if 0 < lineno <= len(lines) else ""
        item = {"path": rel, "line": lineno, "kind": kind, "scope": scope, "text": text[:MAX_LINE]}
        out[0 if role == "definition" else 1].append(item)
    return out


def symbol_files(paths, root, name):
    """(definitions, references, unparsable, candidates) of some files."""
    # A file can only matter if every part of the name is in it (a definition sits in its class).
    needles = [p.encode("utf-8") for p in name.split(".")]
    defs, refs, unparsable, candidates = [], [], [], 0
    for path in paths:
        data = read_text_bytes(path)
        if not data or not all(n in data for n in needles):  # binary, unreadable or empty
            continue
        candidates += 1
        rel = os.path.relpath(path, root)
        try:
            found = symbol_file(data, rel, name)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            unparsable.append({"path": rel, "error": describe_parse_error(exc)})
            continue
        defs += found[0]
        refs += found[1]
    return defs, refs, unparsable, candidates


def symbol(params):
    started = time.perf_counter()
    name = (params.get("name") or "").strip()
    if not name or not all(p.isidentifier() for p in name.split(".")):
        raise ProbeInputError("bad symbol name %r: expected NAME or Class.member" % (name,))
    root, pkg_dir, base = search_base(params)
    paths = sorted(list_files(base, PY_SUFFIXES))
    workers = fan_out_width(paths, worker_count(params, len(paths)))
    parts = fan_out(lambda part: symbol_files(part, root, name), paths, workers)
    answer = answer_base(root, pkg_dir, base)
    answer.update({
        "name": name, "searched_files": len(paths), "candidate_files": sum(p[3] for p in parts),
        "definitions": sorted([d for p in parts for d in p[0]], key=by_place),
        "references": sorted([r for p in parts for r in p[1]], key=by_place),
        "unparsable": sorted([u for p in parts for u in p[2]], key=lambda e: e["path"]),
        "workers": workers, "elapsed_ms": round((time.perf_counter() - started) * 1000, 1),
    })
    return answer


def by_place(entry):
    return entry["path"], entry["line"]


def describe_parse_error(exc):
    if isinstance(exc, SyntaxError):
        return "%s: %s (line %s)" % (type(exc).__name__, exc.msg, exc.lineno)
    return "%s: %s" % (type(exc).__name__, exc)
