"""Patches: parsed with unidiff, applied exactly, on the real sglang 0.5.23 and 0.5.9 wheels."""

from __future__ import annotations

import ast
import difflib
import zipfile
from pathlib import Path

import pytest
import yaml
from sglang_support import NEW_SGLANG, OLD_SGLANG, wheel

from fleetctl.errors import ExitCode, FleetError, InputError
from fleetctl.release import ddtree
from fleetctl.release.patches import (
    FilePatch,
    PatchMismatch,
    PatchSet,
    apply,
    apply_patch_set,
    load_patch,
    parse_patch,
    sha256_hex,
)

REPO = Path(__file__).resolve().parents[1]
SERIES_DIR = REPO / "playbooks" / "files" / "patches" / "ddtree-sglang-0.5.23"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
SPEC_FIELDS = "sglang/srt/arg_groups/fields/spec.py"
FIELD_ORDER = "sglang/srt/arg_groups/field_order.py"
TREE = "sglang/srt/speculative/ddtree_tree.py"
Series = list[tuple[PatchSet, str, str]]


def load_series() -> Series:
    doc = yaml.safe_load((SERIES_DIR / "series.yml").read_text())
    return [(load_patch(SERIES_DIR / e["file"]), e["distribution"], e["version"]) for e in doc["patches"]]


@pytest.fixture(scope="session")
def series() -> Series:
    return load_series()


@pytest.fixture(scope="session")
def sglang_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """version -> a folder holding the real wheel's copies of every file the series touches."""
    paths = {p for patch, _, _ in load_series() for p in patch.paths()}
    roots = {}
    for version in (NEW_SGLANG, OLD_SGLANG):
        root = tmp_path_factory.mktemp(f"sglang-{version}")
        with zipfile.ZipFile(wheel("sglang", version)) as whl:
            for name in sorted(paths & set(whl.namelist())):
                whl.extract(name, root)
        roots[version] = root
    return roots


def host_copy(root: Path, paths: list[str]) -> dict[str, str | None]:
    """What the controller fetches: each file's text as it is (line endings kept), None if absent."""
    return {p: (root / p).read_bytes().decode() if (root / p).is_file() else None for p in paths}


def apply_series(series: Series, root: Path, found: str, host: str = "lab2") -> dict[str, str | None]:
    state: dict[str, str | None] = {}
    for patch, dist, version in series:
        files = {p: state[p] if p in state else host_copy(root, [p])[p] for p in patch.paths()}
        state.update(apply_patch_set(patch, files, host=host, dist=dist, expected_version=version,
                                     found_version=found))
    return state


def opts(**kw: str) -> dict[str, str]:
    base = {"patch_file": "t.patch", "host": "h1", "dist": "sglang", "expected_version": "0.5.23",
            "found_version": "0.5.23"}
    return {**base, **kw}


def one(text: str, name: str = "t.patch") -> FilePatch:
    patch = parse_patch(text, name)
    assert len(patch.files) == 1
    return patch.files[0]


# --------------------------------------------------------------------------- the real patch set


def test_series_yml_names_the_patches_in_order_for_sglang_0_5_23() -> None:
    doc = yaml.safe_load((SERIES_DIR / "series.yml").read_text())
    assert [e["file"] for e in doc["patches"]] == [
        "0001-register-ddtree-algorithm.patch", "0002-server-args-ddtree.patch", "0003-ddtree-tree-builder.patch"]
    assert all(e["distribution"] == "sglang" and e["version"] == "0.5.23" for e in doc["patches"])
    assert {p.name for p in SERIES_DIR.iterdir()} == {e["file"] for e in doc["patches"]} | {"series.yml", "README.md"}
    assert "EXAMPLE" in (SERIES_DIR / "README.md").read_text()


