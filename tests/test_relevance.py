"""The calibrated relevance signal: the n-gram space, z against chance, fit within the dialogue."""
from __future__ import annotations

import numpy as np

from mdd.evaluate.relevance import LexicalSpace, char_gram_counts, signals


def test_char_gram_counts():
    m = char_gram_counts(["睡不着", "", "AB"], 2**10)
    assert m.shape == (3, 2**10)
    assert m[0].sum() == 3 + 2 and m[1].sum() == 0 and m[2].sum() == 2 + 1  # unigrams + bigrams
    assert (char_gram_counts(["ab"], 2**10) != char_gram_counts(["AB"], 2**10)).nnz == 0  # lower-cased
    assert (char_gram_counts(["睡不着"], 2**10) != m[0]).nnz == 0  # the same text, the same row


def test_idf_weighs_frequent_characters_less():
    texts = ["我的睡眠不好", "我的心情不好", "我的胃口不好", "我的记性差"]
    space = LexicalSpace.fit(texts)
    v = space.encode(["我的", "睡眠"])
    # "我的" is in every text, "睡眠" in one: the rare one carries more weight before normalising
    idx_common = char_gram_counts(["我"], space.n_features).indices[0]
    idx_rare = char_gram_counts(["睡"], space.n_features).indices[0]
    assert space.idf[idx_rare] > space.idf[idx_common]
    assert np.allclose(np.asarray(v.multiply(v).sum(1)).ravel(), 1.0)


def test_signals_tell_matched_from_moved():
    space = LexicalSpace()
    qs = ["最近睡眠怎么样？", "胃口怎么样，吃得下饭吗？", "心情怎么样？", "有没有想过伤害自己？"]
    answers = ["睡眠很差，入睡困难，半夜总醒。", "胃口不好，吃不下饭，瘦了三斤。", "心情很低落，总想哭。",
               "没有想过伤害自己。"]
    ids = ["a"] * 4 + ["b"] * 4
    q = space.encode(qs + qs)
    a = space.encode(answers + answers[1:] + answers[:1])  # dialogue b: every answer one question off
    s = signals(q, a, ids, distractors=3)
    assert (s.z[:4] > s.z[4:]).all()
    assert (s.fit[:4] >= 1.0).all() and (s.fit[4:] < 1.0).all()
    assert np.isfinite(s.z).all() and s.rank.shape == (8,)
    # a batch of one dialogue falls back to its non-neighbouring pairs for chance
    one = signals(space.encode(qs), space.encode(answers), ["a"] * 4, distractors=3)
    assert np.isfinite(one.z).all()
