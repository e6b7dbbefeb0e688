"""Numbers about a trajectory tree (what `gyre tree stats` prints) and a text/HTML rendering."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .admission import Admission, admit
from .roles import ROLE_ORDER, RoleProfile
from .store import read_trace
from .tree import TrajectoryTree, build_tree


def load_tree(
    path: str | Path, role_profile: RoleProfile | None = None, vocab_size: int | None = None
) -> TrajectoryTree:
    """Read one execution's trace file and build its tree; read errors land in ``tree.errors`` first."""
    res = read_trace(path, vocab_size=vocab_size)
    tree = build_tree(
        res.records,
        role_profile,
        vocab_size=vocab_size,
        execution_id=None if res.records else Path(path).stem,
    )
    tree.errors[:0] = res.errors
    return tree


def tree_stats(
    tree: TrajectoryTree, j_max: int | None = None, seed: int = 0, message_token: int | None = None
) -> dict[str, Any]:
    """Requests, unique nodes/tokens, paths, expansion, targets by role, admission for ``j_max``.

    With ``message_token`` (e.g. the id of ``<|im_start|>``), also counts
    *message* nodes, the paper's unit: a message node is a distinct root prefix
    ending at a message end (the token before a message start, or a leaf);
    expanding the paths independently counts every message on every path.
    """
    leaves = tree.leaves
    node_occ = sum(len(tree.node_path(lf)) for lf in leaves)
    expanded_tokens = sum(int(tree.depth[tree.nodes[lf].ranges[-1][1] - 1]) + 1 for lf in leaves)
    tgt = np.frombuffer(bytes(tree.is_target), dtype=np.uint8).astype(bool)
    src = np.asarray(tree.source, dtype=np.int64)
    req_role = np.array([ROLE_ORDER.index(r.role) for r in tree.requests] or [0], dtype=np.int64)
    by_role = (
        np.bincount(req_role[src[tgt]], minlength=len(ROLE_ORDER))
        if tgt.any()
        else np.zeros(4, int)
    )
    leaf_roles = {r.value: 0 for r in ROLE_ORDER}
    for lf in leaves:
        leaf_roles[tree.leaf_role(lf).value] += 1
    out: dict[str, Any] = {
        "execution_id": tree.execution_id,
        "requests": len(tree.requests),
        "unique_nodes": len(tree.nodes),
        "unique_tokens": len(tree),
        "paths": len(leaves),
        "paths_by_role": leaf_roles,
        "node_occurrences_expanded": node_occ,
        "tokens_expanded": expanded_tokens,
        "dedup_ratio": (expanded_tokens / len(tree)) if len(tree) else 0.0,
        "targets": int(tgt.sum()),
        "targets_by_role": {r.value: int(by_role[i]) for i, r in enumerate(ROLE_ORDER)},
        "errors": list(tree.errors),
    }
    if message_token is not None:
        # A message runs from a start token to the token before the next start (or a leaf).
        # Unique message nodes = distinct root-prefixes ending at a message end: tokens
        # with a start-token child, plus leaves. Expanded: start tokens on each path.
        starts = np.asarray(tree.tokens, dtype=np.int64) == message_token
        par = np.asarray(tree.parent, dtype=np.int64)
        ends_before_start = np.zeros(len(tree), dtype=bool)
        ends_before_start[par[starts & (par >= 0)]] = True
        n_leaf_tokens = len(tree) - int(np.unique(par[par >= 0]).size)
        out["unique_message_nodes"] = int(ends_before_start.sum()) + n_leaf_tokens
        out["message_node_occurrences_expanded"] = int(
            sum(int(starts[tree.path_tokens(lf)].sum()) for lf in leaves)
        )
    adm = admit(tree, j_max, seed)
    out["admission"] = {
        "j_max": j_max,
        "seed": seed,
        "paths": [
            {
                "role": p.role.value,
                "targets": int(len(p.targets)),
                "path_tokens": int(tree.depth[tree.nodes[p.leaf].ranges[-1][1] - 1]) + 1,
            }
            for p in adm.paths
        ],
        "admitted_targets": adm.n_targets,
        "admitted_targets_by_role": adm.targets_by_role(),
        "weight_per_target": adm.weight,
    }
    return out