def test_series_applies_exactly_to_the_real_0_5_23_files(series: Series, sglang_files: dict[str, Path]) -> None:
    result = apply_series(series, sglang_files[NEW_SGLANG], NEW_SGLANG)
    assert sorted(result) == sorted([SPEC_INFO, SPEC_FIELDS, FIELD_ORDER, TREE])
    texts = {p: t for p, t in result.items() if t is not None}
    assert len(texts) == 4
    trees = {p: ast.parse(t, p) for p, t in texts.items()}

    algo = next(n for n in ast.walk(trees[SPEC_INFO]) if isinstance(n, ast.ClassDef)
                and n.name == "SpeculativeAlgorithm")
    members = [t.id for n in algo.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
    assert members[:2] == ["DFLASH", "DDTREE"]
    methods = {n.name: ast.unparse(n) for n in algo.body if isinstance(n, ast.FunctionDef)}
    assert "return self == SpeculativeAlgorithm.DDTREE" in methods["is_ddtree"]
    assert "is_ddtree()" in methods["create_worker"]

    spec = next(n for n in ast.walk(trees[SPEC_FIELDS]) if isinstance(n, ast.ClassDef) and n.name == "Spec")
    fields = {n.target.id: n for n in spec.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    budget = fields["speculative_ddtree_budget"]
    assert isinstance(budget.value, ast.Constant) and budget.value.value == 64
    assert ast.unparse(budget.annotation).startswith("A[int,")
    assert "DDTREE" in ast.unparse(fields["speculative_algorithm"].annotation)
    assert texts[FIELD_ORDER].rstrip().endswith('"speculative_ddtree_budget",\n)\n# fmt: on')
    assert texts[TREE] == (REPO / "fleetctl/release/ddtree.py").read_text()


def test_series_changes_nothing_else_in_the_0_5_23_files(series: Series, sglang_files: dict[str, Path]) -> None:
    result = apply_series(series, sglang_files[NEW_SGLANG], NEW_SGLANG)
    before = (sglang_files[NEW_SGLANG] / SPEC_INFO).read_text().splitlines()
    after = (result[SPEC_INFO] or "").splitlines()
    ops = difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
    assert {op for op, *_ in ops} == {"equal", "insert"}
    inserted = [line for op, _, _, j1, j2 in ops if op == "insert" for line in after[j1:j2]]
    assert inserted[0] == "    DDTREE = auto()" and len(inserted) == 12


def test_series_is_refused_on_0_5_9_with_one_line(series: Series, sglang_files: dict[str, Path]) -> None:
    with pytest.raises(PatchMismatch) as info:
        apply_series(series, sglang_files[OLD_SGLANG], OLD_SGLANG)
    assert str(info.value) == (
        "lab2: sglang/srt/speculative/spec_info.py does not match 0001-register-ddtree-algorithm.patch: "
        "patch made for sglang 0.5.23, host has 0.5.9; first hunk that does not fit: @@ -37,6 +37,7 @@ "
        "(line 37: expected '    \"\"\"', found '        # NOTE: EAGLE3 is a variant of EAGLE')")
    assert info.value.exit_code == ExitCode.HOST_FAILED and isinstance(info.value, FleetError)
    assert info.value.host == "lab2" and info.value.hunk == "@@ -37,6 +37,7 @@" and info.value.line == 37


def test_server_args_patch_is_refused_on_0_5_9_where_the_file_is_absent(
        series: Series, sglang_files: dict[str, Path]) -> None:
    patch, dist, version = series[1]
    files = host_copy(sglang_files[OLD_SGLANG], patch.paths())
    with pytest.raises(PatchMismatch, match=r"^lab2: sglang/srt/arg_groups/fields/spec.py does not match "
                       r"0002-server-args-ddtree.patch: patch made for sglang 0.5.23, host has 0.5.9; "
                       r"the host has no such file$"):
        apply_patch_set(patch, files, host="lab2", dist=dist, expected_version=version, found_version="0.5.9")


def test_the_new_file_patch_is_a_new_file_with_the_controller_copy(series: Series) -> None:
    (fp,) = series[2][0].files
    assert fp.new_file and not fp.deleted and fp.path == TREE
    assert apply(fp, None, **opts()) == (REPO / "fleetctl/release/ddtree.py").read_text()
    assert ddtree.MAX_TOPK_ENV in apply(fp, None, **opts())


# --------------------------------------------------------------------------- exact application

BASE = "one\ntwo\nthree\nfour\nfive\n"
EDIT = """--- a/pkg/m.py
+++ b/pkg/m.py
@@ -2,3 +2,4 @@
 two
-three
+THREE
+three and a half
 four
"""


def test_apply_exact_and_strip_prefixes() -> None:
    fp = one(EDIT)
    assert fp.path == "pkg/m.py" and not fp.new_file and not fp.deleted
    assert apply(fp, BASE, **opts()) == "one\ntwo\nTHREE\nthree and a half\nfour\nfive\n"


def test_no_offset_search_a_shifted_file_is_refused() -> None:
    with pytest.raises(PatchMismatch) as info:
        apply(one(EDIT), "zero\n" + BASE, **opts(found_version="0.5.22"))
    assert str(info.value) == ("h1: pkg/m.py does not match t.patch: patch made for sglang 0.5.23, host has 0.5.22; "
                               "first hunk that does not fit: @@ -2,3 +2,4 @@ (line 2: expected 'two', found 'one')")


def test_removed_line_must_match_too() -> None:
    with pytest.raises(PatchMismatch, match=r"\(line 3: expected 'three', found 'tree'\)$"):
        apply(one(EDIT), BASE.replace("three", "tree"), **opts())


def test_a_hunk_past_the_end_is_refused() -> None:
    with pytest.raises(PatchMismatch, match=r"\(line 4: expected 'four', found the end of the file\)$"):
        apply(one(EDIT), "one\ntwo\nthree\n", **opts())
    far = "--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -9,0 +10 @@\n+ten\n"
    with pytest.raises(PatchMismatch, match=r"@@ -9,0 \+10,1 @@ \(the file has only 5 lines\)$"):
        apply(one(far), BASE, **opts())


def test_several_hunks_and_pure_insertions() -> None:
    text = ("--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -0,0 +1 @@\n+zero\n@@ -1 +2 @@\n-one\n+ONE\n"
            "@@ -5,0 +7 @@\n+six\n")
    assert apply(one(text), BASE, **opts()) == "zero\nONE\ntwo\nthree\nfour\nfive\nsix\n"


def test_line_endings_are_kept() -> None:
    crlf = BASE.replace("\n", "\r\n")
    text = "--- a/pkg/m.py\r\n+++ b/pkg/m.py\r\n@@ -2,2 +2,2 @@\r\n two\r\n-three\r\n+THREE\r\n"
    assert apply(one(text), crlf, **opts()) == crlf.replace("three", "THREE")
    lf = "--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -2,2 +2,2 @@\n two\n-three\n+THREE\n"
    with pytest.raises(PatchMismatch, match=r"expected 'two', found 'two\\r'"):
        apply(one(lf), crlf, **opts())
    feed = "one\ntwo\x0c\nthree\n"  # a form feed is not a line break
    text = "--- a/m.py\n+++ b/m.py\n@@ -2,2 +2,2 @@\n two\x0c\n-three\n+3\n"
    assert apply(one(text), feed, **opts()) == "one\ntwo\x0c\n3\n"


def test_no_newline_at_end_of_file() -> None:
    add_newline = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n one\n-two\n\\ No newline at end of file\n+two\n"
    assert apply(one(add_newline), "one\ntwo", **opts()) == "one\ntwo\n"
    with pytest.raises(PatchMismatch, match=r"expected 'two' without a newline at the end of the file, "
                                            r"found 'two' and a newline\)$"):
        apply(one(add_newline), "one\ntwo\n", **opts())
    append = ("--- a/m.py\n+++ b/m.py\n@@ -2 +2,2 @@\n-two\n\\ No newline at end of file\n+two\n+three\n"
              "\\ No newline at end of file\n")
    assert apply(one(append), "one\ntwo", **opts()) == "one\ntwo\nthree"
    no_final_newline_in_patch_file = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-one\n+ONE"
    assert apply(one(no_final_newline_in_patch_file), "one\n", **opts()) == "ONE\n"


def test_new_file() -> None:
    text = "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+a = 1\n+b = 2\n"
    fp = one(text)
    assert fp.new_file and fp.path == "pkg/new.py"
    assert apply(fp, None, **opts()) == "a = 1\nb = 2\n"
    with pytest.raises(PatchMismatch, match=r"^h1: pkg/new.py does not match t.patch: patch made for sglang 0.5.23, "
                                            r"host has 0.5.23; the patch creates this file but the host already "
                                            r"has it$"):
        apply(fp, "", **opts())


def test_modified_file_absent_on_host() -> None:
    with pytest.raises(PatchMismatch, match=r"; the host has no such file$"):
        apply(one(EDIT), None, **opts())


def test_deleted_file() -> None:
    text = "--- a/pkg/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-x = 1\n-y = 2\n"
    fp = one(text)
    assert fp.deleted and not fp.new_file and fp.path == "pkg/old.py"
    assert apply(fp, "x = 1\ny = 2\n", **opts()) == ""
    assert apply_patch_set(parse_patch(text, "d.patch"), {"pkg/old.py": "x = 1\ny = 2\n"}, host="h", dist="sglang",
                           expected_version="1", found_version="1") == {"pkg/old.py": None}
    with pytest.raises(PatchMismatch, match=r"expected 'y = 2', found 'y = 3'"):
        apply(fp, "x = 1\ny = 3\n", **opts())
    with pytest.raises(PatchMismatch, match=r"deletes the file but the host's copy has 1 more line\(s\) "
                                            r"\(line 3: 'z = 3'\)$"):
        apply(fp, "x = 1\ny = 2\nz = 3\n", **opts())
    with pytest.raises(PatchMismatch, match=r"the host has no such file"):
        apply(fp, None, **opts())


def test_git_style_new_and_deleted_files() -> None:
    text = ("diff --git a/pkg/n.py b/pkg/n.py\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n"
            "+++ b/pkg/n.py\n@@ -0,0 +1 @@\n+n = 1\n"
            "diff --git a/pkg/o.py b/pkg/o.py\ndeleted file mode 100644\nindex 2222222..0000000\n--- a/pkg/o.py\n"
            "+++ /dev/null\n@@ -1 +0,0 @@\n-o = 1\n")
    patch = parse_patch(text, "g.patch")
    assert [(f.path, f.new_file, f.deleted) for f in patch.files] == [("pkg/n.py", True, False),
                                                                       ("pkg/o.py", False, True)]
    out = apply_patch_set(patch, {"pkg/n.py": None, "pkg/o.py": "o = 1\n"}, host="h", dist="d", expected_version="1",
                          found_version="1")
    assert out == {"pkg/n.py": "n = 1\n", "pkg/o.py": None}


def test_mismatch_message_is_one_line() -> None:
    with pytest.raises(PatchMismatch) as info:
        apply(one(EDIT), BASE.replace("two", "two\x00\r"), **opts())
    assert "\n" not in str(info.value) and "\\x00\\r" in str(info.value)


# --------------------------------------------------------------------------- refused patches


@pytest.mark.parametrize("old,new", [
    ("a/../x.py", "b/../x.py"),
    ("../pkg/x.py", "../pkg/x.py"),
    ("/etc/passwd", "/etc/passwd"),
    ("a/../../etc/passwd", "b/../../etc/passwd"),
    ("a/pkg/../../x.py", "b/pkg/../../x.py"),
    ("a/pkg/ok/../x.py", "b/pkg/ok/../x.py"),
])
def test_path_escape_is_refused(tmp_path: Path, old: str, new: str) -> None:
    patch = tmp_path / "evil.patch"
    patch.write_text(f"--- {old}\n+++ {new}\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(InputError) as info:
        load_patch(patch)
    message = str(info.value)
    assert message.startswith(f"{patch}:2: refused path ") or message.startswith(f"{patch}:1: refused path ")
    assert repr(old) in message or repr(new) in message
    assert info.value.exit_code == ExitCode.USAGE and "\n" not in message


def test_empty_path_and_dev_null_both_sides_are_refused() -> None:
    with pytest.raises(InputError, match=r"^e.patch:2: refused path 'b/': it is empty"):
        parse_patch("--- a/x\n+++ b/\n@@ -1 +1 @@\n-a\n+b\n", "e.patch")
    with pytest.raises(InputError, match=r"both sides of the diff are /dev/null"):
        parse_patch("--- /dev/null\n+++ /dev/null\n@@ -0,0 +1 @@\n+a\n", "e.patch")


def test_normalized_paths_inside_the_root_are_kept() -> None:
    assert one("--- a/pkg/./x.py\n+++ b/pkg//x.py\n@@ -1 +1 @@\n-a\n+b\n").path == "pkg/x.py"
    assert one("--- pkg/x.py\n+++ pkg/x.py\n@@ -1 +1 @@\n-a\n+b\n").path == "pkg/x.py"


def test_binary_patches_are_refused() -> None:
    with pytest.raises(InputError, match=r"^b.patch:1: binary patch for 'pkg/lib.so': binary patches are not "
                                         r"supported$"):
        parse_patch("Binary files a/pkg/lib.so and b/pkg/lib.so differ\n", "b.patch")
    git = ("diff --git a/pkg/x.bin b/pkg/x.bin\nindex 1111111..2222222 100644\nGIT binary patch\n"
           "literal 3\nKcmZ?wbN>JX000\n\n")
    with pytest.raises(InputError, match=r"^b.patch:1: binary patch for 'pkg/x.bin'"):
        parse_patch(git, "b.patch")


def test_symlinks_are_refused() -> None:
    link = "diff --git a/pkg/l b/pkg/l\nnew file mode 120000\n--- /dev/null\n+++ b/pkg/l\n@@ -0,0 +1 @@\n+/etc/passwd\n"
    with pytest.raises(InputError, match=r"^s.patch:1: 'pkg/l' is a symlink or submodule"):
        parse_patch(link, "s.patch")


def test_malformed_diff_names_file_and_line(tmp_path: Path) -> None:
    bad_line = tmp_path / "bad.patch"
    bad_line.write_text("Subject: x\n\n--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n one\n*two\n three\n")
    with pytest.raises(InputError, match=rf"^{bad_line}:7: malformed diff: Hunk diff line expected: \*two "
                       r"\(in the hunk at line 5\)$"):
        load_patch(bad_line)
    short = tmp_path / "short.patch"
    short.write_text("--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n")
    with pytest.raises(InputError, match=rf"^{short}:6: malformed diff: Hunk is shorter than expected "
                                         r"\(in the hunk at line 3\)$"):
        load_patch(short)
    nothing = tmp_path / "nothing.patch"
    nothing.write_text("just some words\n")
    with pytest.raises(InputError, match=rf"^{nothing}:1: no file diffs found"):
        load_patch(nothing)
    latin = tmp_path / "latin.patch"
    latin.write_bytes(b"--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-caf\xe9\n+cafe\n")
    with pytest.raises(InputError, match=rf"^{latin}:4: a patch must be UTF-8 text$"):
        load_patch(latin)


def test_renames_duplicates_overlaps_and_bad_new_files_are_refused() -> None:
    with pytest.raises(InputError, match=r"renames are not supported \(pkg/a.py -> pkg/b.py\)"):
        parse_patch("--- a/pkg/a.py\n+++ b/pkg/b.py\n@@ -1 +1 @@\n-a\n+b\n", "r.patch")
    twice = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(InputError, match=r"^r.patch:7: m.py appears twice; give one diff per file$"):
        parse_patch(twice + twice, "r.patch")
    overlap = "--- a/m.py\n+++ b/m.py\n@@ -2,2 +2,2 @@\n a\n-b\n+B\n@@ -3 +3 @@\n-b\n+c\n"
    with pytest.raises(InputError, match=r"^r.patch:7: m.py: hunk @@ -3,1 \+3,1 @@ overlaps"):
        parse_patch(overlap, "r.patch")
    with pytest.raises(InputError, match=r"is a new file \(/dev/null\) but the hunk"):
        parse_patch("--- /dev/null\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n", "r.patch")
    with pytest.raises(InputError, match=r"^r.patch:1: 'm.py': file mode changes are not supported$"):
        parse_patch("diff --git a/m.py b/m.py\nold mode 100644\nnew mode 100755\n", "r.patch")
    with pytest.raises(InputError, match=r"^r.patch:1: m.py has no hunks"):
        parse_patch("diff --git a/m.py b/m.py\nindex 1111111..2222222 100644\n", "r.patch")


def test_apply_patch_set_needs_every_file() -> None:
    with pytest.raises(ValueError, match=r"t.patch: no content given for pkg/m.py"):
        apply_patch_set(parse_patch(EDIT, "t.patch"), {}, host="h", dist="d", expected_version="1", found_version="1")


def test_sha256_hex() -> None:
    assert sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert sha256_hex("caf\udce9") == sha256_hex(b"caf\xe9".decode("utf-8", "surrogateescape"))
