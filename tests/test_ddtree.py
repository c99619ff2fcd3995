"""The DDTree draft-tree builder (fleetctl/release/ddtree.py, shipped to hosts by patch 0003)."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from fleetctl.release import ddtree
from fleetctl.release.ddtree import ROOT, DraftTree, build_draft_tree, tree_mask
from fleetctl.release.patches import apply, load_patch

REPO = Path(__file__).resolve().parents[1]
PATCH = REPO / "playbooks/files/patches/ddtree-sglang-0.5.23/0003-ddtree-tree-builder.patch"

# depth 0: 10 is likely, 11 less; depth 1: 20 likely; depth 2: only 30
SMALL = [[(10, -0.1), (11, -1.0)], [(20, -0.2), (21, -2.0)], [(30, -0.3)]]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ddtree.MAX_TOPK_ENV, raising=False)
    monkeypatch.delenv(ddtree.DEPTH_BONUS_ENV, raising=False)


def paths_of(tree: DraftTree) -> list[tuple[int, ...]]:
    """Each node's token path from the root."""
    out: list[tuple[int, ...]] = []
    for parent, token in zip(tree.parents, tree.token_ids, strict=True):
        out.append((*(out[parent] if parent != ROOT else ()), token))
    return out


def check_shape(tree: DraftTree) -> None:
    for i, parent in enumerate(tree.parents):
        assert ROOT <= parent < i
        assert tree.depths[i] == (1 if parent == ROOT else tree.depths[parent] + 1)
    assert tree.depths == sorted(tree.depths)  # breadth-first


def random_logprobs(rng: random.Random, depth: int, k: int) -> list[list[tuple[int, float]]]:
    levels = []
    for d in range(depth):
        weights = [rng.random() + 1e-3 for _ in range(k)]
        total = sum(weights)
        levels.append([(100 * d + j, math.log(w / total)) for j, w in enumerate(weights)])
    return levels


def all_nodes(logprobs: list[list[tuple[int, float]]], bonus: float = 0.0) -> dict[tuple[int, ...], float]:
    """Every possible node (token path) with its score, by brute force."""
    nodes = {}
    for depth in range(1, len(logprobs) + 1):
        for combo in itertools.product(*logprobs[:depth]):
            nodes[tuple(t for t, _ in combo)] = sum(lp for _, lp in combo) + bonus * depth
    return nodes


def test_controller_copy_is_identical_to_the_file_patch_0003_ships() -> None:
    (new_file,) = load_patch(PATCH).files
    assert new_file.new_file and new_file.path == "sglang/srt/speculative/ddtree_tree.py"
    shipped = apply(new_file, None, patch_file=PATCH.name, host="controller", dist="sglang",
                    expected_version="0.5.23", found_version="0.5.23")
    assert shipped == (REPO / "fleetctl/release/ddtree.py").read_text(), (
        "fleetctl/release/ddtree.py and patch 0003 drifted apart: regenerate the patch from the module")


def test_small_tree_by_hand() -> None:
    tree = build_draft_tree(SMALL, budget=4)
    # chosen best-first: 10 (-0.1), 10>20 (-0.3), 10>20>30 (-0.6), 11 (-1.0); laid out breadth-first
    assert tree.token_ids == [10, 11, 20, 30]
    assert tree.parents == [ROOT, ROOT, 0, 2]
    assert tree.depths == [1, 1, 2, 3]
    assert tree.scores == pytest.approx([-0.1, -1.0, -0.3, -0.6])
    assert len(tree) == 4


@pytest.mark.parametrize("budget", [0, 1, 2, 5, 7, 8])
def test_budget_is_respected(budget: int) -> None:
    tree = build_draft_tree(SMALL, budget=budget)
    assert len(tree) == min(budget, len(all_nodes(SMALL)))
    check_shape(tree)


