"""Languages other than English: Chinese write-back triggers. The CJK-aware token estimate and
language detection live in the leaf :mod:`loopstack.text`, shared with the agent;
``estimate_tokens`` and ``has_cjk`` are re-exported here for memory's own modules.

The promotion gate (``loopstack.memory.writeback``) asks these detectors beside its English ones:

* remember: "记住，我对花生过敏。", "别忘了...", "不要忘记...", "请记下：...", "记一下..."
  ("别忘了" is a request to *remember*, never to forget);
* correction: "其实...", "不对，是...", "更正：...", "我说错了，...";
* forget, only as an imperative at the start of a sentence: "忘掉/忘记...", "不要记/别记(得)...",
  "不要保存...", "删除关于...的记忆", "把...从记忆里删掉", "删除你记得的关于...的一切/的事",
  "把我以前的地址忘了". Never "我忘记带钥匙了" (I forgot), "忘了吧" (forget it), "删除文件
  report.txt", "你把我的生日忘了" (you forgot). A subject phrased as a question names what
  it asks about ("我的钥匙在哪里" -> "钥匙"); a former thing ("以前的地址", "前公司", "my
  previous address") forgets only records that say it was a former one (``about_former``).
"""

from __future__ import annotations

import re

from loopstack.text import char_pairs, estimate_tokens, has_cjk

__all__ = [
    "about_former",
    "covers",
    "estimate_tokens",
    "has_cjk",
    "zh_correction",
    "zh_explicit_request",
    "zh_forget_request",
    "zh_self_statements",
]

# --- Chinese write-back triggers ------------------------------------------------------------

_PUNCT = "，,。.！!？?：:；;、 \t\"'“”‘’「」"
# What may open a sentence before the request itself: "好的，", "对了，", "请", "麻烦你", "你要"
_ZH_LEAD = (
    r"^(?:(?:好的?|嗯|哦|对了|另外|还有|那么?|所以|顺便说一下|顺便|然后|现在|以后)[，,、\s]*)*"
    r"(?:(?:请你?|麻烦你?|劳驾|帮我|替我|你(?:要|得|必须|可以|能|就)?|可以|能不能|能否|"
    r"可不可以|我想让你|我希望你|我要你|我需要你)\s*)*"
)
_ZH_EXPLICIT = re.compile(
    _ZH_LEAD + r"(?:一定要|务必)?"
    r"(?:记住|记着|记好|记牢|牢记|记下来?|记录下来?|记一下|别忘了|别忘记|不要忘了|不要忘记|千万别忘了)"
    r"(?:一下)?(?:这件事|这一点|这个)?[：:，,、。\s-]*(?P<body>.+)",
    re.S,
)
_ZH_CORRECTION = re.compile(
    r"^\s*(?:其实|实际上|说错了|我说错了|更正(?:一下)?|纠正(?:一下)?|订正一下|我记错了|"
    r"(?:不对|不是的?|错了)(?=[，,：:；;。！!\s]))[，,：:；;。！!\s]*(?:应该是|其实是|是)?[，,：:\s]*"
    r"(?P<body>.+)",
    re.S,
)
_ZH_FORGET = [  # the most specific first
    # 删除/忘掉你记得的关于 X 的一切
    re.compile(
        _ZH_LEAD + r"(?:删除|删掉|删了|清除|忘掉|忘记|忘了)你(?:记得|知道|记住|保存|存储)的"
        r"(?:关于|有关)?(?P<body>.+?)(?:的)?(?:一切|所有的?(?:信息|内容|事情?|东西)?|"
        r"全部(?:信息|内容)?|内容|事情?|信息|东西)?[。！!.\s]*$",
        re.S,
    ),
    # 把 X 忘了/忘掉/删掉(吧), X about the user: "把我以前的地址忘了". Not "你把我的生日忘了"
    # (a complaint: you forgot my birthday), "我把钥匙忘了" (I forgot my keys) or
    # "把伞忘在车上了" (left it in the car).
    re.compile(
        r"^(?:(?:好的?|嗯|对了|另外|还有|那么?|现在|以后)[，,、\s]*)*"
        r"(?:(?:请你?|麻烦你?|劳驾|帮我|你(?:要|得|可以|能|就)|可以|能不能)\s*)*"
        r"把(?P<body>(?:关于|有关)?(?:我|你(?:知道|记得|记住)的).+?)(?:给)?"
        r"(?:忘掉|忘了|忘记|删掉|删了|删除|清除)(?:掉|了)?(?:吧)?[。！!.\s]*$",
        re.S,
    ),
    # 把 X 从(你的)记忆里删除
    re.compile(
        _ZH_LEAD + r"把(?P<body>.+?)从(?:你的)?(?:记忆|记录|备忘)(?:中|里|里面)?"
        r"(?:删除|删掉|删去|清除|抹掉|去掉)",
        re.S,
    ),
    # 删除关于 X 的记忆 / 删掉 X 的记录
    re.compile(
        _ZH_LEAD + r"(?:删除|删掉|删去|清除|抹掉|去掉)(?:掉)?(?:所有|全部|一切)?(?:关于|有关)?"
        r"(?P<body>.+?)的(?:所有|全部)?(?:记忆|记录|备忘)",
        re.S,
    ),
    # 不要记/别记住/不要保存/别存 + an object about the user (not "不要保存文件")
    re.compile(
        _ZH_LEAD + r"(?:不要|别|不用|不必|无需|停止)(?:再)?"
        r"(?:记住|记着|记得|记录|记下|记|保存|存储|存|保留)(?:下来)?"
        r"(?=我|关于|有关|任何|这|那|他|她|它们)(?:关于|有关)?(?P<body>.+)",
        re.S,
    ),
    # 忘掉/忘记 X - but not "忘了吧" / "忘记了" / "忘了它" (forget it, I forgot)
    re.compile(
        _ZH_LEAD + r"(?:忘掉|忘记|忘了)(?!了|吧|它|这个[。！!]?$|这件事[。！!]?$)"
        r"(?:关于|有关)?(?P<body>.+)",
        re.S,
    ),
]
_ZH_SELF = re.compile(
    r"^(?:我(?:住在|在.{1,12}(?:工作|上班|上学|读书)|是|叫|喜欢|更喜欢|爱|讨厌|不喜欢|偏好|有|用|"
    r"养了|来自|出生在|搬到)|我的.{1,8}(?:是|叫|在|有)|我们(?:用|喜欢|总是|从不))"
)
_ZH_SENTENCE = re.compile(r"(?<=[。！？!?；;])\s*|\n+")
_ZH_NOT_TARGET = {"它", "这个", "那个", "这些", "一切", "所有", "全部", "我"}


