"""Which tasks ``--tags`` / ``--skip-tags`` run, with Ansible's rules (``Taggable.evaluate_tags``).

A task's tags are its own plus those of its play, role, block and include. ``always`` runs unless
skipped by name; ``never`` runs only when one of its other tags is asked for; ``all`` (the default of
``--tags``) is every task but ``never``'s; ``tagged`` / ``untagged`` select by having tags at all.
"""

from __future__ import annotations

from collections.abc import Iterable

UNTAGGED = frozenset({"untagged"})


def selected(task_tags: Iterable[str], only: frozenset[str], skip: frozenset[str]) -> bool:
    tags = set(task_tags) or set(UNTAGGED)
    only = only or frozenset({"all"})
    if "always" in tags or not tags.isdisjoint(only):
        run = True
    else:
        run = "never" not in tags and ("all" in only or ("tagged" in only and tags != UNTAGGED))
    if run and skip:
        if "all" in skip:
            return "always" in tags and "always" not in skip
        if not tags.isdisjoint(skip) or ("tagged" in skip and tags != UNTAGGED):
            return False
    return run
