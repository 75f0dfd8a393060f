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
    lex["generic_places"] = set(data["generic_places"])
    lex["weak_compound"] = set(data["weak_compound_surnames"])
    lex["nickname_stop"] = set(data["nickname_stop"])
    lex["pinyin_surnames"] = tuple(data["pinyin_surnames"].split())
    lex["org_names"] = tuple(sorted(data["org_names"], key=len, reverse=True))
    lex["provinces"] = tuple(data["provinces"])
    lex["municipalities"] = set(data["municipalities"])
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
    head = text[max(0, start - 8):start].rstrip(" ：:，,（(")
    return any(h.endswith(c) for h in (head, head.rstrip("是为叫")) for c in lex["cue_before"])


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


_TITLES = ("医生", "医师", "大夫", "老师", "女士", "先生", "小姐", "主任", "护士长", "护士", "教授", "律师", "警官",
           "师傅",
           "经理", "阿姨", "叔叔", "院长", "校长", "老板", "书记", "科长", "处长", "局长", "队长", "班长")
_GIVEN_STOP = set("曾说称诉讲是在和与的了也都就又还于陪代告认觉表等及并因从到被把对给向跟去来")


_CALLED = re.compile(rf"(?:(?:小名|乳名|昵称|外号|绰号|网名|英文名)(?:叫|是|为|[:：])?|"
                     rf"(?:女儿|儿子|孩子|丈夫|妻子|爱人|男友|女友|前夫|前妻|父亲|母亲|患儿|患者)(?:的)?(?:名字叫|名字是|名叫|叫做))\s*"
                     rf"([{_CJK}]{{2,3}}|[A-Za-z][A-Za-z ]{{1,20}}[A-Za-z])(?=[，,。；;、）)\s]|$)")


def titled_names(text: str) -> Iterator[Span]:
    """Names written short: a surname with a title (张医生, 刘女士, 王老师), a nickname (小李, 老王), and
    compound surnames with their given name (司马光明), which jieba splits in odd places."""
    lex = _lex()
    strong = lex["surnames"] - lex["weak_surnames"]
    for m in re.finditer(f"[{''.join(sorted(strong))}](?=(?:{'|'.join(_TITLES)}))", text):
        k = m.start()
        if k > 0 and _freq(text[k - 1:k + 1]) > 0:  # 主任医师: 任 ends a word here
            continue
        yield Span(k, k + 1, "name", "某")
    for m in re.finditer(f"[小老][{''.join(sorted(strong))}]", text):  # 小李, 老王: not 小麦, 从小, 养老
        if m.group() in lex["nickname_stop"] or text[max(0, m.start() - 1):m.start() + 1] in lex["nickname_stop"] \
                or len(_tokens(text[m.start():m.start() + 6])[0][2]) > 2:  # 小游戏, 老江湖: a longer word
            continue
        nxt = text[m.end():m.end() + 1]
        if nxt not in ("", "家") and _freq(m.group()[1] + nxt) >= 50:  # 小马达, 小马上: the surname starts a word
            continue
        yield Span(m.start(), m.end(), "name", "某某")
    for m in _CALLED.finditer(text):  # 其女儿叫朵朵, 小名叫二丫: what follows is a name
        yield Span(m.start(1), m.end(1), "name", "某某")
    for c in lex["compound_surnames"]:
        for m in re.finditer(f"{c}([{_CJK}]{{1,2}})", text):
            given = m.group(1)
            if len(given) == 2 and given[1] in _GIVEN_STOP:
                given = given[0]
            cued = _cue_before(text, m.start()) or _cue_after(text, m.start() + len(c) + len(given))
            if given[0] in _GIVEN_STOP or (c in lex["weak_compound"] and not cued):
                continue
            yield Span(m.start(), m.start() + len(c) + len(given), "name", "某某")


@functools.lru_cache(maxsize=1)
def _pinyin_re() -> re.Pattern[str]:
    sur = "|".join(sorted(_lex()["pinyin_surnames"], key=len, reverse=True))
    word = r"[A-Z][a-z]{1,9}"
    s = rf"(?:(?i:{sur})(?![a-z]))"
    return re.compile(rf"(?<![A-Za-z])(?:(?:Dr|Mr|Mrs|Ms|Miss|Prof)\.?\s+(?=[A-Z]){s}|"
                      rf"(?=[A-Z]){s}\s+{word}(?:[-\s]{word})?|{word}\s+(?=[A-Z]){s})(?![A-Za-z])")


