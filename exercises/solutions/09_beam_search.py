"""SPOILER: reference solution of exercise 09 (beam search fork and free).

Try the exercise first: exercises/09_beam_search.py, graded by `minipaged check 9`.
"""

from __future__ import annotations

EXERCISE = "09_beam_search"


def fork_and_free(tables, ref_counts, parents):
    for p in parents:
        if not 0 <= p < len(tables):
            raise IndexError(f"parent index {p} is outside the {len(tables)} old beams")
    new_tables = [list(tables[p]) for p in parents]
    for table in new_tables:              # fork first: survivors keep their blocks alive
        for b in table:
            ref_counts[b] += 1
    freed = []
    for table in tables:                  # then release every old beam
        for b in table:
            ref_counts[b] -= 1
            if ref_counts[b] == 0:
                del ref_counts[b]
                freed.append(b)
    return new_tables, sorted(freed)


def memory_saving(tables):
    total = sum(len(t) for t in tables)
    if total == 0:
        return 0.0
    distinct = len({b for t in tables for b in t})
    return (total - distinct) / total
