"""De-identification: one pattern set for case text, case ids, rejects and logs.

Every free-text field of a case is scrubbed when it is validated (``mdd.cases``): each
personal datum found is replaced by a token that names its kind (``[手机号已隐去]``), and the
case records ``field:kind`` (never the value). Case ids (患者) that look personal are replaced by
a stable keyed hash (``anon-`` + 16 hex digits); ``privacy.case_ids: always`` hashes every id.

What is found (the README's table says the same; ``KINDS`` is the source):

============== ====================================================================================
kind           what
============== ====================================================================================
email          e-mail addresses, also with non-ASCII (Chinese) local parts and domains, ``(at)``
mobile         Chinese mobile numbers (1[3-9] + 9 digits), optional +86 / 0086 / 86
landline       numbers with an area code: 0 + 9-11 digits ("(010)12345678", "0755-1234-5678")
phone          any other number of 5+ digits given after a phone cue (电话, 手机, 座机, 联系方式, tel)
id_card        resident ID numbers: 18 characters (17 digits + digit or X) or the old 15 digits,
               with a plausible birth date
bank_card      bank-card-like digit runs: 12 or more digits that are none of the above
qq             a number given as a QQ id (QQ, 扣扣)
wechat         an id given as a WeChat id (微信, 微信号, vx, wx, WeChat)
record_number  an identifier given after 住院号, 病案号, 门诊号, 病历号, 就诊卡号, 医保卡号, 社保卡号,
               护照号, 证件号, 身份证号, 卡号
address        house, building, unit and room numbers after a street or estate word (路 街 巷 弄 道
               村 区 园 苑 里 庄 寓 厦), with the street's name (ner.py): 某地址
number         7 or more digits spelled out one by one ("1 3 8 1 …") that are none of the above
url            web addresses (https://…, www.…, a domain with a path); not localhost or an IP
postcode       six digits after 邮编 / 邮政编码
account        a social-media id given as such (抖音号：…, 微博@…)
ip             an IPv4 address after "IP" (other IPs, a log's node address, stay)
============== ====================================================================================

Digits are recognised in every common form: half- and full-width (１３８…), Chinese numerals
(一三八…, 〇/零/幺, 壹贰叁…), and split by spaces, dashes, dots or parentheses ("138 1234 5678",
"138.1234.5678", "+86-138-1234-5678", "1 3 8 1 2 3 4 5 6 7 8"). A number split into groups counts
only when every group has at least 3 digits (or every group one digit), so dates such as
"2013.10.15-2014.01.20" are left alone. A case id that is a name is hashed (see ``looks_personal_id``).

Since issue 24 the set also finds (to GB/T 39725-2020, as the MDD-5k paper describes its cases):
person names, places and organisations (``mdd.privacy.ner``: jieba's tagger checked by rules;
replaced by 某某, 某地, 某地址, 某医院, 某中学, 某公司, 某小区 …), identifying dates (a day, or a
month with a birth / visit cue: 某年某月某日; durations and relative times such as 3月前 stay),
the patient's and relatives' stated ages (rounded to the nearest ten), licence plates, passport
and employee numbers; control, bidi and zero-width characters are removed and counted. The
probe set ``tests/privacy_probe.py`` measures recall and precision per kind.

The key of the id hash comes from the environment variable named by ``privacy.key_env``
(``MDD_PRIVACY_KEY``), never from the config file. Without it, the first run into an output
makes a random key and keeps it in ``OUT/.privacy-key`` (mode 0600), so reruns into the same
output give the same ids and resume works; keep that file out of published copies (or set the
variable, which also gives the same ids across outputs).
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import unicodedata
from dataclasses import dataclass
from typing import Any, Iterable

log = logging.getLogger(__name__)

# kind -> replacement token
KINDS: dict[str, str] = {
    "email": "[邮箱已隐去]",
    "mobile": "[手机号已隐去]",
    "landline": "[电话已隐去]",
    "phone": "[电话已隐去]",
    "id_card": "[身份证号已隐去]",
    "bank_card": "[银行卡号已隐去]",
    "qq": "[QQ号已隐去]",
    "wechat": "[微信号已隐去]",
    "record_number": "[证件号已隐去]",
    "address": "某地址",
    "number": "[号码已隐去]",
    "name": "某某",
    "place": "某地",
    "org": "某单位",
    "date": "某年某月某日",
    "age": "",  # replaced by the age rounded to the nearest ten
    "plate": "[车牌号已隐去]",
    "passport": "[护照号已隐去]",
    "employee_number": "[工号已隐去]",
    "url": "[网址已隐去]",
    "postcode": "[邮编已隐去]",
    "account": "[账号已隐去]",
    "ip": "[IP地址已隐去]",
}

KEY_FILE = ".privacy-key"
SAFE_ID_PREFIX = "anon-"

# --- normalisation: one character in, one character out (spans stay aligned) ----------------

_CN_DIGITS = {"〇": "0", "零": "0", "一": "1", "幺": "1", "二": "2", "三": "3", "四": "4", "五": "5", "六": "6",
              "七": "7", "八": "8", "九": "9", "壹": "1", "贰": "2", "叁": "3", "肆": "4", "伍": "5", "陆": "6",
              "柒": "7", "捌": "8", "玖": "9"}
_DASHES = "‐‑‒–—―−﹣－"
_TABLE = {ord(k): v for k, v in _CN_DIGITS.items()}
_TABLE.update({ord(c): "-" for c in _DASHES})
_TABLE.update({0x3000: " ", 0xA0: " ", 0x2002: " ", 0x2003: " ", 0x2009: " ", ord("\t"): " ",
               ord("·"): ".", ord("・"): ".", ord("•"): "."})
_TABLE.update({cp: chr(cp - 0xFEE0) for cp in range(0xFF01, 0xFF5F) if cp not in _TABLE})  # full-width ASCII


def normalise(text: str) -> str:
    """Same length as ``text``: full-width forms, Chinese numerals and dash variants made ASCII."""
    return text.translate(_TABLE)


# --- patterns (on normalised text) -----------------------------------------------------------------

_SEP = r"[ \-.()、_，,/]"
_CUE_TAIL = r"(?:号码|号|码|ID|id)?\s*(?:是|为|[:：])?\s*"
_CJK = "\u3400-\u9fff"
# a local part is ASCII, or up to 4 CJK characters (a name) and ASCII; a top-level domain ASCII or 2-4 CJK
_EMAIL = re.compile(rf"(?:[{_CJK}]{{1,4}}[A-Za-z0-9._%+\-]*|[A-Za-z0-9._%+\-]+)(?:@|\(at\)|\[at\])"
                    rf"(?:[A-Za-z0-9\-{_CJK}]+\.)+(?:[A-Za-z]{{2,63}}|[{_CJK}]{{2,4}})")
_CUED = (
    ("qq", re.compile(r"(?i)(?:qq|扣扣|企鹅号?|q号)" + _CUE_TAIL + r"([0-9](?:" + _SEP + r"?[0-9]){4,12})")),
    ("wechat", re.compile(r"(?i)(?:微信|薇信|威信|v信|weixin|wechat|vx|wx)" + _CUE_TAIL +
                          r"([A-Za-z][-_A-Za-z0-9]{5,19}|\+?[0-9](?:" + _SEP + r"{0,3}[0-9]){4,})")),
    ("record_number", re.compile(r"(?i)(?:住院号|病案号|门诊号|病历号|就诊卡号|就诊号|医保卡号|社保卡号|医保号|社保号|"
                                 r"社会保障号码?|"
                                 r"登记号|档案号|流水号|挂号单号|条码号|患者ID|病人ID|病历ID|ID号|证件号|身份证号?|卡号|账号|帐号|"
                                 r"台胞证号?|回乡证号?|居住证号?|士兵证号?|IMEI|imei)"
                                 + _CUE_TAIL + r"([A-Za-z0-9](?:[-A-Za-z0-9 ]?[A-Za-z0-9]){3,})")),
    ("passport", re.compile(r"(?:护照|通行证|签证)" + _CUE_TAIL + r"([A-Za-z]{0,2}[0-9](?:[- ]?[0-9]){5,9})")),
    ("employee_number", re.compile(r"(?:工号|员工号|员工编号|职工号|职工编号|工作证号|学号|警号|军官证号?|"
                                   r"驾驶证号|驾照号|编号)"
                                   + _CUE_TAIL + r"([A-Za-z0-9](?:[-_A-Za-z0-9 ]?[A-Za-z0-9]){2,})")),
    ("account", re.compile(r"(?i)(?:抖音|快手|微博|小红书|b站|哔哩哔哩|知乎|豆瓣|贴吧|ins|instagram|twitter|推特|"
                           r"脸书|facebook|"
                           r"tiktok|游戏)(?:号|账号|帐号|id|用户名|昵称|ID)\s*(?:是|为|[:：])?\s*@?"
                           r"([A-Za-z0-9_\-.]{2,30}|[\u3400-\u9fff][\u3400-\u9fffA-Za-z0-9_\-]{1,15})")),
    ("account", re.compile(r"(?i)(?:抖音|快手|微博|小红书|b站|知乎|豆瓣|贴吧|ins|twitter|推特|tiktok)[^，。；\s@]{0,4}"
                           r"(@[A-Za-z0-9_\-.\u3400-\u9fff]{2,30})")),
    ("ip", re.compile(r"(?i)ip(?:地址)?\s*(?:是|为|[:：])?\s*([0-9]{1,3}(?:\.[0-9]{1,3}){3})(?![0-9])")),
    ("phone", re.compile(r"(?i)(?:联系电话|联系方式|电话|手机|座机|tel|phone|mobile)" + _CUE_TAIL +
                         r"(\+?\(?[0-9](?:" + _SEP + r"{0,3}[0-9]){4,})")),
)
_POSTCODE = re.compile(r"(?:邮编|邮政编码|邮码)\s*(?:是|为|[:：])?\s*([0-9]{6})(?![0-9])")
# web addresses: a scheme or www., or a domain with a path (weibo.com/name)
# (a machine's own address, localhost or an IP, is no one's: a log's dashboard link stays)
_URL = re.compile(r"(?i)(?:https?://(?!localhost\b|[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+\b|\[)|www\.)[A-Za-z0-9\-._~:/?#\[\]@!$&'*+,;=%]+|"
                  r"(?<![A-Za-z0-9@.])[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.(?:com|cn|net|org|edu|gov|io|me|cc|tv|info)"
                  r"/[A-Za-z0-9\-._~/?#@!$&'*+=%]+")
_PLATE = re.compile(r"[京津沪渝冀豫云辽黑湘皖鲁新苏浙赣鄂桂甘晋蒙陕吉闽贵粤青藏川宁琼使领]\s*[A-Z][\s.-]?"
                    r"(?=[A-Z0-9]{0,5}[0-9])[A-Z0-9]{5,6}(?![A-Za-z0-9])")
# a Hong Kong or Macau identity card: A123456(7), AB123456(A)
_HK_ID = re.compile(r"(?<![A-Za-z0-9])[A-Z]{1,2}[0-9]{6,7}\s*\(\s*[0-9A]\s*\)")
_PASSPORT = re.compile(r"(?<![A-Za-z0-9])(?:[EGDSPHK][A-Z]?|[A-Z]{2})[0-9]{7,8}(?![0-9A-Za-z])")
# dates on normalised text: Chinese numerals are digits there, 十 stays
_Y = r"(?:1[89][0-9]{2}|20[0-9]{2}|[0-9]{2}(?=\s*年))"
_M = r"(?:1[0-2]|0?[1-9]|十[12]?)"
_D = r"(?:3[01]|[12][0-9]|0?[1-9]|[123]?十[1-9]?)"
_YMD = rf"{_Y}\s*年\s*{_M}\s*月\s*{_D}\s*[日号]?|(?:1[89]|20)[0-9]{{2}}\s*[-/.]\s*{_M}\s*[-/.]\s*{_D}(?![0-9])"
_MD = rf"(?<![0-9十]){_M}\s*月\s*{_D}\s*[日号]"
_YM = rf"{_Y}\s*年\s*{_M}\s*月(?!\s*[0-9十])|(?:1[89]|20)[0-9]{{2}}\s*[-/.]\s*{_M}(?![0-9.\-/])"
_COMPACT = r"(?<![0-9])(?:19[0-9]{2}|20[0-9]{2})(?:0[1-9]|1[0-2])(?:0[1-9]|[12][0-9]|3[01])(?![0-9])"
_VISIT = r"(?:入院|出院|就诊|住院|来诊|初诊|复诊|门诊|就医|转院|收治|收入|检查|体检|手术|来院|到院|随访)"
_DATES = (
    re.compile(rf"(?<![0-9])(?:{_YMD})"),
    re.compile(_MD),
    re.compile(rf"(?:出生日期|出生年月日?|出生于|出生在|生于|出生|生日|生辰)[：:\s是为在]*((?:{_Y})\s*年(?:\s*{_M}\s*月)?|{_YM})"),
    re.compile(rf"(?<![0-9])({_YM})(?=\s*[，,]?\s*(?:在|于|到|来)?[^，。；]{{0,8}}{_VISIT})"),
    re.compile(rf"(?:{_VISIT}(?:日期|时间)|日期|时间)[：:\s为是]*({_YM})"),
    re.compile(_COMPACT),
    re.compile(r"(?<![0-9])((?:1[89][0-9]{2}|20[0-9]{2}|[0-9]{2})\s*年)(?=\s*(?:出生|生人|生(?:[，,。；;\s]|$)))"),
)
# 5.12入院, 5/12在我院门诊就诊: a month and day right before a visit word, written in digits (so the numbered
# list "3.一周后复诊" and doses "2/3量，复诊时" stay)
_MD_NUM = re.compile(rf"(?<![0-9./])((?:1[0-2]|0?[1-9])[./](?:3[01]|[12][0-9]|0?[1-9]))(?![0-9./%])"
                     rf"(?=\s*(?:在|于|到)?\s*(?:我院|本院|外院|医院)?\s*{_VISIT})")
_KIN = ("父亲|母亲|爸爸|妈妈|丈夫|妻子|老公|老婆|爱人|配偶|儿子|女儿|哥哥|姐姐|弟弟|妹妹|男友|女友|外婆|外公|奶奶|爷爷|"
        "孙子|孙女|继父|继母|前夫|前妻|孩子|长子|次子|长女|次女|其[父母兄姐弟妹妻夫子女]")
# an age in digits, or in Chinese numerals as normalised (三十七 -> 3十7, 十九 -> 十9)
_AGE_NUM = r"([0-9]{1,3}|[1-9]?十[1-9]?)"
_AGES = (
    re.compile(r"(?:(?<=[男女])|(?<=[男女]性)|(?<=年龄)|(?<=今年)|(?<=现年)|(?<=时年)|(?<=年仅)|(?<=患者)|(?<=患儿)|(?<=病人))"
               r"(?:\s*[，,、:：为是]?\s*)" + _AGE_NUM + r"(?=\s*(?:周岁|岁))"),
    re.compile(r"(?<![0-9十])" + _AGE_NUM + r"(?=\s*(?:周岁|岁)\s*[，,、]?\s*[男女])"),
    re.compile(rf"(?:{_KIN})\s*[，,]?\s*(?:今年|现年)?\s*{_AGE_NUM}(?=\s*(?:周岁|岁)(?!时|前|后|起|左右开始|那年|初潮))"),
    # a name (or 某某) between: 患儿王小宝，7岁; 其父亲张德明，62岁
    re.compile(rf"(?:{_KIN}|患者|患儿|病人)\s*[{_CJK}]{{2,4}}\s*[，,]\s*(?:今年|现年)?\s*{_AGE_NUM}"
               rf"(?=\s*(?:周岁|岁)(?!时|前|后|起|左右开始|那年|初潮))"),
    re.compile(r"(?<=年龄)\s*[:：为是]?\s*([0-9]{1,3})(?![0-9])(?!\s*(?:岁时|年|个?月|天|周|次|分|%))"),
)


def _age_value(text: str) -> int:
    """An age as matched by ``_AGES`` (digits, or 3十7 / 十9 / 3十 from Chinese numerals)."""
    if "十" not in text:
        return int(text)
    tens, _, ones = text.partition("十")
    return int(tens or 1) * 10 + int(ones or 0)


def round_age(age: int) -> int:
    """The nearest ten (half up: 25 -> 30); 1-9 give 10, so no published age is 0."""
    return max(10, int(age + 5) // 10 * 10)


_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2064"
                      "\u2066-\u206f\ufeff\u180e\u061c\ufff9-\ufffb]")


def strip_controls(text: str) -> tuple[str, int]:
    """``text`` without control characters (NUL, C0/C1 but tab and newlines), bidi overrides and
    isolates, zero-width characters; and how many were removed."""
    out, n = _CONTROL.subn("", text)
    return out, n


_ADDR_UNIT = r"[0-9]+\s*(?:号楼|号院|号|栋|幢|座|单元|室|楼|层|户|弄|排)"
_ADDRESS = re.compile(r"(?<=[路街巷弄道村区园苑里庄寓厦])\s*(" + _ADDR_UNIT + r"(?:\s*-?\s*" + _ADDR_UNIT + r")*)")
# digit groups joined by up to 3 separator characters; an optional + or ( in front, an X at the end
_RUN = re.compile(r"(?<![0-9])(?:\+|\()?[0-9](?:" + _SEP + r"{0,3}[0-9])*(?:[Xx](?![A-Za-z]))?")
_GROUP = re.compile(r"[0-9]+")
_SPELLED = re.compile(r"(?<![0-9])[0-9](?:" + _SEP + r"{1,3}[0-9](?![0-9])){6,}")


@dataclass(frozen=True, slots=True)
class Hit:
    start: int
    end: int
    kind: str
    repl: str | None = None  # the replacement when it is not the kind's token (ages, 某中学 …)


def _plausible_date(y: str, m: str, d: str) -> bool:
    return 1 <= int(m) <= 12 and 1 <= int(d) <= 31 and (len(y) == 2 or y[:2] in ("18", "19", "20"))


def classify_digits(digits: str, plus: bool = False, x: bool = False) -> str | None:
    """The kind of one number (digits only; ``plus``: written with +; ``x``: ends with X)."""
    if x:
        return "id_card" if len(digits) == 17 else ("bank_card" if len(digits) >= 12 else None)
    rest = digits
    if digits.startswith("0086"):
        rest = digits[4:]
    elif digits.startswith("86") and (plus or (len(digits) == 13 and digits[2] == "1")):
        rest = digits[2:]
    if len(rest) == 11 and rest[0] == "1" and rest[1] in "3456789":
        return "mobile"
    if rest[:1] == "0" and 10 <= len(rest) <= 12 and rest[1:2] != "0":
        return "landline"
    n = len(digits)
    if n == 18 and _plausible_date(digits[6:10], digits[10:12], digits[12:14]):
        return "id_card"
    if n == 15 and _plausible_date(digits[6:8], digits[8:10], digits[10:12]):
        return "id_card"
    if n >= 12:  # 12: a mobile number glued to one more digit must not slip through
        return "bank_card"
    return None


_DECIMAL = re.compile(r"([0-9]+)\.([0-9]+)")


def _decimal(m: re.Match[str]) -> Iterable[Hit] | None:
    """A run written as one decimal number (``1723456789.123456``, a timing or a score in a log
    line) is a measurement, not an identifier: None when it is not one. Its integer part alone is
    still checked (a mobile or an ID number with ``.5`` glued on is masked), and so is the whole
    when the dot splits a phone number (``138.12345678``); its fraction alone never counts."""
    d = _DECIMAL.fullmatch(m.group())
    if d is None:
        return None
    whole, frac = d.group(1), d.group(2)
    kind = classify_digits(whole)
    if kind in ("mobile", "landline", "id_card"):
        return [Hit(m.start(), m.start() + len(whole), kind)]
    if 3 <= len(whole) <= 4 and classify_digits(whole + frac) in ("mobile", "landline"):
        return [Hit(m.start(), m.end(), classify_digits(whole + frac) or "number")]
    return []


def _runs(norm: str) -> Iterable[Hit]:
    for m in _RUN.finditer(norm):
        decimal = _decimal(m)
        if decimal is not None:
            yield from decimal
            continue
        text = m.group()
        x = text[-1] in "Xx"
        groups = [(g.start() + m.start(), g.end() + m.start(), g.group()) for g in _GROUP.finditer(text)]
        lead_at = m.start() if text[0] in "+(" else -1
        if _SPELLED.search(text):  # digits spelled out one by one: the whole run, whatever it is glued to
            yield Hit(m.start(), m.end(), classify_digits("".join(g[2] for g in groups)) or "number")
            continue
        i = 0
        while i < len(groups):
            found = False
            for j in range(min(len(groups), i + 20) - 1, i - 1, -1):
                part = groups[i:j + 1]
                if len(part) > 1 and not _grouped_like_a_number(part):
                    continue
                digits = "".join(g[2] for g in part)
                ends_x = x and j == len(groups) - 1
                lead = lead_at >= 0 and part[0][0] - 1 == lead_at  # the + or ( written before the number
                kind = classify_digits(digits, plus=lead and text[0] == "+", x=ends_x)
                if kind is None and ends_x:  # the X was not part of an ID number
                    kind, ends_x = classify_digits(digits), False
                if kind is None:
                    continue
                start = part[0][0] - (1 if lead else 0)
                end = part[-1][1] + (1 if ends_x else 0)
                yield Hit(start, end, kind)
                i, found = j + 1, True
                break
            if not found:
                i += 1


def _grouped_like_a_number(part: list[tuple[int, int, str]]) -> bool:
    """Groups of 3+ digits (a leading country code 86 may have 2), or one digit each (spelled out);
    dates and ranges ("2013.10.15", "1-2") have groups of 1-2 digits among longer ones."""
    lens = [len(g[2]) for g in part]
    if all(n == 1 for n in lens):
        return True
    return all(n >= 3 for n in lens[1:]) and (lens[0] >= 3 or part[0][2] in ("86", "0086"))


def find(text: str, ner: bool = True) -> list[Hit]:
    """Every personal datum in ``text``, as non-overlapping spans in order.

    Detectors run in order (e-mail, digit runs, cued ids, house numbers); overlapping finds are
    merged into one span (masking more, never less) that keeps the kind of the first detector."""
    norm = normalise(text)
    found: list[Hit] = [Hit(m.start(), m.end(), "email") for m in _EMAIL.finditer(norm)]
    found += [Hit(m.start(), m.end(), "url") for m in _URL.finditer(norm)]
    found += _runs(norm)
    for kind, pat in _CUED:  # what is given as such; a cue inside another cue's value counts too
        pos = 0
        while (m := pat.search(norm, pos)) is not None:
            found.append(Hit(m.start(1), m.end(1), kind))
            pos = m.start() + 1
    found += [Hit(m.start(1), m.end(1), "address") for m in _ADDRESS.finditer(norm)]
    found += [Hit(m.start(1), m.end(1), "postcode") for m in _POSTCODE.finditer(norm)]
    found += [Hit(m.start(), m.end(), "plate") for m in _PLATE.finditer(norm)]
    found += [Hit(m.start(), m.end(), "id_card") for m in _HK_ID.finditer(norm)]
    found += [Hit(m.start(), m.end(), "passport") for m in _PASSPORT.finditer(norm)]
    for pat in _DATES:
        for m in pat.finditer(norm):
            g = 1 if pat.groups else 0
            found.append(Hit(m.start(g), m.end(g), "date"))
    found += [Hit(m.start(1), m.end(1), "date") for m in _MD_NUM.finditer(norm)
              if re.fullmatch(r"[0-9０-９]+[./．／][0-9０-９]+", text[m.start(1):m.end(1)])]
    for pat in _AGES:
        for m in pat.finditer(norm):
            age = _age_value(m.group(1))
            if age % 10 or age == 0 or "十" in m.group(1):
                found.append(Hit(m.start(1), m.end(1), "age", str(round_age(age))))
    if ner:
        from mdd.privacy import ner as _ner

        found += [Hit(sp.start, sp.end, sp.kind, sp.repl) for sp in _ner.find(text)]
    rank = {id(h): i for i, h in enumerate(found)}
    merged: list[Hit] = []
    first: list[int] = []
    for h in sorted(found, key=lambda h: (h.start, -h.end)):
        if merged and h.start < merged[-1].end:
            last = merged[-1]
            keep = last if first[-1] <= rank[id(h)] else h
            if h.kind in _VAGUE and last.kind in _VAGUE:  # a place inside an organisation's name: the longer wins
                keep = h if h.end - h.start > last.end - last.start else last
            merged[-1] = Hit(last.start, max(last.end, h.end), keep.kind, keep.repl)
            first[-1] = min(first[-1], rank[id(h)])
        elif h.start < h.end:
            merged.append(h)
            first.append(rank[id(h)])
    return merged


_VAGUE = ("name", "place", "org", "address")


def scrub(text: str) -> tuple[str, list[str]]:
    """``text`` with every personal datum replaced by its kind's token, and the kinds found."""
    hits = find(text)
    if not hits:
        return text, []
    parts, last = [], 0
    for h in hits:
        parts.append(text[last:h.start])
        parts.append(h.repl if h.repl is not None else KINDS[h.kind])
        last = h.end
    parts.append(text[last:])
    return "".join(parts), [h.kind for h in hits]


