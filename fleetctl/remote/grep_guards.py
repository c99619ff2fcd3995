# Included by source.py (`# fleetctl-include: grep_guards`): fewer passes over each file when
# several fixed terms share a piece of text. Stdlib only, Python >= 3.8; imports nothing.
#
# Why: a first search reads every file, and most files hold no term; settling that costs one
# bytes.find pass over the whole file per term (CPython's find runs at ~3 GB/s on source text,
# so four terms over sglang/srt's 38 MB are ~50 ms of a host's CPU, more than opening and reading
# the files). Terms of one search often share a piece: update_mamba_state_after_mtp_verify,
# mamba_intermediate and Mamba all hold "amba". A file without "amba" holds none of the three,
# so one pass for the shared piece (a guard) stands for three; the terms themselves are looked
# for only in the files where their guard occurs (235 of sglang/srt's 2,554 text files).
# A guard costs at most one pass in a file where it occurs, and less the earlier it occurs there:
# one found in nearly every file ("self." for self.weight and self.bias) made that first search ~2%
# slower in-process (78.9 against 77.2 ms on sglang/srt), the bench's four terms ~10% faster.

GUARD_MIN = 4  # shorter shared pieces ("_", "get") are in nearly every file: they would rule out nothing
GUARD_SCAN = 64  # only the first bytes of each term are cut into candidate pieces: bounded work for long terms
GUARD_TERMS = 16  # more terms than this are searched one pass each: planning grows with the square of their number


def fixed_needles(terms, regex, kind):
    """(needles, groups) for grep_files when the terms are fixed strings matched in the file's bytes
    (kind "bytes") or in its ASCII-lowered bytes (kind "lower", -i): the terms as those bytes, and
    plan_guards' groups; (None, None) for regexes and non-ASCII terms."""
    if regex or kind not in ("bytes", "lower"):
        return None, None
    needles = [(t.lower() if kind == "lower" else t).encode("ascii") for t in terms]
    return needles, plan_guards(needles) if len(needles) <= GUARD_TERMS else [(None, [i]) for i in range(len(needles))]


def plan_guards(needles):
    """[(guard or None, [indexes of needles])]: every needle in exactly one group, in order of
    their first needle. A guard is a piece of at least GUARD_MIN bytes that two or more needles not
    grouped yet all hold: of the GUARD_MIN-byte pieces, the one most of them hold (then the first
    in byte order), lengthened to the longest piece all of those hold (the plan depends on the
    needles alone). A needle that shares no such piece is a group of its own, without a guard."""
    left = list(range(len(needles)))
    groups = []
    while len(left) > 1:
        members = widest_share(needles, left)
        if not members:
            break
        guard = longest_common(needles, members)
        members = [i for i in left if guard in needles[i]]
        groups.append((guard, members))
        left = [i for i in left if i not in members]
    groups.extend((None, [i]) for i in left)
    return sorted(groups, key=lambda group: group[1][0])


def widest_share(needles, left):
    """The indexes (in ``left``) of the needles holding the GUARD_MIN-byte piece most of them hold,
    when two or more do; else []."""
    best, best_members = None, []
    for i in left:
        head = needles[i][:GUARD_SCAN]
        for start in range(len(head) - GUARD_MIN + 1):
            piece = head[start:start + GUARD_MIN]
            members = [j for j in left if piece in needles[j]]
            if len(members) > len(best_members) or (len(members) == len(best_members) and piece < best):
                best, best_members = piece, members
    return best_members if len(best_members) > 1 else []


def longest_common(needles, members):
    """The longest piece (the first of that length) of the shortest member that every member holds."""
    shortest = min((needles[i][:GUARD_SCAN] for i in members), key=len)
    for size in range(len(shortest), GUARD_MIN - 1, -1):
        for start in range(len(shortest) - size + 1):
            piece = shortest[start:start + size]
            if all(piece in needles[i] for i in members):
                return piece
    raise ValueError("members share no piece of %d bytes" % GUARD_MIN)  # widest_share found one


def first_matches(data, needles, groups):
    """Where each needle first occurs in ``data`` (-1: nowhere), as [data.find(n) for n in needles]
    answers, with a guarded group's needles looked for only where their guard occurs: in a file that
    holds the guard, from its first occurrence on (a needle at m holds the guard at m + k, k where
    the needle holds it first, so it starts no earlier than that occurrence less k). sglang/srt's
    235 files with "amba" hold 8.9 MB: ~1.5 of the ~5.7 ms their three needles' passes took."""
    firsts = [-1] * len(needles)
    for guard, members in groups:
        at = 0 if guard is None else data.find(guard)
        if at >= 0:
            for i in members:
                firsts[i] = data.find(needles[i], max(0, at - needles[i].find(guard)) if at else 0)
    return firsts
