"""The verify pass's prefix tree (llamacpp/decode.candidate_items), without llama.cpp: which tokens a
member's context decodes for a request's candidates, in which sequences, and which logits score what."""

from __future__ import annotations

from specfuse.members.llamacpp.decode import CandidatePath, candidate_items, sequences_of


def _paths(*token_lists: tuple[int, ...], first_scored: int = 0) -> list[CandidatePath]:
    return [CandidatePath(c, 10 + c, tokens, first_scored) for c, tokens in enumerate(token_lists)]


def test_candidates_that_begin_alike_share_those_tokens_and_each_keeps_its_own_scores():
    # Each path re-reads one context token (index 0, whose logits score the tail's first token).
    paths = _paths((7, 1, 2, 3), (7, 1, 2, 4), (7, 5))
    items, scored = candidate_items(paths, start=40, share=True)
    # 7 and 1, 2 read once (7 by all three, 1 and 2 by two), then 3, 4 and 5 each in its own sequence.
    assert [(sequences_of(seq), pos, token) for seq, pos, token, _ in items] == [
        ((10, 11, 12), 40, 7),
        ((10, 11), 41, 1),
        ((10, 11), 42, 2),
        ((10,), 43, 3),
        ((11,), 43, 4),
        ((12,), 41, 5),
    ]
    # The shared token 7's logits score the first tail token of every candidate; 2's score 3 and 4.
    assert scored[0] == [(0, 0), (1, 0), (2, 0)]
    assert scored[2] == [(0, 2), (1, 2)]
    # A path's last token predicts nothing that is scored: no logits wanted there.
    assert [wants for *_, wants in items] == [True, True, True, False, False, False]
    # Every candidate's tail token is scored exactly once.
    counts = sorted((c, t) for each in scored for c, t in each)
    assert counts == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0)]


def test_whole_candidates_alike_are_read_once_and_unshared_paths_are_read_apiece():
    same = _paths((7, 1, 2), (7, 1, 2))
    items, scored = candidate_items(same, start=5, share=True)
    assert len(items) == 3 and all(sequences_of(seq) == (10, 11) for seq, *_ in items)
    assert scored[1] == [(0, 1), (1, 1)]
    apart, scored_apart = candidate_items(same, start=5, share=False)
    assert [sequences_of(seq) for seq, *_ in apart] == [(10,), (10,), (10,), (11,), (11,), (11,)]
    assert [s for s in scored_apart if s] == [[(0, 0)], [(0, 1)], [(1, 0)], [(1, 1)]]


def test_a_token_reached_by_other_tokens_is_not_shared():
    # The same token at the same position after different tokens sees another context: its own cell.
    items, _ = candidate_items(_paths((7, 1, 9), (7, 2, 9)), start=0, share=True)
    assert [(sequences_of(seq), token) for seq, _, token, _ in items] == [
        ((10, 11), 7),
        ((10,), 1),
        ((10,), 9),
        ((11,), 2),
        ((11,), 9),
    ]