def _zh_clean(body: str) -> str:
    return body.strip().strip(_PUNCT).strip()


def _zh_sentences(message: str) -> list[str]:
    return [s.strip() for s in _ZH_SENTENCE.split(message.strip()) if s and s.strip()]


def zh_explicit_request(message: str) -> str | None:
    """What a Chinese "记住/别忘了/请记下 ..." asks to keep, or None."""
    if not has_cjk(message):
        return None
    for sentence in _zh_sentences(message):
        m = _ZH_EXPLICIT.match(sentence)
        if m:
            rest = message[message.find(sentence) + m.start("body") :]
            body = _zh_clean(rest)
            return body or None
    return None


def zh_correction(message: str) -> str | None:
    """The corrected statement of "其实.../不对，是.../更正：...", or None (at least four
    characters, as the English detector wants two words)."""
    if not has_cjk(message):
        return None
    m = _ZH_CORRECTION.match(message)
    if m is None:
        return None
    body = _zh_clean(m.group("body"))
    return body if len(body) >= 4 and has_cjk(body) else None


def zh_forget_request(message: str) -> str | None:
    """What a Chinese forget request names, or None."""
    if not has_cjk(message):
        return None
    for sentence in _zh_sentences(message):
        if sentence.rstrip().endswith(("？", "?", "吗", "呢")):
            continue  # a question ("忘记密码怎么办？") asks nothing to be forgotten
        for pattern in _ZH_FORGET:
            m = pattern.match(sentence)
            if m is None:
                continue
            body = re.sub(r"^(?:关于|有关|我的|那个|这个)", "", _zh_clean(m.group("body")))
            body = re.sub(r"(?:的事|这件事|的事情|的信息)$", "", _zh_clean(body))
            body = _zh_question_subject(_zh_clean(body))
            if body and body not in _ZH_NOT_TARGET and len(body) >= 2:
                return body
    return None


# A subject phrased as a question: "我的钥匙在哪里", "我把车停在哪儿了", "我几点下班".
_ZH_WH = re.compile(
    r"(?P<link>在|是|叫|到)?(?P<wh>为什么|什么地方|什么时候|什么|哪里|哪儿|哪个|哪家|哪天|哪年|哪|"
    r"几点钟?|几月几[日号]|几号|几岁|多少钱?|多大|谁|怎么样|如何)"
)
_ZH_SUBJECT_LEAD = re.compile(r"^(?:关于|有关)?(?:我们的|我的|我把|我|把)?")


