"""DDTree draft tree: built best-first under a node budget from per-depth top-k log-probabilities.

Two copies of this module exist and they must stay identical, byte for byte:
``sglang/srt/speculative/ddtree_tree.py``, the new file that the example patch
``playbooks/files/patches/ddtree-sglang-0.5.23/0003-ddtree-tree-builder.patch`` adds to SGLang,
and ``fleetctl/release/ddtree.py``, where the controller's unit tests exercise it
(``tests/test_ddtree.py`` fails when the two drift apart). Standard library only.

Input: for each draft depth (``logprobs[0]`` is the first position after the last verified
token) the drafter's top-k candidates as ``(token_id, logprob)`` pairs. A node is a path of
choices from the root (the last verified token, which is not itself a node); its score is the
sum of the log-probabilities along its path plus ``depth_bonus * depth``. Nodes are taken
best-first from a heap seeded with the root's children; taking a node of depth ``d`` offers its
children, the candidates of depth ``d + 1``. Building stops after ``budget`` nodes or when
nothing is left. Ties go to the shallower node, then to the lower candidate ranks along the path,
so the same input always gives the same tree.

Output: nodes in breadth-first order (depth by depth, the children of one node in candidate
rank order), with ``parents[i] == -1`` for a child of the root and ``parents[i] < i`` otherwise,
so the verify pass can lay the draft tokens out in this order and attend with ``tree_mask``.
"""

from __future__ import annotations

import heapq
import math
import os
from collections import deque
from dataclasses import dataclass

MAX_TOPK_ENV = "SGLANG_DDTREE_MAX_TOPK"
DEPTH_BONUS_ENV = "SGLANG_DDTREE_DEPTH_BONUS"
ROOT = -1  # the parent index of the root's children

Candidate = tuple[int, float]  # (token_id, logprob)
NodePath = tuple[int, ...]  # candidate ranks from the root, one per depth


@dataclass(frozen=True)
class DraftTree:
    """A draft tree in breadth-first order; ``depths`` counts from 1 (children of the root)."""

    parents: list[int]
    token_ids: list[int]
    depths: list[int]
    scores: list[float]

    def __len__(self) -> int:
        return len(self.parents)


def build_draft_tree(
    logprobs: list[list[Candidate]],
    budget: int,
    max_topk: int | None = None,
    depth_bonus: float | None = None,
) -> DraftTree:
    """The best ``budget`` nodes, grown best-first from the root.

    ``max_topk`` caps the candidates used per depth (the branching factor); when None it comes
    from ``SGLANG_DDTREE_MAX_TOPK`` (unset: no cap). ``depth_bonus`` is added once per level of
    depth; when None it comes from ``SGLANG_DDTREE_DEPTH_BONUS`` (unset: 0.0).
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    topk = max_topk if max_topk is not None else _env_int(MAX_TOPK_ENV)
    if topk is not None and topk < 1:
        raise ValueError(f"max_topk must be >= 1, got {topk}")
    bonus = depth_bonus if depth_bonus is not None else _env_float(DEPTH_BONUS_ENV)
    if not math.isfinite(bonus):
        raise ValueError(f"depth_bonus must be a finite number, got {bonus}")
    levels = [_ranked(depth, candidates, topk) for depth, candidates in enumerate(logprobs)]
    return _breadth_first(levels, _select(levels, budget, bonus))


def tree_mask(parents: list[int]) -> list[list[bool]]:
    """``mask[i][j]`` is True when node ``j`` is node ``i`` or one of its ancestors.

    The root (the last verified token) is not a node: every node may also attend to it.
    """
    size = len(parents)
    mask: list[list[bool]] = []
    for i, parent in enumerate(parents):
        if not ROOT <= parent < i:
            raise ValueError(f"parents[{i}] is {parent}: a parent must be {ROOT} (the root) or an earlier node")
        row = list(mask[parent]) if parent != ROOT else [False] * size
        row[i] = True
        mask.append(row)
    return mask


def _ranked(depth: int, candidates: list[Candidate], topk: int | None) -> list[Candidate]:
    """The usable candidates of one depth, best first: -inf dropped, each token once, at most topk."""
    seen: dict[int, float] = {}
    for token_id, logprob in candidates:
        if math.isnan(logprob) or logprob == math.inf:
            raise ValueError(f"depth {depth}: token {token_id} has logprob {logprob}")
        if logprob != -math.inf and (token_id not in seen or logprob > seen[token_id]):
            seen[token_id] = logprob
    ranked = sorted(seen.items(), key=lambda item: (-item[1], item[0]))
    return ranked if topk is None else ranked[:topk]


def _select(levels: list[list[Candidate]], budget: int, bonus: float) -> dict[NodePath, float]:
    """The chosen nodes (path -> score) in the order they were taken."""
    heap: list[tuple[float, int, NodePath]] = []
    chosen: dict[NodePath, float] = {}
    _offer_children(heap, levels, (), 0.0, bonus)
    while heap and len(chosen) < budget:
        negative, _, path = heapq.heappop(heap)
        chosen[path] = -negative
        _offer_children(heap, levels, path, -negative, bonus)
    return chosen


def _offer_children(heap: list[tuple[float, int, NodePath]], levels: list[list[Candidate]], path: NodePath,
                    score: float, bonus: float) -> None:
    depth = len(path)
    if depth >= len(levels):
        return
    for rank, (_, logprob) in enumerate(levels[depth]):
        heapq.heappush(heap, (-(score + logprob + bonus), depth + 1, (*path, rank)))


def _breadth_first(levels: list[list[Candidate]], chosen: dict[NodePath, float]) -> DraftTree:
    children: dict[NodePath, list[NodePath]] = {}
    for path in chosen:
        children.setdefault(path[:-1], []).append(path)
    parents: list[int] = []
    token_ids: list[int] = []
    depths: list[int] = []
    scores: list[float] = []
    queue: deque[tuple[NodePath, int]] = deque([((), ROOT)])
    while queue:
        path, index = queue.popleft()
        for child in sorted(children.get(path, [])):
            parents.append(index)
            token_ids.append(levels[len(child) - 1][child[-1]][0])
            depths.append(len(child))
            scores.append(chosen[child])
            queue.append((child, len(parents) - 1))
    return DraftTree(parents, token_ids, depths, scores)


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _env_float(name: str) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return 0.0
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