def mask(text: str) -> str:
    """``scrub`` without the kinds: for messages, paths and errors on their way to a log or a table."""
    return scrub(text)[0] if text else text


def mask_obj(value: Any) -> Any:
    """``mask`` over every string in a JSON-like value (dict keys too)."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, dict):
        return {mask_obj(k): mask_obj(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_obj(v) for v in value]
    return value


def describe_value(value: Any) -> str:
    """The kind of a value, for a reject reason or a log line: never the value itself."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        kinds = scrub(str(value))[1]
        return f"a number that looks like a {'/'.join(sorted(set(kinds)))} (masked)" if kinds else "a number"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, str):
        kinds = scrub(value)[1]
        what = f"text of {len(value)} characters"
        return f"{what} holding personal data ({', '.join(sorted(set(kinds)))}; not shown)" if kinds else what
    return type(value).__name__


# --- case ids -------------------------------------------------------------------------------------

_SERIAL_WORDS = ("patient", "case", "sample", "subject", "record", "item", "test", "demo", "mdd", "pt", "pat", "id",
                 "no", "caseid", "p", "pa", "s", "c", "k", "r", "x")
_PLAIN_ID = re.compile(r"(?i)(?:[a-z]{1,3}|" + "|".join(_SERIAL_WORDS) + r")?[-_]?([0-9]{1,6})")
_YEARISH = re.compile(r"(?:19|20)[0-9]{2}")


