"""Names, places and organisations: jieba's part-of-speech tagger (nr / ns / nt / nz) as the
named-entity component, checked by rules that the probe set (tests/privacy_probe.py) measures.

jieba's tags alone are not usable on clinical text: on the 27 sample cases and the MDD-5k slice it
tags drugs (左洛复, 来士普), symptoms (易醒, 麻木, 易怒) and common words (安静, 陈述, 东西) as
names or places. A tagged word counts here only when the rules agree:

- person name: a jieba ``nr`` word (or a surname jieba split off: 李 + 明说) that starts with a
  common surname, is 2-4 characters, is not a clinical or common word, and either stands next to a
  cue (患者, 其女儿, 主治医生, 姓名, 陈述, 陪同, 先生 …) or is a word jieba's dictionary does not know
  (a name its HMM found);
- organisation or estate: a class word (医院, 中学, 公司, 小区 …) after a specific name: the words
  before it (back to a boundary such as 在, 于, 一所) hold a place, a name, an organisation, a
  number (第三) or Latin letters as jieba tags them; generic ones (当地医院, 县人民医院, 精神专科医院)
  stay;
- place: a jieba ``ns`` / ``nt`` / ``nz`` word ending in 市, 区, 县, 镇, 乡, 村, 路, 街, 道 … (provinces
  stay), and every street address with a house number (digits or Chinese numerals).
"""
from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Iterator

from mdd import knowledge

_CJK = "\u3400-\u9fff"


@dataclass(frozen=True, slots=True)
class Span:
    start: int
    end: int
    kind: str  # name | org | place | address
    repl: str


@functools.lru_cache(maxsize=1)
def _lex() -> dict:
    data = knowledge.load_yaml("privacy.yaml")
    lex = dict(data)
    lex["weak_surnames"] = set(data["weak_surnames"])
    lex["surnames"] = set(data["surnames"].replace(" ", "").replace("\n", ""))
    lex["compound_surnames"] = tuple(data["compound_surnames"])
    lex["protected"] = set(data["protected"])
    lex["generic"] = set(data["org_generic"])
    lex["cue_before"] = sorted(data["name_cues_before"], key=len, reverse=True)
    lex["cue_after"] = tuple(data["name_cues_after"])
    lex["boundaries"] = sorted(data["org_boundaries"], key=len, reverse=True)
    # class word -> vague word, longest first
    lex["org_classes"] = sorted(((w, vague) for vague, words in data["org_classes"].items() for w in words),
                                key=lambda x: -len(x[0]))
    return lex


@functools.lru_cache(maxsize=1)
def _jieba():
    import jieba
    import jieba.posseg as pseg

    jieba.setLogLevel(logging.WARNING)
    tok = pseg.POSTokenizer(jieba.Tokenizer())
    tok.tokenizer.initialize()
    return tok


def _freq(word: str) -> int:
    return _jieba().tokenizer.FREQ.get(word) or 0


def _tokens(text: str) -> list[tuple[int, int, str, str]]:
    out, pos = [], 0
    for w in _jieba().cut(text):
        out.append((pos, pos + len(w.word), w.word, w.flag))
        pos += len(w.word)
    return out


def _surname_len(word: str) -> int:
    lex = _lex()
    for c in lex["compound_surnames"]:
        if word.startswith(c):
            return len(c)
    return 1 if word[:1] in lex["surnames"] else 0


_ALL_CJK = re.compile(f"[{_CJK}]+")


def _name_ok(word: str) -> bool:
    lex = _lex()
    s = _surname_len(word)
    return (s > 0 and 2 <= len(word) <= s + 2 and bool(_ALL_CJK.fullmatch(word)) and word not in lex["protected"]
            and "某" not in word)


def _cue_before(text: str, start: int) -> bool:
    lex = _lex()
    head = text[max(0, start - 8):start].rstrip(" ：:，,是为叫")
    return any(head.endswith(c) for c in lex["cue_before"])


def _cue_after(text: str, end: int) -> bool:
    tail = text[end:end + 6]
    if tail[:1] in " ，,":  # after a comma only the gender: 张伟，男，
        return tail.lstrip(" ，,")[:1] in ("男", "女")
    return tail.startswith(_lex()["cue_after"])


