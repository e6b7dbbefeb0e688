"""Trajectory trees: one execution's model calls as a prefix tree over token ids.

Every request's full sequence (input + output) is one root-anchored path. A
request whose input extends an earlier call shares that call's path and only
its new suffix becomes new tokens; a diverging context (compaction, sub-agent,
retry) starts a branch at the point of divergence. Each token keeps the context
it was produced in, even after the harness compacted that context away.

Per token the tree records:

* ``is_target``: the policy sampled this token *at this position* (it lies in
  some request's output). Output text pasted back later as input sits at a
  different position and is context there. If any request sampled a position,
  it is a target (its context is identical by construction).
* ``logprob``/``version``: behaviour log-prob and the weights version that
  sampled it (from the record's output segments); the first request that
  sampled a position wins.

Representation. Tokens live in flat arrays (``tokens``, ``parent``, ``depth``,
...). Inserting a request never moves or splits anything: a branch is just a
second child of an existing token. Because the proxy delta-encodes inputs
(``base``, ``base_len``, ``input_suffix``), a request's attach point is found
by a lookup along its base's path, so building costs O(new tokens) rather than
O(sum of full input lengths), which is what makes a 500K-token, 636-request
execution cheap. Radix *nodes* (maximal non-branching chains) are derived once
after insertion (:meth:`TrajectoryTree.finalize`).

Pure python + numpy; no torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from .record import TraceFormatError, TraceRecord
from .roles import Role, RoleProfile, default_profile


class TreeBuildError(ValueError):
    """A record that could not be placed in the tree; the message names it."""


@dataclass
class RequestInfo:
    """Where one request sits in the tree."""

    request_id: str
    seq: int
    role: Role
    n_input: int
    n_output: int
    end: int  # tree index of the last token of input+output (-1 when both are empty)
    pieces: list[tuple[int, int, int]] = field(repr=False, default_factory=list)
    # pieces: (depth of first token, tree index of first token, length) of contiguous chained runs

    @property
    def length(self) -> int:
        return self.n_input + self.n_output

    def index_at_depth(self, d: int) -> int:
        """Tree index of this request's token at depth ``d`` (0-based)."""
        starts = [p[0] for p in self.pieces]
        k = bisect.bisect_right(starts, d) - 1
        d0, g0, n = self.pieces[k]
        assert d - d0 < n
        return g0 + (d - d0)


@dataclass
class Node:
    """A maximal non-branching chain of tokens (a radix-tree node)."""

    id: int
    parent: int  # node id, -1 for a root node
    ranges: list[tuple[int, int]]  # contiguous tree-index ranges [a, b) in path order
    depth: int  # depth of the first token
    length: int
    n_targets: int
    children: list[int] = field(default_factory=list)
    requests: list[int] = field(
        default_factory=list
    )  # request indices whose sequence ends in this node

    def token_indices(self) -> np.ndarray:
        return np.concatenate([np.arange(a, b) for a, b in self.ranges])


def _common_prefix(a: list[int], ai: int, b: list[int], bi: int, n: int) -> int:
    """Length of the common prefix of a[ai:ai+n] and b[bi:bi+n] (C-speed slice compares)."""
    if a[ai : ai + n] == b[bi : bi + n]:
        return n
    m, step = 0, 256
    while m < n:
        s = min(step, n - m)
        if a[ai + m : ai + m + s] == b[bi + m : bi + m + s]:
            m += s
            continue
        while a[ai + m] == b[bi + m]:
            m += 1
        return m
    return m


