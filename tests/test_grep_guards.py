"""Guards for several fixed terms (fleetctl/remote/grep_guards.py, run as source.py ships it): a
piece several terms share is looked for once per file, and the answer is the one a pass per term
gives, on made-up text and on the real sglang 0.5.23 ``srt`` tree."""

from __future__ import annotations

import random
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from remote_support import remote_module
from sglang_support import NEW_SGLANG, wheel

BENCH_TERMS = ["update_mamba_state_after_mtp_verify", "disable_state_update", "mamba_intermediate", "Mamba"]


@pytest.fixture(scope="module")
def guards() -> Any:
    return remote_module("source")  # grep_guards.py comes with it, as the agent ships it


def test_the_bench_terms_share_one_guard(guards: Any) -> None:
    needles = [t.encode() for t in BENCH_TERMS]
    assert guards.plan_guards(needles) == [(b"amba", [0, 2, 3]), (None, [1])]


def test_terms_sharing_only_short_pieces_get_no_guard(guards: Any) -> None:
    # "_x" and "e" are shared, but pieces that short are in nearly every file
    assert guards.plan_guards([b"one_x", b"three_x", b"e"]) == [(None, [0]), (None, [1]), (None, [2])]


def test_the_guard_is_the_longest_piece_the_group_shares(guards: Any) -> None:
    plan = guards.plan_guards([b"update_weights", b"x", b"update_config"])
    assert plan == [(b"update_", [0, 2]), (None, [1])]


def test_many_terms_are_searched_one_pass_each(guards: Any) -> None:
    terms = [f"shared_piece_{n}" for n in range(guards.GUARD_TERMS + 1)]
    needles, groups = guards.fixed_needles(terms, False, "bytes")
    assert groups == [(None, [i]) for i in range(len(terms))]


def test_regex_and_non_ascii_terms_are_not_guarded(guards: Any) -> None:
    assert guards.fixed_needles(["a.*b", "a.*c"], True, "bytes") == (None, None)
    assert guards.fixed_needles(["größe", "größer"], False, "text") == (None, None)
    assert guards.fixed_needles(["Mamba", "MAMBA_X"], False, "lower")[0] == [b"mamba", b"mamba_x"]


def test_first_matches_is_a_pass_per_term(guards: Any) -> None:
    """Any text, any terms: the same first offsets as data.find for each term."""
    rng = random.Random(37)
    for _ in range(300):
        alphabet = rng.choice([b"ab", b"abc_", b"mamba_MAB"])
        data = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 300)))
        needles = [bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 9))) for _ in range(rng.randrange(1, 6))]
        groups = guards.plan_guards(needles)
        assert sorted(i for _, members in groups for i in members) == list(range(len(needles)))
        assert guards.first_matches(data, needles, groups) == [data.find(n) for n in needles], (data, needles)


def test_a_needle_is_found_where_it_holds_its_guard_first(guards: Any) -> None:
    """The needles are looked for from the guard's first occurrence less where each holds it: a
    needle that begins before that occurrence (the guard inside it, once or twice) is still found
    there, not at a later occurrence."""
    needles = [b"xxambayy", b"ambaamba_z", b"Mamba"]
    groups = guards.plan_guards(needles)
    assert groups == [(b"amba", [0, 1, 2])]
    for data in (b"xxambayy Mamba ambaamba_z", b"_ambaamba_z xxambayy", b"Mamba", b"q amba xxambayy Mamba",
                 b"ambaamba_z", b"xxamba", b"amb"):
        assert guards.first_matches(data, needles, groups) == [data.find(n) for n in needles], data


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("site-grep-guards")
    with zipfile.ZipFile(wheel("sglang", NEW_SGLANG)) as zf:
        zf.extractall(folder, [n for n in zf.namelist() if n.startswith("sglang/")])
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


@pytest.mark.parametrize("ignore_case", [False, True])
def test_sglang_answer_is_the_same_with_and_without_guards(site: Path, ignore_case: bool) -> None:
    def grep(source: Any) -> dict[str, Any]:
        answer: dict[str, Any] = source.main({"mode": "grep", "package": "sglang", "subpath": "srt",
                                              "terms": BENCH_TERMS, "ignore_case": ignore_case, "workers": 1})
        answer.pop("elapsed_ms")
        return answer

    guarded, unguarded = remote_module("source"), remote_module("source")
    unguarded.__dict__["plan_guards"] = lambda needles: [(None, [i]) for i in range(len(needles))]
    kind, guard = ("lower", b"mamba") if ignore_case else ("bytes", b"amba")  # lowered, Mamba holds "mamba"
    assert guarded.fixed_needles(BENCH_TERMS, False, kind)[1][0] == (guard, [0, 2, 3])  # the guard is in play
    answer = grep(guarded)
    assert answer["matched_lines"] > 0 and answer["files"]
    assert answer == grep(unguarded)