# a synthetic case's serial (mdd.cases.plan.id_tag): "syn", four letters without a vowel (no pinyin syllable,
# so no name), a dash, six digits
_SYNTHETIC_ID = re.compile(r"syn[bcdfghjklpqrstvwxz]{4}-[0-9]{6}")


def looks_personal_id(case_id: str) -> bool:
    """True unless the id is plainly a serial: at most 3 ASCII letters or a serial word (patient,
    case, sample, subject, record …), an optional - or _, and at most 6 digits ("S01", "1", "pa20",
    "patient_12", "case-000123"). Names in any script (zhangwei1987, 张三), digits that could be a
    birth year (S1987) or date (case-870512), numbers of 7+ digits and anything the pattern set
    finds are personal."""
    if _SYNTHETIC_ID.fullmatch(case_id):
        return False
    m = _PLAIN_ID.fullmatch(case_id)
    if not m:
        return True
    digits = m.group(1)
    if _YEARISH.fullmatch(digits) or (len(digits) == 6 and not digits.startswith("00")
                                          and _plausible_date("19", digits[2:4], digits[4:6])):
        return True
    return bool(find(case_id, ner=False))


_FILE_WORDS = {"case", "cases", "sample", "samples", "data", "input", "inputs", "test", "tests", "mdd", "batch",
               "part", "shard", "train", "dev", "val", "valid", "eval", "records", "record", "patients", "patient",
               "all", "demo", "example", "examples", "hostile", "bad", "good", "new", "old", "final", "clean", "raw",
               "mdd5k", "subset", "split", "file", "files", "chunk"}