@pytest.mark.parametrize("seed", range(20))
def test_best_first_takes_the_highest_scoring_nodes(seed: int) -> None:
    rng = random.Random(seed)
    logprobs = random_logprobs(rng, depth=rng.randint(1, 5), k=rng.randint(1, 4))
    budget = rng.randint(1, 40)
    tree = build_draft_tree(logprobs, budget)
    check_shape(tree)
    nodes = all_nodes(logprobs)
    best = sorted(nodes, key=lambda p: -nodes[p])[:budget]
    assert set(paths_of(tree)) == set(best)
    for path, score in zip(paths_of(tree), tree.scores, strict=True):
        assert score == pytest.approx(nodes[path])


def greedy_reference(logprobs: list[list[tuple[int, float]]], budget: int, bonus: float) -> set[tuple[int, ...]]:
    """Best-first the slow way: over and over, take the best node whose parent is taken."""
    nodes = all_nodes(logprobs, bonus)
    chosen: set[tuple[int, ...]] = set()
    while len(chosen) < budget:
        frontier = [p for p in nodes if p not in chosen and (len(p) == 1 or p[:-1] in chosen)]
        if not frontier:
            break
        chosen.add(max(frontier, key=lambda p: (nodes[p], -len(p))))
    return chosen


@pytest.mark.parametrize("seed", range(10))
def test_with_a_depth_bonus_nodes_are_still_taken_best_first(seed: int) -> None:
    """With a bonus a child can outscore its parent, yet it is only taken after its parent:
    the tree stays connected and equals the slow greedy reference."""
    rng = random.Random(100 + seed)
    logprobs = random_logprobs(rng, depth=4, k=3)
    tree = build_draft_tree(logprobs, budget=12, depth_bonus=1.5)
    check_shape(tree)
    assert set(paths_of(tree)) == greedy_reference(logprobs, 12, 1.5)
    assert set(paths_of(build_draft_tree(logprobs, budget=12))) == greedy_reference(logprobs, 12, 0.0)


def test_depth_bonus_shifts_toward_deeper_trees() -> None:
    logprobs = [[(t, math.log(p)) for t, p in enumerate([0.5, 0.3, 0.2])] for _ in range(6)]
    flat = build_draft_tree(logprobs, budget=10)
    deep = build_draft_tree(logprobs, budget=10, depth_bonus=1.0)
    assert max(deep.depths) > max(flat.depths)
    assert sum(deep.depths) > sum(flat.depths)
    assert max(build_draft_tree(logprobs, budget=10, depth_bonus=5.0).depths) == 6


def test_depth_bonus_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    logprobs = [[(t, math.log(p)) for t, p in enumerate([0.5, 0.3, 0.2])] for _ in range(6)]
    monkeypatch.setenv(ddtree.DEPTH_BONUS_ENV, "1.0")
    assert build_draft_tree(logprobs, 10) == build_draft_tree(logprobs, 10, depth_bonus=1.0)
    assert build_draft_tree(logprobs, 10, depth_bonus=0.0) != build_draft_tree(logprobs, 10)
    monkeypatch.setenv(ddtree.DEPTH_BONUS_ENV, "deep")
    with pytest.raises(ValueError, match="SGLANG_DDTREE_DEPTH_BONUS must be a number, got 'deep'"):
        build_draft_tree(logprobs, 10)


def test_max_topk_caps_branching(monkeypatch: pytest.MonkeyPatch) -> None:
    logprobs = [[(100 * d + j, -0.01 * j) for j in range(8)] for d in range(3)]
    uncapped = build_draft_tree(logprobs, budget=40)
    assert max(uncapped.parents.count(p) for p in set(uncapped.parents)) > 2
    for tree in (build_draft_tree(logprobs, budget=40, max_topk=2), _with_env(monkeypatch, logprobs, "2")):
        check_shape(tree)
        assert max(tree.parents.count(p) for p in set(tree.parents)) == 2
        assert len(tree) == 2 + 4 + 8  # a full binary tree of depth 3: the budget is not reached
        assert {t % 100 for t in tree.token_ids} == {0, 1}  # the two best candidates of each depth
    monkeypatch.setenv(ddtree.MAX_TOPK_ENV, "2")
    assert len(build_draft_tree(logprobs, budget=40, max_topk=3)) == 3 + 9 + 27  # the argument wins
    monkeypatch.setenv(ddtree.MAX_TOPK_ENV, "two")
    with pytest.raises(ValueError, match="SGLANG_DDTREE_MAX_TOPK must be an integer, got 'two'"):
        build_draft_tree(logprobs, budget=4)
    with pytest.raises(ValueError, match="max_topk must be >= 1"):
        build_draft_tree(logprobs, budget=4, max_topk=0)