def latin_names(text: str) -> Iterator[Span]:
    """Names in pinyin or English with a pinyin surname: Zhang Wei, ZHANG Wei, Lily Wang, Dr. Chen."""
    for m in _pinyin_re().finditer(text):
        yield Span(m.start(), m.end(), "name", "某某")


def _org_prefix(text: str, start: int) -> int:
    """Where the specific name before a class word at ``start`` begins (== start: none)."""
    lex = _lex()
    lo = start
    while lo > 0 and start - lo < 20 and re.match(f"[{_CJK}A-Za-z0-9第〇]", text[lo - 1]):
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
    if re.search(r"[A-Za-z0-9]|第[一二三四五六七八九十0-9]|^[〇零一二三四五六七八九]{2,}$", prefix):
        return True
    toks = _tokens(prefix)
    rest = [t for t in toks if t[2] not in lex["generic"]]
    if not rest:
        return False
    return any((f in ("ns", "nr", "nrt", "nt", "nz", "nrfg", "j", "eng") or (len(w) >= 2 and _freq(w) == 0))
               and w not in lex["protected"] for _, _, w, f in rest)


_ADDR_NUM = r"[0-9一二三四五六七八九十百千零〇两]+"
_ADDR_UNIT = r"(?:号楼|号院|号|栋|幢|座|单元|室|楼|层|户|弄|排|巷)"
# a street, lane, estate or compound word before a house number (an estate's name goes with it: 幸福里小区5栋)
_STREET = r"(?:大道|大街|胡同|路|街|巷|弄|道|村|里|小区|花园|家园|新村|公寓|大厦|广场|社区|区|园|苑|庄|院|城|府|湾)"
# after the house number, a building and its room: 华夏路10号富力中心2801
_BUILDING = (rf"(?:\s*[{_CJK}]{{2,8}}?(?:中心|大厦|广场|公寓|大楼|写字楼|商城|花园|城)[A-Z]?(?:座|栋)?\s*"
             rf"[0-9]{{2,5}}(?:室|号)?(?![0-9]))?")
_ADDRESS = re.compile(rf"([{_CJK}]{{1,12}}?{_STREET})\s*({_ADDR_NUM}\s*{_ADDR_UNIT}"
                      rf"(?:\s*-?\s*{_ADDR_NUM}\s*{_ADDR_UNIT})*{_BUILDING})")
_PLACE_SUFFIX = tuple("市区县镇乡村路街州旗") + ("大道", "胡同", "街道", "新区")
# administrative units after a province or a first place: 周口市沈丘县付井镇王庄村 (each unit 1-5 characters)
_UNITS = re.compile(rf"(?:[{_CJK}]{{1,5}}?(?:自治州|自治县|地区|街道|大道|大街|市|州|盟|区|县|旗|镇|乡|村|屯|路|街))+")
_UNIT_END = ("市", "州", "盟", "区", "县", "旗", "镇", "乡", "村", "屯", "街道")


@functools.lru_cache(maxsize=1)
def _province() -> re.Pattern[str]:
    lex = _lex()
    return re.compile("(" + "|".join(sorted(lex["provinces"], key=len, reverse=True)) + ")(省|市|(?:[" + _CJK +
                      "]{0,6}?)自治区)?")


def _place_word(w: str, f: str) -> bool:
    """A word that names a place by its unit: 3+ characters ending in 市, 区, 县, 镇 …, tagged as a
    place or a name by jieba or unknown to its dictionary, and not a common word (大城市, 开发区)."""
    lex = _lex()
    return (len(w) >= 3 and w.endswith(_UNIT_END) and not w.endswith(("省", "自治区")) and w not in lex["protected"]
            and w not in lex["generic_places"] and "某" not in w
            and (f in ("ns", "nr", "nrt", "nrfg", "nz", "nt") or _freq(w) < 20))


