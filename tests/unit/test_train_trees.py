"""Real trajectory trees from gyre.trace (build_tree -> admit -> pack) through the trainer."""

from gyre.trace.admission import admit
from gyre.trace.assessment import Missing, MissingReason
from gyre.trace.synthetic import small_execution
from gyre.trace.tree import build_tree
from gyre.train.buffer import ReadyGroup
from gyre.train.config import ObjectiveConfig, OptimConfig, StreamConfig, TrainerConfig
from gyre.train.demo.coordinator import LocalCoordinator
from gyre.train.demo.core import Core
from gyre.train.replica import load_causal_lm


def _group(vocab):
    adms, rewards = {}, {}
    for k, r in enumerate([1.0, 0.0, 0.5, Missing(reason=MissingReason.overall_timeout)]):
        eid = f"q0/e{k}"
        tree = build_tree(small_execution(eid, seed=k, vocab=vocab))
        adms[eid] = admit(tree, j_max=4, seed=k)
        rewards[eid] = r
    return ReadyGroup("q0", rewards, admissions=adms)


def _step(model_dir, mode, budget, vocab, objective=None):
    cfg = TrainerConfig(
        model_dir=str(model_dir),
        dtype="float64",
        optim=OptimConfig(name="sgd", lr=1.0, grad_clip=None),
        objective=objective or ObjectiveConfig(ratio_reference="proximal"),
        stream=StreamConfig(
            batch_groups=1, token_budget=budget, pack_mode=mode, stall_timeout_s=30
        ),
    )
    core = Core(cfg, LocalCoordinator())
    core.start(resume=False)
    core.add_groups([_group(vocab)])
    res = core.run_step()
    params = {n: p.detach().clone() for n, p in core.model.named_parameters()}
    return params, res.metrics


def test_paths_and_tree_packing_train_identically(tiny_model_dir):
    vocab = load_causal_lm(str(tiny_model_dir)).config.vocab_size
    init = {
        n: p.detach() for n, p in load_causal_lm(str(tiny_model_dir), "float64").named_parameters()
    }
    p_paths, m_paths = _step(tiny_model_dir, "paths", 100_000, vocab)
    p_tree, m_tree = _step(tiny_model_dir, "tree", 100_000, vocab)
    p_split, m_split = _step(
        tiny_model_dir, "paths", 200, vocab
    )  # executions split across micro-steps
    p_tsplit, m_tsplit = _step(
        tiny_model_dir, "tree", 200, vocab
    )  # subtrees split across micro-steps
    moved = max(float((p_paths[k] - init[k]).abs().max()) for k in init)
    assert moved > 1e-3
    assert m_paths["batch/executions_missing"] == 1 and m_paths["batch/executions_scored"] == 3
    assert m_tree["train/tokens"] < m_paths["train/tokens"]  # the tree shares prefixes
    assert m_split["batch/executions_split"] >= 1 and m_tsplit["batch/executions_split"] >= 1
    for other in (p_tree, p_split, p_tsplit):
        assert max(float((p_paths[k] - other[k]).abs().max()) for k in init) < 1e-5 * moved
    assert (
        m_paths["actor/target_tokens"]
        == m_tree["actor/target_tokens"]
        == m_split["actor/target_tokens"]
        == m_tsplit["actor/target_tokens"]
    )
    assert m_paths["actor/pg_clipfrac"] == 0.0  # proximal reference: r = s = 1


def test_decoupled_reference_weights_by_behaviour_and_never_clips(tiny_model_dir):
    """'decoupled': the update of the behaviour reference with an unbounded clip band (w_t
    against b_t, no execution clipped), split across micro-steps or not; the behaviour
    reference with the paper's band clips these executions (their b_t are not the model's)."""
    vocab = load_causal_lm(str(tiny_model_dir)).config.vocab_size
    dec = ObjectiveConfig(ratio_reference="decoupled")
    wide = ObjectiveConfig(ratio_reference="behaviour", clip_low=1e-9, clip_high=1e9)
    p_dec, m_dec = _step(tiny_model_dir, "paths", 100_000, vocab, dec)
    p_split, m_split = _step(tiny_model_dir, "paths", 200, vocab, dec)
    p_wide, _ = _step(tiny_model_dir, "paths", 100_000, vocab, wide)
    p_prox, _ = _step(tiny_model_dir, "paths", 100_000, vocab)
    _, m_beh = _step(tiny_model_dir, "paths", 100_000, vocab, ObjectiveConfig())
    assert m_beh["actor/pg_clipfrac"] > 0
    assert m_dec["actor/pg_clipfrac"] == 0.0 == m_split["actor/pg_clipfrac"]
    assert m_split["batch/executions_split"] >= 1
    scale = max(float(p.abs().max()) for p in p_dec.values())
    for other in (p_wide, p_split):
        assert max(float((p_dec[k] - other[k]).abs().max()) for k in p_dec) < 1e-9 * scale
    # the token weights are the behaviour ratios, not 1: not the proximal update
    assert max(float((p_dec[k] - p_prox[k]).abs().max()) for k in p_dec) > 1e-6