def format_stats(s: dict[str, Any]) -> str:
    lines = [
        f"execution {s['execution_id']}",
        f"  requests {s['requests']}, unique nodes {s['unique_nodes']}, unique tokens {s['unique_tokens']}",
        f"  paths {s['paths']} ({', '.join(f'{k} {v}' for k, v in s['paths_by_role'].items() if v)})",
        f"  if expanded: {s['node_occurrences_expanded']} node occurrences, {s['tokens_expanded']} tokens "
        f"(dedup ratio {s['dedup_ratio']:.2f}x)",
        *(
            [
                f"  message nodes {s['unique_message_nodes']} unique, {s['message_node_occurrences_expanded']} "
                f"if expanded"
            ]
            if "unique_message_nodes" in s
            else []
        ),
        f"  targets {s['targets']} ({', '.join(f'{k} {v}' for k, v in s['targets_by_role'].items())})",
    ]
    a = s.get("admission")
    if a:
        cap = "uncapped" if a["j_max"] is None else f"J_max={a['j_max']}"
        lines.append(
            f"  admission ({cap}, seed {a['seed']}): {len(a['paths'])} paths, "
            f"{a['admitted_targets']} targets"
        )
        for i, p in enumerate(a["paths"]):
            lines.append(
                f"    #{i + 1} {p['role']:18} {p['targets']:8d} targets on a {p['path_tokens']}-token path"
            )
    if s["errors"]:
        lines.append(f"  {len(s['errors'])} problem(s):")
        lines.extend(f"    {e}" for e in s["errors"][:20])
        if len(s["errors"]) > 20:
            lines.append(f"    ... {len(s['errors']) - 20} more")
    return "\n".join(lines)


def _node_label(tree: TrajectoryTree, nid: int, admitted: dict[int, int]) -> str:
    n = tree.nodes[nid]
    reqs = [tree.requests[r] for r in n.requests]
    parts = [
        f"node {nid}: depth {n.depth}..{n.depth + n.length - 1} ({n.length} tok, {n.n_targets} targets)"
    ]
    if reqs:
        seqs = sorted(r.seq for r in reqs)
        parts.append(f"{len(reqs)} request(s) end here (seq {seqs[0]}..{seqs[-1]})")
    if not n.children:
        ri = tree.leaf_request[nid]
        parts.append(
            f"LEAF {tree.leaf_role(nid).value} (last request {tree.requests[ri].request_id})"
        )
        if nid in admitted:
            parts.append(f"admitted #{admitted[nid] + 1}")
    return ", ".join(parts)


def render_text(
    tree: TrajectoryTree,
    adm: Admission | None = None,
    max_nodes: int = 400,
    decode: Callable[[list[int]], str] | None = None,
) -> str:
    """An indented outline of the radix nodes (pre-order)."""
    admitted = {p.leaf: i for i, p in enumerate(adm.paths)} if adm else {}
    level: dict[int, int] = {}
    lines = [repr(tree)]
    for n in tree.nodes[:max_nodes]:
        lv = level[n.id] = 0 if n.parent < 0 else level[n.parent] + 1
        lines.append("  " * lv + "- " + _node_label(tree, n.id, admitted))
        if decode is not None:
            toks = [tree.tokens[i] for i in n.token_indices()[:40].tolist()]
            lines.append("  " * lv + "    " + repr(decode(toks))[:120])
    if len(tree.nodes) > max_nodes:
        lines.append(f"... {len(tree.nodes) - max_nodes} more nodes")
    return "\n".join(lines)