def plain_file_name(name: str) -> bool:
    """A file name made only of plain words (cases, sample, part …) and short serials."""
    stem = name.rsplit(".", 1)[0] if "." in name else name
    words = [w for w in re.split(r"[-_.\s]+", stem.lower()) if w]
    serial = re.compile(r"[a-z]?[0-9]{0,3}|[a-z]{0,3}[0-9]{1,3}")
    return bool(words) and all(w in _FILE_WORDS or serial.fullmatch(w) is not None
                               for w in words) and not find(name, ner=False)


class Deidentifier:
    """The pattern set plus the keyed id hash of one output."""

    def __init__(self, key: bytes, case_ids: str = "auto") -> None:
        if case_ids not in ("auto", "always"):
            raise ValueError(f"privacy.case_ids must be auto or always, got {case_ids!r}")
        self._key = key
        self.case_ids = case_ids
        self.controls_removed = 0  # control, bidi and zero-width characters removed so far

    @property
    def key_id(self) -> str:
        """Names the key without revealing it (part of the provenance fingerprint)."""
        return hmac.new(self._key, b"mdd key id", hashlib.sha256).hexdigest()[:12]

    def hash_id(self, raw: str) -> str:
        norm = unicodedata.normalize("NFKC", raw).strip()
        return SAFE_ID_PREFIX + hmac.new(self._key, norm.encode("utf-8"), hashlib.sha256).hexdigest()[:16]

    def case_id(self, raw: str) -> tuple[str, bool]:
        """(safe id, whether it was hashed)."""
        if self.case_ids == "always" or looks_personal_id(raw):
            return self.hash_id(raw), True
        return raw, False

    def source(self, path: Any, root: Any = None) -> str:
        """An input file as outputs name it: its base name when that is plainly not personal
        (sample_cases.json, part-01.jsonl), else ``input-`` + a keyed hash and the suffix. Folders
        are never named (a folder may carry a person's name), except below ``root`` (the cases
        folder a file was found in): each subfolder there is its plain name or ``dir-`` + a keyed
        hash, so two files of one name in two subfolders keep distinct labels."""
        name = os.path.basename(str(path).rstrip("/\\")) or "input"
        if plain_file_name(name):
            label = name
        else:
            suffix = os.path.splitext(name)[1].lower()
            suffix = suffix if suffix in (".json", ".jsonl", ".parquet") else ""
            label = "input-" + hmac.new(self._key, str(path).encode("utf-8"), hashlib.sha256).hexdigest()[:10] + suffix
        if root is None:
            return label
        rel = os.path.relpath(os.path.dirname(str(path)), str(root))
        if rel in (".", ""):
            return label
        parts, walked = [], str(root)
        for part in rel.replace("\\", "/").split("/"):
            walked = os.path.join(walked, part)
            parts.append(part if plain_file_name(part) else
                         "dir-" + hmac.new(self._key, walked.encode("utf-8"), hashlib.sha256).hexdigest()[:8])
        return "/".join(parts + [label])

    def text(self, value: str, fieldname: str, masked: list[str]) -> str:
        """``value`` scrubbed; appends ``field:kind`` for each kind found."""
        value, removed = strip_controls(value)
        if removed:
            masked.append(f"{fieldname}:control")
            self.controls_removed += removed
        out, kinds = scrub(value)
        masked.extend(f"{fieldname}:{k}" for k in dict.fromkeys(kinds))
        return out