def names(text: str, toks: list[tuple[int, int, str, str]]) -> Iterator[Span]:
    lex = _lex()
    i = 0
    while i < len(toks):
        s, e, w, f = toks[i]
        cand, used = None, i
        if f in ("nr", "nrfg", "nrt") and _name_ok(w):
            cand = (s, e, w)
        elif _name_ok(w) and _freq(w) < 20 and (_cue_before(text, s) or _cue_after(text, e)):
            cand = (s, e, w)  # jieba called a rare word after a cue a place (郑浩 ns): the cue decides
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if nxt is not None and w in lex["compound_surnames"] and _ALL_CJK.fullmatch(nxt[2]) and len(nxt[2]) <= 2:
            cand, used = (s, nxt[1], w + nxt[2]), i + 1  # 欧阳 + 娜
        elif nxt is not None and f in ("nr", "nrfg") and _ALL_CJK.fullmatch(nxt[2]) and _freq(w) == 0 or (
                nxt is not None and _surname_len(w) == len(w) and f in ("nr", "nrfg") and _ALL_CJK.fullmatch(nxt[2])):
            # jieba split a name: 李 + 明说, 王 + 秀英, 张小 + 明说
            w2 = nxt[2]
            if len(w2) == 2 and w2[1] in "说讲称诉":
                w2 = w2[0]
            if len(w) + len(w2) <= _surname_len(w) + 2 and (len(w) == _surname_len(w) or len(w2) == 1):
                merged = (s, s + len(w) + len(w2), w + w2)
                # a merged name needs a cue, or a given name jieba itself calls a name
                if nxt[3] in ("nr", "nrfg") or _cue_before(text, s) or _cue_after(text, merged[1]):
                    cand, used = merged, i + 1
        if cand is not None:
            cs, ce, cw = cand
            cue = _cue_before(text, cs) or _cue_after(text, ce)
            unknown = _freq(cw) == 0 and cw[0] not in lex["weak_surnames"]
            if _name_ok(cw) and (cue or unknown):
                yield Span(cs, ce, "name", "某某")
                i = used
        i += 1


def _org_prefix(text: str, start: int) -> int:
    """Where the specific name before a class word at ``start`` begins (== start: none)."""
    lex = _lex()
    lo = start
    while lo > 0 and start - lo < 20 and re.match(f"[{_CJK}A-Za-z0-9第]", text[lo - 1]):
        lo -= 1
    window = text[lo:start]
    proper = [(s, e) for s, e, w, f in _tokens(window) if f in ("ns", "nr", "nrt", "nz", "nt", "nrfg") and e - s >= 2]
    cut = 0
    for b in lex["boundaries"]:  # the last boundary word, unless it lies inside a name (华为, 和平)
        k = window.rfind(b)
        while k >= 0 and len(b) == 1 and any(s <= k < e for s, e in proper):
            k = window.rfind(b, 0, k)
        if k >= 0 and k + len(b) > cut:
            cut = k + len(b)
    return lo + cut


def _specific(prefix: str) -> bool:
    lex = _lex()
    if not prefix or "某" in prefix or prefix in lex["generic"]:
        return False
    if re.search(r"[A-Za-z0-9]|第[一二三四五六七八九十0-9]", prefix):
        return True
    toks = _tokens(prefix)
    rest = [t for t in toks if t[2] not in lex["generic"]]
    if not rest:
        return False
    return any((f in ("ns", "nr", "nrt", "nt", "nz", "nrfg", "j", "eng") or (len(w) >= 2 and _freq(w) == 0))
               and w not in lex["protected"] for _, _, w, f in rest)


_ADDR_NUM = r"[0-9一二三四五六七八九十百千零〇两]+"
_ADDR_UNIT = r"(?:号楼|号院|号|栋|幢|座|单元|室|楼|层|户|弄|排|巷)"
_ADDRESS = re.compile(rf"([{_CJK}]{{1,8}}?(?:大道|大街|胡同|路|街|巷|弄|道|村|里))\s*({_ADDR_NUM}\s*{_ADDR_UNIT}"
                      rf"(?:\s*-?\s*{_ADDR_NUM}\s*{_ADDR_UNIT})*)")
_PLACE_SUFFIX = tuple("市区县镇乡村路街州旗") + ("大道", "胡同", "街道", "新区")


def places(text: str, toks: list[tuple[int, int, str, str]]) -> Iterator[Span]:
    lex = _lex()
    for m in _ADDRESS.finditer(text):
        s = _org_prefix(text, m.start(1) + len(m.group(1)) - 1)  # the street's name back to a boundary
        s = max(s, m.start(1))
        yield Span(s, m.end(), "address", "某地址")
    for s, e, w, f in toks:
        if f in ("ns", "nt", "nz") and len(w) >= 3 and w.endswith(_PLACE_SUFFIX) and not w.endswith(("省", "自治区")) \
                and w not in lex["protected"]:
            yield Span(s, e, "place", "某地")
    for s, e, w, f in toks:  # an organisation jieba knows whole (华为技术有限公司 nt)
        if f == "nt" and w not in lex["protected"]:
            vague = next((v for c, v in lex["org_classes"] if w.endswith(c) and len(w) > len(c)), None)
            if vague is not None and w[:len(w) - next(len(c) for c, v in lex["org_classes"] if w.endswith(c))] \
                    not in lex["generic"]:
                yield Span(s, e, "org", vague)
    for word, vague in lex["org_classes"]:
        pos = 0
        while (k := text.find(word, pos)) >= 0:
            pos = k + len(word)
            s = _org_prefix(text, k)
            if s < k and _specific(text[s:k]):
                yield Span(s, k + len(word), "org", vague)


def find(text: str) -> list[Span]:
    """Names, places and organisations in ``text`` (possibly overlapping; the caller merges)."""
    if not text or not re.search(f"[{_CJK}]", text):
        return []
    toks = _tokens(text)
    return list(names(text, toks)) + list(places(text, toks))