def _with_env(monkeypatch: pytest.MonkeyPatch, logprobs: list[list[tuple[int, float]]], topk: str) -> DraftTree:
    monkeypatch.setenv(ddtree.MAX_TOPK_ENV, topk)
    return build_draft_tree(logprobs, budget=40)


def test_empty_and_degenerate_inputs() -> None:
    empty = DraftTree([], [], [], [])
    assert build_draft_tree([], budget=16) == empty
    assert build_draft_tree(SMALL, budget=0) == empty
    assert build_draft_tree([[]], budget=16) == empty
    # an empty depth ends the tree there
    assert build_draft_tree([[(1, -0.5)], [], [(3, -0.1)]], budget=16).token_ids == [1]
    # impossible candidates (-inf) are dropped; a token offered twice counts once, at its best
    tree = build_draft_tree([[(1, -math.inf), (2, -0.7), (2, -0.2), (3, -0.5)]], budget=16)
    assert tree.token_ids == [2, 3] and tree.scores == pytest.approx([-0.2, -0.5])
    with pytest.raises(ValueError, match="budget must be >= 0"):
        build_draft_tree(SMALL, budget=-1)
    with pytest.raises(ValueError, match="depth 1: token 7 has logprob nan"):
        build_draft_tree([[(1, 0.0)], [(7, math.nan)]], budget=4)
    with pytest.raises(ValueError, match="depth_bonus must be a finite number"):
        build_draft_tree(SMALL, budget=4, depth_bonus=math.inf)


def test_deterministic_tie_breaking() -> None:
    ties = [[(5, 0.0), (4, 0.0)], [(7, 0.0), (6, 0.0)]]
    tree = build_draft_tree(ties, budget=3)
    # equal scores: shallower first, then the lower token id (candidates are ranked by logprob, then id)
    assert tree.token_ids == [4, 5, 6] and tree.parents == [ROOT, ROOT, 0]
    shuffled = [list(reversed(level)) for level in ties]
    assert build_draft_tree(shuffled, budget=3) == tree
    assert all(build_draft_tree(ties, budget=b) == build_draft_tree(ties, budget=b) for b in range(7))


def test_unsorted_candidates_are_ranked_first() -> None:
    assert build_draft_tree([[(1, -3.0), (2, -0.1), (3, -1.0)]], budget=2).token_ids == [2, 3]


def test_tree_mask_is_ancestry() -> None:
    tree = build_draft_tree(SMALL, budget=4)  # parents [-1, -1, 0, 2]
    assert tree_mask(tree.parents) == [
        [True, False, False, False],
        [False, True, False, False],
        [True, False, True, False],
        [True, False, True, True],
    ]
    assert tree_mask([]) == []


@pytest.mark.parametrize("seed", range(5))
def test_tree_mask_matches_paths(seed: int) -> None:
    rng = random.Random(seed)
    tree = build_draft_tree(random_logprobs(rng, depth=4, k=3), budget=20)
    mask = tree_mask(tree.parents)
    paths = [tuple(i_path) for i_path in _index_paths(tree.parents)]
    for i, row in enumerate(mask):
        assert [j for j, seen in enumerate(row) if seen] == sorted(paths[i])


def _index_paths(parents: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i, parent in enumerate(parents):
        out.append([*(out[parent] if parent != ROOT else []), i])
    return out


@pytest.mark.parametrize("parents", [[0], [ROOT, 1], [ROOT, 5], [-2]])
def test_tree_mask_refuses_bad_parents(parents: list[int]) -> None:
    with pytest.raises(ValueError, match="a parent must be -1"):
        tree_mask(parents)