def _key_from_env(env_name: str) -> bytes | None:
    v = os.environ.get(env_name, "")
    return v.encode("utf-8") if v.strip() else None


def output_key(out: Any, env_name: str = "MDD_PRIVACY_KEY") -> tuple[bytes, str]:
    """The id-hash key for an output (a ``mdd.storage.Store`` or a path) and where it came from
    ("env" or the output's key file)."""
    from mdd.storage import open_store

    key = _key_from_env(env_name)
    if key is not None:
        return key, "env"
    store = open_store(out)
    if not store.exists(KEY_FILE):
        new = secrets.token_hex(32)
        local = store.local_path(KEY_FILE)
        if local is not None:  # readable by its owner only, from the first byte
            os.makedirs(os.path.dirname(local), exist_ok=True)
            try:
                fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # another run made it first: use that one
                fd = None
            if fd is not None:
                with os.fdopen(fd, "w") as f:
                    f.write(new)
        else:
            store.write_text(KEY_FILE, new)
        log.warning("privacy: %s is not set; case ids are hashed with this output's own key in %s "
                    "(keep it out of published copies)", env_name, store.display(KEY_FILE))
    return store.read_text(KEY_FILE).strip().encode("utf-8"), "file"


def for_output(cfg: Any, out: Any) -> Deidentifier:
    """The de-identifier of a run into ``out`` (``cfg``: the config's ``privacy`` section)."""
    key, _ = output_key(out, cfg.key_env)
    return Deidentifier(key, cfg.case_ids)


