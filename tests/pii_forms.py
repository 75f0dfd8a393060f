"""Hypothesis strategies for personal data written in the many forms people use, and a scanner that
finds any of it again in output text (digits, width and separators normalised)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from hypothesis import strategies as st

from mdd.privacy import normalise

FULL = str.maketrans("0123456789+-.@()Xx", "０１２３４５６７８９＋－．＠（）Ｘｘ")
CN = str.maketrans("0123456789", "〇一二三四五六七八九")
SEPS = (" ", "-", ".", "－", "．", "　", " - ")


@dataclass(frozen=True)
class Datum:
    kind: str
    text: str  # as written in the input
    core: str  # what must never be found again (normalised: digits, lower case)


digits = lambda n: st.text("0123456789", min_size=n, max_size=n)  # noqa: E731


@st.composite
def mobile(draw) -> Datum:
    core = "1" + draw(st.sampled_from("3456789")) + draw(digits(9))
    sep = draw(st.sampled_from(("",) + SEPS))
    body = sep.join((core[:3], core[3:7], core[7:])) if sep else core
    prefix = draw(st.sampled_from(("", "+86 ", "+86-", "0086 ", "86", "(+86) ")))
    text = prefix + body
    form = draw(st.sampled_from(("ascii", "full", "cn", "spelled")))
    if form == "full":
        text = text.translate(FULL)
    elif form == "cn":
        text = core.translate(CN)
    elif form == "spelled":
        text = " ".join(core)
    return Datum("mobile", text, core)


@st.composite
def landline(draw) -> Datum:
    area = draw(st.sampled_from(("010", "020", "021", "0755", "0571", "0512", "028")))
    local = draw(st.sampled_from("2345678")) + draw(digits(draw(st.sampled_from((6, 7)))))
    form = draw(st.sampled_from(("({a}){l}", "（{a}）{l}", "{a}-{l}", "{a} {l}", "{a}-{h}-{t}", "{a}{l}")))
    text = form.format(a=area, l=local, h=local[:4], t=local[4:])
    if draw(st.booleans()):
        text = text.translate(FULL)
    return Datum("landline", text, area + local)


@st.composite
def id_card(draw) -> Datum:
    region = draw(st.sampled_from(("110101", "310104", "440305", "510107", "650102")))
    y, m, d = draw(st.integers(1930, 2010)), draw(st.integers(1, 12)), draw(st.integers(1, 28))
    if draw(st.booleans()):  # 18 characters
        core = f"{region}{y:04d}{m:02d}{d:02d}{draw(digits(3))}" + draw(st.sampled_from("0123456789Xx"))
    else:  # the old 15 digits
        core = f"{region}{y % 100:02d}{m:02d}{d:02d}{draw(digits(3))}"
    text = draw(st.sampled_from((core, core.translate(FULL), f"{core[:6]} {core[6:-4]} {core[-4:]}")))
    return Datum("id_card", text, core.lower())


@st.composite
def bank_card(draw) -> Datum:
    core = draw(st.sampled_from(("62", "4", "5"))) + draw(digits(draw(st.integers(14, 17))))
    sep = draw(st.sampled_from(("", " ", "-", "　")))
    text = sep.join(core[i:i + 4] for i in range(0, len(core), 4))
    if draw(st.booleans()):
        text = text.translate(FULL)
    return Datum("bank_card", text, core)


@st.composite
def email(draw) -> Datum:
    local = draw(st.text("abcdefghijkmnpqrstuvwxyz", min_size=5, max_size=9)) + draw(digits(3))
    domain = draw(st.sampled_from(("example.com", "163.com", "qq.com", "例子.中国", "邮件.公司.cn", "医院.网络")))
    at = draw(st.sampled_from(("@", "＠", "(at)")))
    return Datum("email", f"{local}{at}{domain}", local)


@st.composite
def qq(draw) -> Datum:
    core = draw(st.sampled_from("123456789")) + draw(digits(draw(st.integers(8, 9))))
    cue = draw(st.sampled_from(("QQ：", "QQ号 ", "qq号码是", "扣扣:")))
    return Datum("qq", cue + core, core)


@st.composite
def wechat(draw) -> Datum:
    core = draw(st.sampled_from("abcdefghkmnpqrstwxyz")) + draw(st.text("abcdefghkmnpqrstwxyz_", min_size=5,
                                                                           max_size=10)) + draw(digits(3))
    cue = draw(st.sampled_from(("微信：", "微信号 ", "vx: ", "WeChat: ")))
    return Datum("wechat", cue + core, core)


@st.composite
def record_number(draw) -> Datum:
    core = draw(st.sampled_from("123456789")) + draw(digits(draw(st.integers(8, 10))))
    cue = draw(st.sampled_from(("住院号：", "病案号", "门诊号:", "医保卡号是")))
    return Datum("record_number", cue + core, core)


datum = st.one_of(mobile(), landline(), id_card(), bank_card(), email(), qq(), wechat(), record_number())
FILLER = st.sampled_from(("患者近两月情绪低落，", "睡眠差，", "联系方式", "家属电话", "平素体健。", "", "，", "自诉",
                          "2019年3月起病，", "每天1-2次，"))


@st.composite
def embedded(draw, data=datum) -> tuple[str, Datum]:
    """A datum inside clinical-looking text."""
    d = draw(data)
    return draw(FILLER) + d.text + draw(FILLER), d


_JOIN = re.compile(r"(?<=[0-9])[ \-.()]{1,3}(?=[0-9])")


def searchable(text: str) -> str:
    """Output text as the scanner reads it: normalised, lower case, separators between digits removed."""
    return _JOIN.sub("", normalise(text).lower())


def leaks(text: str, data: list[Datum]) -> list[Datum]:
    s = searchable(text)
    return [d for d in data if d.core in s]