def render_html(
    tree: TrajectoryTree,
    adm: Admission | None = None,
    decode: Callable[[list[int]], str] | None = None,
    max_chars: int = 2000,
) -> str:
    """A self-contained HTML page: nested collapsible nodes; targets highlighted when text is decoded."""
    admitted = {p.leaf: i for i, p in enumerate(adm.paths)} if adm else {}
    admitted_tokens = set()
    if adm:
        for p in adm.paths:
            admitted_tokens.update(p.targets.tolist())

    def body(nid: int) -> str:
        n = tree.nodes[nid]
        label = html.escape(_node_label(tree, nid, admitted))
        cls = "leaf" if not n.children else "inner"
        text = ""
        if decode is not None:
            idx = n.token_indices().tolist()
            runs: list[tuple[str, list[int]]] = []  # (css class, token ids)
            cur: list[int] = []
            kind = ""  # no run open yet
            for g in idx:
                k = "adm" if g in admitted_tokens else ("tgt" if tree.is_target[g] else "ctx")
                if k != kind and cur:
                    runs.append((kind, cur))
                    cur = []
                kind = k
                cur.append(tree.tokens[g])
            if cur:
                runs.append((kind, cur))
            out: list[str] = []
            used = 0
            for k, toks in runs:
                t = decode(toks)
                if used + len(t) > max_chars:
                    t = t[: max(0, max_chars - used)] + " ..."
                out.append(f'<span class="{k}">{html.escape(t)}</span>')
                used += len(t)
                if used >= max_chars:
                    break
            text = f"<pre>{''.join(out)}</pre>"
        kids = "".join(body(c) for c in n.children)
        return f'<details open class="{cls}"><summary>{label}</summary>{text}{kids}</details>'

    roots = "".join(body(r) for r in tree.roots)
    style = (
        "body{font:13px sans-serif} details{margin-left:1.2em;border-left:1px solid #ccc;padding-left:.4em}"
        "summary{cursor:pointer} .leaf>summary{font-weight:bold} pre{white-space:pre-wrap;max-width:100em}"
        ".ctx{color:#555} .tgt{background:#fde9b8} .adm{background:#b8f0c0}"
    )
    legend = (
        '<p>context <span class="ctx">grey</span>, target <span class="tgt">yellow</span>, '
        'admitted target <span class="adm">green</span></p>'
    )
    return (
        f"<!doctype html><meta charset=utf-8><title>{html.escape(tree.execution_id)}</title>"
        f"<style>{style}</style><h3>{html.escape(repr(tree))}</h3>{legend}{roots}"
    )


ROLE_COLOURS = {
    "main": "#1f77b4",
    "main-summary": "#2ca02c",
    "sub-agent": "#ff7f0e",
    "sub-agent-summary": "#d62728",
}


def render_png(tree: TrajectoryTree, path: str | Path, adm: Admission | None = None) -> Path:
    """An icicle picture: x = depth in tokens, one lane per leaf; a node spans its leaves' lanes.

    Leaves are coloured by role, shared inner nodes grey; admitted paths are
    numbered at their leaf. Needs matplotlib (a Gyre dependency), imported here.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    lane: dict[int, tuple[int, int]] = {}  # node -> [first lane, last lane + 1)
    order = {
        lf: i for i, lf in enumerate(tree.leaves)
    }  # pre-order: a subtree's leaves are contiguous
    for n in reversed(tree.nodes):
        if not n.children:
            lane[n.id] = (order[n.id], order[n.id] + 1)
        else:
            lane[n.id] = (min(lane[c][0] for c in n.children), max(lane[c][1] for c in n.children))
    admitted = {p.leaf: i for i, p in enumerate(adm.paths)} if adm else {}
    n_leaves = max(1, len(tree.leaves))
    max_depth = max((n.depth + n.length for n in tree.nodes), default=1)
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.35 * n_leaves))
    for n in tree.nodes:
        a, b = lane[n.id]
        colour = ROLE_COLOURS[tree.leaf_role(n.id).value] if not n.children else "#b0b0b0"
        ax.add_patch(
            Rectangle(
                (n.depth, a + 0.08),
                n.length,
                b - a - 0.16,
                facecolor=colour,
                edgecolor="black" if n.id in admitted else "white",
                linewidth=0.6,
            )
        )
        if n.id in admitted:
            ax.text(
                n.depth + n.length, (a + b) / 2, f" #{admitted[n.id] + 1}", va="center", fontsize=8
            )
    ax.set_xlim(0, max_depth * 1.06)
    ax.set_ylim(n_leaves, 0)
    ax.set_yticks([i + 0.5 for i in range(len(tree.leaves))])
    ax.set_yticklabels([tree.leaf_role(lf).value for lf in tree.leaves], fontsize=8)
    ax.set_xlabel("depth (tokens)")
    cap = "" if adm is None else f", admitted J_max={adm.j_max}"
    ax.set_title(
        f"{tree.execution_id}: {len(tree.requests)} requests, {len(tree)} unique tokens, "
        f"{len(tree.leaves)} paths{cap}",
        fontsize=10,
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