def _chains(text: str, toks: list[tuple[int, int, str, str]]) -> Iterator[Span]:
    """Administrative chains: after a province (河南省 + 周口市沈丘县…; a municipality such as 北京市 goes
    with its districts), or from a place word on (凉山州 + 昭觉县)."""
    lex = _lex()
    for m in _province().finditer(text):
        u = _UNITS.match(text, m.end())
        if u is None:
            continue
        units = _split_units(u.group())
        if not units or units[0] in lex["generic_places"]:
            continue
        muni = m.group(1) in lex["municipalities"] and m.group(2) in (None, "市")
        yield Span(m.start() if muni else m.end(), u.end(), "place", "某地")
    for s, e, w, f in toks:
        if _place_word(w, f):
            u = _UNITS.match(text, e)
            end = e + len("".join(_split_units(u.group()))) if u else e
            yield Span(s, end, "place", "某地")


def _split_units(chain: str) -> list[str]:
    """The units of a chain, up to the first one that is a common word (城区, 市区)."""
    out = []
    units = "自治州|自治县|地区|街道|大道|大街|市|州|盟|区|县|旗|镇|乡|村|屯|路|街"
    for u in re.findall(rf"[{_CJK}]{{1,5}}?(?:{units})", chain):
        if u in _lex()["generic_places"] or len(u) < 2:
            break
        out.append(u)
    return out


_NUMBERED_SCHOOL = re.compile(r"(第?[一二三四五六七八九十0-9]{1,3})(中|小|院)(?=[，。、；,.\s的读上毕就住看治门]|$)")


def places(text: str, toks: list[tuple[int, int, str, str]]) -> Iterator[Span]:
    lex = _lex()
    for m in _ADDRESS.finditer(text):
        s = _org_prefix(text, m.start(1) + len(m.group(1)) - 1)  # the street's name back to a boundary
        s = max(s, m.start(1))
        yield Span(s, m.end(), "address", "某地址")
    for s, e, w, f in toks:
        if f in ("ns", "nt", "nz") and len(w) >= 3 and w.endswith(_PLACE_SUFFIX) and not w.endswith(("省", "自治区")) \
                and w not in lex["protected"] and w not in lex["generic_places"]:
            yield Span(s, e, "place", "某地")
    yield from _chains(text, toks)
    for m in _NUMBERED_SCHOOL.finditer(text):  # 北京四中, 成都七中: a place and a number
        ps = _org_prefix(text, m.start())
        prefix = text[ps:m.start()]
        if 2 <= len(prefix) <= 4 and prefix not in lex["generic"] and any(
                f in ("ns", "j") for _, _, _, f in _tokens(prefix)):
            yield Span(ps, m.end(), "org", {"中": "某中学", "小": "某小学", "院": "某医院"}[m.group(2)])
    for s, e, w, f in toks:  # an organisation jieba knows whole (华为技术有限公司 nt)
        if f == "nt" and w not in lex["protected"]:
            vague = next((v for c, v in lex["org_classes"] if w.endswith(c) and len(w) > len(c)), None)
            if vague is not None and w[:len(w) - next(len(c) for c, v in lex["org_classes"] if w.endswith(c))] \
                    not in lex["generic"]:
                yield Span(s, e, "org", vague)
    for word in lex["org_names"]:  # employers known by their name alone (字节跳动, 阿里巴巴)
        pos = 0
        while (k := text.find(word, pos)) >= 0:
            pos = k + len(word)
            yield Span(k, pos, "org", "某公司")
    for word, vague in lex["org_classes"]:
        pos = 0
        while (k := text.find(word, pos)) >= 0:
            pos = k + len(word)
            s = _org_prefix(text, k)
            if s < k and _specific(text[s:k]):
                yield Span(s, k + len(word), "org", vague)


def find(text: str) -> list[Span]:
    """Names, places and organisations in ``text`` (possibly overlapping; the caller merges)."""
    if not text:
        return []
    latin = list(latin_names(text)) if re.search("[A-Za-z]", text) else []
    if not re.search(f"[{_CJK}]", text):
        return latin
    toks = _tokens(text)
    return latin + list(names(text, toks)) + list(titled_names(text)) + list(places(text, toks))