class TrajectoryTree:
    """A prefix tree over one execution's requests (see module docstring)."""

    def __init__(self, execution_id: str) -> None:
        self.execution_id = execution_id
        self.tokens: list[int] = []
        self.parent: list[int] = []
        self.depth: list[int] = []
        self.is_target = bytearray()
        self.logprob: list[float] = []
        self.version: list[int] = []
        self.source: list[
            int
        ] = []  # request that sampled a target / first introduced a context token
        self.requests: list[RequestInfo] = []
        self.by_id: dict[str, int] = {}
        self.errors: list[str] = []  # one line per record that was skipped or is suspect
        self._extra: dict[
            int, dict[int, int]
        ] = {}  # non-contiguous children: parent -> {token: index}
        self._run_starts: list[int] = []  # indices j with parent[j] != j - 1 (sorted)
        self.nodes: list[Node] = []
        self.roots: list[int] = []
        self.leaves: list[int] = []
        self.node_of: np.ndarray = np.zeros(0, dtype=np.int64)
        self.leaf_request: dict[
            int, int
        ] = {}  # leaf node -> request index (last request on its path)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_np_cache", None)  # the packer's numpy view; rebuilt on demand
        return state

    # ------------------------------------------------------------------ insertion
    def __len__(self) -> int:
        return len(self.tokens)

    def _append(
        self,
        g: int,
        seq: list[int],
        i: int,
        out_from: int,
        lps,
        vers,
        src: int,
        pieces: list[tuple[int, int, int]],
    ) -> int:
        """Append seq[i:] as new tokens under tree index g; returns the last index."""
        n0 = len(self.tokens)
        d = self.depth[g] + 1 if g >= 0 else 0
        k = len(seq) - i
        if g == n0 - 1 and g >= 0:
            pass  # chained: parent[n0] == n0 - 1
        else:
            self._extra.setdefault(g, {})[seq[i]] = n0
            self._run_starts.append(n0)
        self.tokens.extend(seq[i:])
        self.parent.append(g)
        self.parent.extend(range(n0, n0 + k - 1))
        self.depth.extend(range(d, d + k))
        self.source.extend([src] * k)
        n_in = max(0, min(k, out_from - i))  # tokens of seq[i:] that are input
        self.is_target.extend(b"\x00" * n_in)
        self.logprob.extend([0.0] * n_in)
        self.version.extend([-1] * n_in)
        o = i + n_in - out_from  # offset into the output
        self.is_target.extend(b"\x01" * (k - n_in))
        self.logprob.extend(lps[o:])
        self.version.extend(vers[o:])
        if pieces and pieces[-1][1] + pieces[-1][2] == n0 and g == n0 - 1:
            d0, g0, ln = pieces[-1]
            pieces[-1] = (d0, g0, ln + k)
        else:
            pieces.append((d, n0, k))
        return n0 + k - 1

    def _mark(self, g: int, i: int, m: int, out_from: int, lps, vers, src: int) -> None:
        """Tokens seq[i:i+m] matched tree indices g..g+m-1; flag sampled ones as targets."""
        lo = max(i, out_from)
        for j in range(lo, i + m):
            t = g + (j - i)
            if not self.is_target[t]:
                self.is_target[t] = 1
                self.logprob[t] = lps[j - out_from]
                self.version[t] = vers[j - out_from]
                self.source[t] = src

    def insert(
        self,
        start: int,
        seq: list[int],
        out_from: int,
        lps,
        vers,
        src: int,
        pieces: list[tuple[int, int, int]],
    ) -> int:
        """Walk/extend the tree from tree index ``start`` (-1 = root) along ``seq``.

        ``seq[out_from:]`` are output tokens (targets) with log-probs ``lps`` and
        versions ``vers``. Returns the tree index of the last token.
        """
        tok, par = self.tokens, self.parent
        g, i, n = start, 0, len(seq)
        while i < n:
            N = len(tok)
            if g >= 0 and g + 1 < N and par[g + 1] == g:
                r = bisect.bisect_right(self._run_starts, g + 1)
                run_end = self._run_starts[r] if r < len(self._run_starts) else N
                L = min(run_end - (g + 1), n - i)
                m = _common_prefix(tok, g + 1, seq, i, L)
                if m:
                    if i + m > out_from:
                        self._mark(g + 1, i, m, out_from, lps, vers, src)
                    d0, g0, ln = pieces[-1] if pieces else (0, -2, 0)
                    if g0 + ln == g + 1:
                        pieces[-1] = (d0, g0, ln + m)
                    else:
                        pieces.append((self.depth[g + 1], g + 1, m))
                    g += m
                    i += m
                    if m == L:
                        continue
            if i >= n:
                break
            c = self._extra.get(g, {}).get(seq[i])
            if c is None:
                return self._append(g, seq, i, out_from, lps, vers, src, pieces)
            if i >= out_from:
                self._mark(c, i, 1, out_from, lps, vers, src)
            pieces.append((self.depth[c], c, 1))
            g = c
            i += 1
        return g

    def add_record(
        self, rec: TraceRecord, role: Role, vocab_size: int | None = None
    ) -> RequestInfo:
        """Place one record; raises TreeBuildError/TraceFormatError naming it."""
        where = f"record {rec.request_id!r} (execution {rec.execution_id!r}, seq {rec.seq})"
        rec.validate(vocab_size)
        if rec.execution_id != self.execution_id:
            raise TreeBuildError(
                f"{where}: belongs to execution {rec.execution_id!r}, tree is {self.execution_id!r}"
            )
        if rec.request_id in self.by_id:
            raise TreeBuildError(f"{where}: duplicate request id")
        pieces: list[tuple[int, int, int]] = []
        start = -1
        if rec.base is not None:
            bi = self.by_id.get(rec.base)
            if bi is None:
                raise TreeBuildError(
                    f"{where}: base {rec.base!r} is missing (not in this trace, "
                    f"unusable, or not earlier)"
                )
            b = self.requests[bi]
            if rec.base_len > b.length:
                raise TreeBuildError(
                    f"{where}: base_len {rec.base_len} exceeds base {rec.base!r}'s "
                    f"{b.length} tokens"
                )
            if rec.base_len:
                start = b.index_at_depth(rec.base_len - 1)
                for d0, g0, ln in b.pieces:
                    if d0 >= rec.base_len:
                        break
                    pieces.append((d0, g0, min(ln, rec.base_len - d0)))
        n_input = rec.base_len + len(rec.input_suffix)
        if n_input == 0 and rec.output_ids:
            raise TreeBuildError(f"{where}: output without any input (nothing to condition on)")
        vers = [0] * len(rec.output_ids)
        for s in rec.segments:
            vers[s.start : s.end] = [s.policy_version] * (s.end - s.start)
        seq = list(rec.input_suffix) + list(rec.output_ids)
        idx = len(self.requests)
        end = start
        if seq:
            end = self.insert(
                start, seq, len(rec.input_suffix), list(rec.output_logprobs), vers, idx, pieces
            )
        info = RequestInfo(
            request_id=rec.request_id,
            seq=rec.seq,
            role=role,
            n_input=n_input,
            n_output=len(rec.output_ids),
            end=end,
            pieces=pieces,
        )
        self.requests.append(info)
        self.by_id[rec.request_id] = idx
        if not rec.output_ids:
            self.errors.append(f"{where}: empty output (kept as context, contributes no targets)")
        return info

    # ------------------------------------------------------------------ derived structure
    def finalize(self) -> TrajectoryTree:
        """Derive radix nodes, leaves and leaf roles from the flat arrays."""
        nodes, roots, node_of = self._radix_nodes()
        self.nodes, self.roots, self.node_of = nodes, roots, node_of
        for ri, r in enumerate(self.requests):
            if r.end >= 0:
                nodes[int(node_of[r.end])].requests.append(ri)
        self._leaf_roles()
        return self

    def _radix_nodes(self) -> tuple[list[Node], list[int], np.ndarray]:
        """The radix nodes (runs of single-child tokens, pre-order), the roots, and each
        token's node."""
        N = len(self.tokens)
        P = np.asarray(self.parent, dtype=np.int64) if N else np.zeros(0, dtype=np.int64)
        nch = np.bincount(P[P >= 0], minlength=N) if N else np.zeros(0, dtype=np.int64)
        only = np.full(N, -1, dtype=np.int64)
        has = P >= 0
        only[P[has]] = np.nonzero(has)[0]  # the child, where there is exactly one
        cont = np.zeros(N, dtype=bool)  # j's only child is j + 1
        if N > 1:
            cont[:-1] = (P[1:] == np.arange(N - 1)) & (nch[:-1] == 1)
        breaks = np.nonzero(~cont)[0]  # a run starting at j ends at the first break >= j
        tgt = (
            np.frombuffer(bytes(self.is_target), dtype=np.uint8).astype(bool)
            if N
            else np.zeros(0, bool)
        )
        tcum = np.concatenate(([0], np.cumsum(tgt)))
        node_of = np.full(N, -1, dtype=np.int64)
        children_of_tok: dict[int, list[int]] = {}
        branchy = (
            np.nonzero(has & (nch[np.clip(P, 0, None)] > 1))[0] if N else np.zeros(0, np.int64)
        )
        for j in branchy.tolist():
            children_of_tok.setdefault(self.parent[j], []).append(j)
        nodes: list[Node] = []
        stack = [(j, -1) for j in reversed(np.nonzero(P == -1)[0].tolist())]
        roots: list[int] = []
        while stack:
            j, pnode = stack.pop()
            ranges = []
            cur = j
            while True:
                e = int(breaks[np.searchsorted(breaks, cur)])
                ranges.append((cur, e + 1))
                if nch[e] == 1:
                    cur = int(only[e])
                    continue
                break
            nid = len(nodes)
            length = sum(b - a for a, b in ranges)
            nt = int(sum(tcum[b] - tcum[a] for a, b in ranges))
            node = Node(
                id=nid,
                parent=pnode,
                ranges=ranges,
                depth=self.depth[j],
                length=length,
                n_targets=nt,
            )
            nodes.append(node)
            for a, b in ranges:
                node_of[a:b] = nid
            if pnode >= 0:
                nodes[pnode].children.append(nid)
            else:
                roots.append(nid)
            for c in reversed(children_of_tok.get(e, [])):
                stack.append((c, nid))
        return nodes, roots, node_of

    def _leaf_roles(self) -> None:
        """Leaf role: the last request (highest seq) whose sequence lies on the root-to-leaf path."""
        best: dict[int, int] = {}
        self.leaves = []
        for node in self.nodes:  # parents precede children (pre-order)
            cand = best.get(node.parent, -1)
            for ri in node.requests:
                if cand < 0 or self.requests[ri].seq > self.requests[cand].seq:
                    cand = ri
            best[node.id] = cand
            if not node.children:
                self.leaves.append(node.id)
        self.leaf_request = {lf: best[lf] for lf in self.leaves}

    def node_path(self, node_id: int) -> list[int]:
        """Node ids from the root to ``node_id`` inclusive."""
        out = []
        while node_id >= 0:
            out.append(node_id)
            node_id = self.nodes[node_id].parent
        return out[::-1]

    def leaf_role(self, leaf: int) -> Role:
        ri = self.leaf_request.get(leaf, -1)
        return self.requests[ri].role if ri >= 0 else Role.MAIN

    def path_tokens(self, leaf: int) -> np.ndarray:
        """Tree indices of the root-to-leaf path, in order."""
        return np.concatenate([self.nodes[n].token_indices() for n in self.node_path(leaf)])

    def request_sequence(self, ri: int) -> list[int]:
        """Reconstruct request ``ri``'s full token sequence (input + output)."""
        r = self.requests[ri]
        out: list[int] = []
        for _d0, g0, ln in r.pieces:
            out.extend(self.tokens[g0 : g0 + ln])
        return out

    @property
    def n_targets(self) -> int:
        return int(sum(self.is_target))

    def __repr__(self) -> str:
        return (
            f"TrajectoryTree({self.execution_id!r}, requests={len(self.requests)}, tokens={len(self)}, "
            f"nodes={len(self.nodes)}, leaves={len(self.leaves)}, errors={len(self.errors)})"
        )


def build_tree(
    records: Iterable[TraceRecord],
    role_profile: RoleProfile | None = None,
    *,
    vocab_size: int | None = None,
    strict: bool = False,
    execution_id: str | None = None,
) -> TrajectoryTree:
    """Build one execution's tree from its records (any arrival order).

    Records are placed in ``seq`` order (so a base always precedes the records
    built on it). A record that cannot be used (fails validation, missing base,
    base_len too long, other execution, duplicate id) is skipped with a message
    naming it in ``tree.errors``; records based on a skipped record are skipped
    too (with their own message). ``strict=True`` raises on the first problem.
    """
    recs = sorted(records, key=lambda r: r.seq)
    profile = role_profile or default_profile()
    eid = execution_id if execution_id is not None else (recs[0].execution_id if recs else "")
    tree = TrajectoryTree(eid)
    first_meta = recs[0].meta if recs else {}
    for rec in recs:
        try:
            tree.add_record(rec, profile.role_of(rec.meta, first_meta), vocab_size)
        except (TreeBuildError, TraceFormatError) as e:
            if strict:
                raise
            tree.errors.append(str(e))
    return tree.finalize()