def _zh_question_subject(body: str) -> str:
    """What a question-shaped subject is about: the question word (and the 在/是 before it)
    left out - "钥匙在哪里" -> "钥匙", "我把车停在哪儿了" -> "车停", "我几点下班" -> "下班",
    "我住在哪里" -> "住在" (never shorter than two characters)."""
    m = _ZH_WH.search(body)
    if m is None:
        return body
    tail = re.sub(r"^[了呢吧啊的]+", "", body[m.end() :])
    for start in (m.start(), m.start("wh")):
        subject = _ZH_SUBJECT_LEAD.sub("", body[:start] + tail)
        subject = _zh_clean(re.sub(r"[了呢吧啊]+$", "", subject))
        if len(subject) >= 2:
            return subject
    return body


def zh_self_statements(message: str) -> list[str]:
    """Chinese sentences where the user states something about themselves."""
    if not has_cjk(message):
        return []
    out = []
    for sentence in _zh_sentences(message):
        s = re.sub(r"^(?:嗯|对了|另外|还有|顺便说一下|你好|嗨)[，,！!\s]*", "", sentence)
        if _ZH_SELF.match(s) and len(s) >= 5 and not s.rstrip().endswith(("？", "?", "吗")):
            out.append(_zh_clean(s))
    return out


_TARGET_SKIP = re.compile(r"^(?:我的|我们的|我|关于|有关)|(?:的事情?|这件事|的信息|的一切)$")
# "my former employer", "我以前的地址", "前公司": a target about what *was*.
_ZH_FORMER = re.compile(
    r"^(?:以前|之前|从前|原来|原先|过去|曾经|早先)的?(?P<noun>.{2,})$"
    r"|^前(?P<noun2>(?:公司|东家|单位|老板|雇主|上司|领导|同事|室友|房东|地址|住址|工作|"
    r"男友|女友|男朋友|女朋友|夫|妻|任).*)$"
)
_ZH_FORMER_IN_TEXT = r"以前|之前|从前|原来|原先|过去|曾经|早先|前任"
_EN_FORMER = re.compile(r"(?i)\b(?:former|previous|prior|old|ex|earlier|past)\b")
_EN_FORMER_IN_TEXT = re.compile(
    r"(?i)\b(?:former(?:ly)?|previous(?:ly)?|prior|old|ex|earlier|past|used to|before|until)\b"
)


def _zh_former(target: str) -> str | None:
    """The noun of a Chinese target about a former thing ("以前的地址" -> "地址"), or None."""
    m = _ZH_FORMER.match(_TARGET_SKIP.sub("", target.strip()))
    return None if m is None else (m.group("noun") or m.group("noun2"))


def about_former(text: str, target: str) -> bool:
    """False when ``target`` names a former thing ("my previous address", "我以前的地址",
    "前公司") and ``text`` does not say it is a former one ("My address is 3 Oak Road",
    "我现在的公司是腾讯"): a forget request for the old one must leave the current one.
    True for every other target."""
    noun = _zh_former(target)
    if noun is not None:
        return re.search(rf"{_ZH_FORMER_IN_TEXT}|前(?={re.escape(noun[0])})", text) is not None
    if _EN_FORMER.search(target) and not has_cjk(target):
        return _EN_FORMER_IN_TEXT.search(text) is not None
    return True


def covers(text: str, target: str) -> bool:
    """Whether ``text`` says what a Chinese forget target names: every character pair of the
    target's CJK runs and every Latin word or number of it occurs in ``text`` ("卡号" in
    "我的卡号末尾是4242"). Chinese has no spaces, so the keyword index (one token per CJK
    run) cannot find it; False for a target without CJK (the English path is unchanged)."""
    target = _TARGET_SKIP.sub("", target.strip())
    if not has_cjk(target):
        return False
    noun = _zh_former(target)
    if noun is not None:  # "以前的地址" covers "我之前住的地址是..." and "我的前公司是..."
        return all(p in text for p in char_pairs(noun)) and about_former(text, target)
    pairs = char_pairs(target)
    words = re.findall(r"[A-Za-z0-9]+", target.lower())
    low = text.lower()
    return all(p in text for p in pairs) and all(w in low for w in words)
