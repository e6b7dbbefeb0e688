"""Build + admission time for a case-study-sized execution (636 requests, ~500K unique tokens).

Target: < 1 s for tree construction plus admission. Also times packing (both
modes) and, as a baseline measured in the same run, a naive builder that walks
every request's *full* input through a token trie (what ignoring the proxy's
delta encoding would cost), on a smaller prefix of the trace so it finishes.

    python bench/bench_tree_build.py [--requests 636] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

from gyre.trace import admit, build_tree, pack
from gyre.trace.synthetic import case_study_execution


def naive_trie_tokens(records) -> int:
    """Insert every request's full sequence token by token into a dict trie; returns node count."""
    full: dict[str, list[int]] = {}
    root: dict = {}
    count = 0
    for r in sorted(records, key=lambda r: r.seq):
        inp = (full[r.base][: r.base_len] if r.base else []) + list(r.input_suffix)
        seq = inp + list(r.output_ids)
        full[r.request_id] = seq
        node = root
        for t in seq:
            nxt = node.get(t)
            if nxt is None:
                nxt = node[t] = {}
                count += 1
            node = nxt
    return count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=636)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--j-max", type=int, default=5)
    ap.add_argument("--naive-requests", type=int, default=160)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    recs = case_study_execution(n_requests=args.requests)
    best = {"build": 1e9, "admit": 1e9, "pack-paths": 1e9, "pack-tree": 1e9}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        tree = build_tree(recs)
        t1 = time.perf_counter()
        adm = admit(tree, args.j_max, seed=0)
        t2 = time.perf_counter()
        pack([adm], "paths", 65536)
        t3 = time.perf_counter()
        pack([adm], "tree", 65536)
        t4 = time.perf_counter()
        for k, v in zip(best, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            best[k] = min(best[k], v)
    expanded = sum(len(tree.path_tokens(lf)) for lf in tree.leaves)
    sub = case_study_execution(n_requests=args.requests)[: args.naive_requests]
    t0 = time.perf_counter()
    naive_nodes = naive_trie_tokens(sub)
    t_naive = time.perf_counter() - t0
    t0 = time.perf_counter()
    sub_tree = build_tree(sub)
    t_sub = time.perf_counter() - t0
    assert naive_nodes == len(sub_tree), (naive_nodes, len(sub_tree))
    print(
        f"execution: {len(recs)} requests, {len(tree)} unique tokens, {len(tree.nodes)} radix nodes, "
        f"{len(tree.leaves)} paths, {expanded} tokens if paths expanded ({expanded / len(tree):.2f}x)"
    )
    print(f"{'stage':28} {'seconds':>8}")
    for k, v in best.items():
        print(f"{k:28} {v:8.3f}")
    total = best["build"] + best["admit"]
    print(
        f"{'build + admission':28} {total:8.3f}   target < 1 s: {'OK' if total < 1 else 'MISSED'}"
    )
    print(
        f"straw-man baseline on the first {args.naive_requests} requests: a naive full-input trie "
        f"(no public peer builds execution trees from proxy records; SGLang's RadixCache, the "
        f"nearest, does not install on CPU) {t_naive:.3f} s vs "
        f"build_tree {t_sub:.3f} s ({t_naive / t_sub:.1f}x)"
    )
    if args.json:
        print(
            json.dumps(
                dict(
                    best,
                    requests=len(recs),
                    unique_tokens=len(tree),
                    expanded=expanded,
                    naive_s=t_naive,
                    build_sub_s=t_sub,
                )
            )
        )


if __name__ == "__main__":
    main()