_PROCESS_KEY = secrets.token_bytes(32)


def default() -> Deidentifier:
    """Without an output: the environment's key, else one random key per process (ids that look
    personal are then stable within the process only; the driver always uses ``for_output``)."""
    return Deidentifier(_key_from_env("MDD_PRIVACY_KEY") or _PROCESS_KEY)


# a timing in a log line: the value of an ASCII key named as one ('start_s': 123, elapsed_ms=5, 't0': ...)
_TIMING = re.compile(r"(?i)(?<![A-Za-z0-9_])['\"]?[A-Za-z_]*(?:_s|_ms|_us|_ns|_sec|_secs|seconds|time|_ts|_at|"
                     r"elapsed|duration|started|finished|t0|t1)['\"]?\s*[:=]\s*(-?[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?)"
                     r"(?![0-9A-Za-z])")


def mask_log(text: str) -> str:
    """``mask`` for a log line: a timing (the value of a key such as ``'start_s'`` or
    ``elapsed_ms=``) is a measurement and stays as it is; decimals stay anywhere (``_decimal``)."""
    parts, last = [], 0
    for m in _TIMING.finditer(text):
        parts.append(mask(text[last:m.start(1)]))
        parts.append(m.group(1))
        last = m.end(1)
    parts.append(mask(text[last:]))
    return "".join(parts)


class MaskingFilter(logging.Filter):
    """Masks personal data in every log record that passes through (a last line of defence:
    messages are written not to echo input in the first place). Timings and decimal numbers are
    not identifiers and are left alone (``mask_log``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record: let logging report it as usual
            return True
        masked = mask_log(msg)
        if masked != msg:
            record.msg, record.args = masked, None
        return True


def install_log_filter(logger: logging.Logger | None = None) -> None:
    """Put a :class:`MaskingFilter` on every handler of ``logger`` (root by default)."""
    lg = logger or logging.getLogger()
    for h in lg.handlers:
        if not any(isinstance(f, MaskingFilter) for f in h.filters):
            h.addFilter(MaskingFilter())
