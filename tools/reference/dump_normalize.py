"""Record the reference's opt-in text normalisation as table cases for tests/test_normalize.py.

    $OMNICORE_REF_VENV/bin/python tools/reference/dump_normalize.py [out_dir]

Writes ``normalize_cases.json`` (default out_dir: tests/fixtures/reference):

    cases     {text, language, output}: ``omnivoice.utils.text.normalize_text(text, language)``
              for Chinese, English, other languages (num2words), bracketed tags and CMU
              pronunciations, pinyin tone markers, mixed scripts, edge cases, and strings drawn
              from templates with a fixed seed
    pipeline  where ``generate(normalize_text=True)`` applies it: ``omnivoice.OmniVoice._preprocess_all``
              (and ``_generate_chunked`` for long text) bound to a stand-in that records each
              pass instead of running the model (as dump_text.py does): the spoken text, the
              instruct as resolved against it, the untouched ref_text, the frame estimate and
              the chunks
    versions  WeTextProcessing / pynini / num2words that produced the outputs

Needs the reference's `tn` extra in the reference venv (WeTextProcessing, pynini, num2words;
pinned in requirements.txt). No weights are needed (``ckpt_dir`` is unused).
"""

from __future__ import annotations

import random
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from dump_text import main, write_cases  # noqa: E402  (the text fixtures' writer and command line)
SEED = 20260515

EN = [
    "I have 3 cats and 12 dogs.",
    "The year 1999 was long.",
    "It costs $45.50 today.",
    "It costs $1,234,567.89 in total.",
    "Only €20 or £15.",
    "We met on Jan. 5, 2024.",
    "Call me at 3:30pm tomorrow.",
    "The meeting is at 10:05 a.m.",
    "About 42% of people agree.",
    "He came 1st, she came 22nd.",
    "Temperature: -5 degrees.",
    "Add 3.14159 to 2.5.",
    "Mix 1/2 cup with 3/4 cup.",
    "Route 66 is 2448 miles long.",
    "Born on 12/25/1990.",
    "Dated 2024-03-15 in the log.",
    "Call 555-123-4567 now.",
    "It weighs 5kg and is 10 cm wide.",
    "Visit www.example.com today.",
    "Email me at bob@example.com please.",
    "Pages 10-20 are missing.",
    "Dr. Smith lives at 221B Baker St.",
    "The 1990s were great.",
    "Chapter IV begins here.",
    "He scored 100 points in 2 games.",
    "Version 2.0.1 is out.",
    "Flight BA123 leaves at 7.",
    "0 is a number, 007 too.",
    "The ratio was 3:1 overall.",
    "Speed limit 65 mph.",
    "One million is 1000000.",
    "It is 12345678901234 big.",
    "I owe you $5.",
    "Room #42, floor 3.",
    "Mr. and Mrs. Chen arrived at 7 p.m. with two bottles of wine.",
    "Twenty-three students signed up in 2024: only nine finished.",
    "No digits here at all.",
    "Wait... what did you just say?",
    "UPPERCASE TEXT WITH 5 ITEMS.",
    "Tabs\tand\nnewlines 7 here.",
    "  leading and trailing spaces 8  ",
    "100",
    "$",
    "3.",
    "The [B EY1 S] guitar costs 12 dollars.",
    "[laughter] That was 5 times funnier. [sigh]",
    "Say [T AH0 M EY1 T OW2] twice, 2 times.",
    "[laughter][sigh] 4 in a row",
    "Brackets [like this 42] stay, but 42 goes.",
    "Unclosed [bracket 3 here.",
    "Nested [a [b 1] c] 2 end.",
    "Closing ] first 5 [then 6]",
    "[]empty tag 9",
    "NI3 HAO3 is pinyin, 3 is not.",
    "Ends with a tag 10 [breath]",
]

ZH = [
    "我有123个苹果。",
    "今天是2024年3月5日。",
    "现在是下午3点30分。",
    "价格是￥45.5元。",
    "一共花了1,234元。",
    "增长了42%。",
    "他跑了100米，用了9.58秒。",
    "电话号码是13800138000。",
    "比分是3:2。",
    "温度是-5度。",
    "三分之一写作1/3。",
    "第1名和第22名。",
    "这是2.5公斤的大米。",
    "房间号是302。",
    "1998年出生，今年26岁。",
    "那儿有个小孩儿。",
    "啊，这是真的吗？嗯，好吧。",
    "繁體字也有123個。",
    "全角数字１２３和ＡＢＣ。",
    "他说：“明天早上8点在车站见面。”",
    "《红楼梦》有120回。",
    "会议推迟到下周3；请大家互相转告。",
    "你好NI3 HAO3，我有3个苹果。",
    "这个字读ZHONG1，不读ZHONG4。",
    "拼音lowercase ni3 不受保护，数字5会变。",
    "[laughter]哈哈，太好笑了，笑了10分钟。",
    "[B EY1 S]这个词有3个音。",
    "我们买了2个苹果、3根香蕉和1个西瓜。",
    "2024-03-15是星期五。",
    "公元前221年秦统一六国。",
    "他的身高是1.85米。",
    "中英混合：I have 5 apples，我有5个苹果。",
    "没有数字的句子。",
    "  前后有空格 7  ",
    "0.5的概率。",
    "共计100000000元。",
    "这是第3版，共12章。",
    "AB12型号的产品。",
    "电压220V，电流10A。",
]

OTHER = [
    ("Ich habe 123 Äpfel und 45 Birnen.", "de"),
    ("Il a 21 ans et 1000 livres.", "fr"),
    ("Tengo 15 años y 2 hermanos.", "es"),
    ("Ho 33 anni.", "it"),
    ("Eu tenho 40 livros.", "pt"),
    ("У меня 5 книг и 101 ручка.", "ru"),
    ("私は3匹の猫を飼っています。", "ja"),
    ("저는 25살입니다.", "ko"),
    ("لدي 123 كتابا.", "ar"),
    ("मेरे पास 7 किताबें हैं।", "hi"),
    ("Benim 12 kedim var.", "tr"),
    ("Mam 2 psy i 3 koty.", "pl"),
    ("Ik heb 8 fietsen.", "nl"),
    ("Tôi có 9 quyển sách.", "vi"),
    ("Saya punya 4 buku.", "id"),
    ("Jeg har 6 bøker.", "no"),
    ("Jag har 11 böcker.", "sv"),
    ("Minulla on 14 kirjaa.", "fi"),
    ("Έχω 3 βιβλία.", "el"),
    ("יש לי 5 ספרים.", "he"),
    ("Mám 13 knih.", "cs"),
    ("Я маю 22 книги.", "uk"),
    ("ฉันมี 3 เล่ม", "th"),
    ("我有3本书。", "yue"),
    ("Nina vitabu 7.", "sw"),
    ("I have 3 books.", "German"),
    ("Ich habe 3 Bücher.", "GERMAN"),
    ("Ich habe 3 Bücher.", " de "),
    ("Ich habe 3 Bücher.", "DE"),
    ("12 of them", "Klingon"),
    ("12 of them", "xx"),
    ("12 of them", "none"),
    ("12 of them", "None"),
    ("12 of them", ""),
    ("12 个", "   "),
    ("Zahl 3.5 und 1,000 und -7.", "de"),
    ("Eine sehr große Zahl 123456789012345678901234567890.", "de"),
    ("Arabisch-indische Ziffern ١٢٣ und ٤٥.", "de"),
    ("Vollbreite １２ Ziffern.", "fr"),
    ("[laughter] Er hat 3 [B EY1 S] Gitarren.", "de"),
    ("NI3 ist hier kein Pinyin-Schutz, 3 wird Wort.", "de"),
    ("Texte sans chiffres.", "fr"),
    ("007 agent", "en-US"),
    ("007 agent", "fr_FR"),
    ("Digits 10 in Cantonese 我有10本書", "Cantonese"),
]

EDGE = [("", None), ("   ", None), ("\n\t", "en"), ("", "zh"), ("[laughter]", "en"),
        ("[laughter]", "zh"), ("NI3", "zh"), ("NI3HAO3", None), ("A1B2C3", "zh"), ("A1B2C3", "en"),
        ("x", None), ("1", None), ("一", None), ("12 个苹果", None), ("12 apples", None),
        ("Mixed 中文 and 12 English", None), ("[B EY1 S]", None), (" [laughter] ", None),
        ("2 [laughter] 3", None), ("[1] [2] [3]", "en"), ("[[3]]", "en"), ("]3[", "en")]

WORDS_EN = ["apples", "dollars", "people", "miles", "times", "pages", "days", "books"]
WORDS_ZH = ["个苹果", "元", "个人", "公里", "次", "页", "天", "本书"]
TAGS = ["[laughter]", "[sigh]", "[B EY1 S]", "[breath]", "[T AH0 M EY1 T OW2]"]
PINYIN = ["NI3", "HAO3", "ZHONG1", "WEN2", "LV4"]


def _number(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return str(rng.randrange(0, 100))
    if kind == 1:
        return str(rng.randrange(100, 100000))
    if kind == 2:
        return f"{rng.randrange(0, 1000)}.{rng.randrange(0, 100)}"
    if kind == 3:
        return f"{rng.randrange(1, 100)}%"
    if kind == 4:
        return f"{rng.randrange(1900, 2100)}"
    return f"{rng.randrange(1, 13)}:{rng.randrange(0, 60):02d}"


def drawn(rng: random.Random, n: int) -> list[tuple[str, str | None]]:
    """Template sentences mixing numbers, tags and pinyin (fixed seed)."""
    out = []
    for i in range(n):
        lang = ["en", "zh", None, "de", "fr", "es", "ru"][i % 7]
        parts = []
        for _ in range(rng.randrange(1, 4)):
            zh = lang == "zh" or (lang is None and rng.random() < 0.5)
            words = WORDS_ZH if zh else WORDS_EN
            parts.append(_number(rng) + ("" if zh else " ") + rng.choice(words))
            r = rng.random()
            if r < 0.3:
                parts.append(rng.choice(TAGS))
            elif r < 0.45 and zh:
                parts.append(rng.choice(PINYIN))
        sep = "" if lang == "zh" else " "
        text = sep.join(parts) + ("。" if lang == "zh" else ".")
        out.append((text, lang))
    return out


def _all_inputs() -> list[tuple[str, str | None]]:
    rng = random.Random(SEED)
    inputs = [(t, "en") for t in EN] + [(t, "zh") for t in ZH] + list(OTHER) + EDGE
    # The same text without a language (zh/en picked by script) and by name.
    inputs += [(t, None) for t in EN[:12]] + [(t, None) for t in ZH[:12]]
    inputs += [(t, "English") for t in EN[:4]] + [(t, "chinese") for t in ZH[:4]]
    inputs += drawn(rng, 140)
    return inputs


def pipeline_cases():
    """What generate(normalize_text=True) does to each item before the model sees it."""
    from dump_text import _prompt, _reference  # the stand-in harness of the text fixtures

    R = _reference()
    long_en = " ".join(f"Item {i} costs ${i * 3}.{i:02d} and weighs {i * 7} kg." for i in range(1, 41))
    long_zh = "".join(f"第{i}天我们走了{i * 13}公里，花了{i * 21}元。" for i in range(1, 61))
    specs = [
        # text, language, instruct, (ref_text, frames) or None, speed, duration
        ("I have 3 cats.", "en", None, None, None, None),
        ("I have 3 cats.", "English", None, None, None, None),
        ("I have 3 cats.", None, None, None, None, None),
        ("I have 3 cats.", "Klingon", None, None, None, None),  # unknown -> None -> en by script
        ("123", "zh", "female, low pitch", None, None, None),   # digits -> Chinese: instruct in Chinese
        ("123", "en", "female, low pitch", None, None, None),
        ("123", None, "male", None, None, None),
        ("我有123个苹果。", None, "female", None, None, None),
        ("Ich habe 123 Äpfel.", "de", None, None, None, None),
        ("Ich habe 123 Äpfel.", "German", None, None, 1.3, None),
        ("It costs $45.50 on Jan 5, 2024.", "en", None, ("The ref has 12 words and $3.", 60), None, None),
        ("价格是45.5元。", "zh", None, ("参考文本有3个数字。", 48), 0.8, None),
        ("[laughter] I have 3 [B EY1 S] guitars.", "en", None, None, None, 4.0),
        ("你好NI3 HAO3，我有3个苹果。", "zh", None, None, None, None),
        (long_en, "en", None, None, None, None),
        (long_zh, "zh", None, None, None, None),
        (long_en, "en", None, ("Reference text 7.", 50), None, None),
    ]
    cases = []
    for text, lang, instruct, ref, speed, duration in specs:
        glue = R.Glue()
        prompt = None if ref is None else _prompt(R, *ref)
        task = glue._preprocess_all(text=text, language=lang, instruct=instruct,
                                    voice_clone_prompt=prompt, speed=speed, duration=duration,
                                    normalize_text=True)
        cfg = R.ov.OmniVoiceGenerationConfig.from_dict({})
        short_idx, long_idx = task.get_indices(cfg, 25)
        chunks = None
        if long_idx:
            glue._generate_chunked(task.slice_task(long_idx), cfg)
            chunks = [{"text": p.texts[0], "frames": p.target_lens[0], "ref_text": p.ref_texts[0]}
                      for p in glue.passes]
        cases.append({
            "text": text, "language": lang, "instruct": instruct,
            "ref_text": None if ref is None else ref[0],
            "num_ref_frames": None if ref is None else ref[1],
            "speed": speed, "duration": duration,
            "out": {"text": task.texts[0], "language": task.langs[0],
                    "instruct": task.instructs[0], "ref_text": task.ref_texts[0],
                    "frames": task.target_lens[0], "chunks": chunks},
        })
    return cases


def build() -> dict:
    from omnivoice.utils.text import normalize_text

    cases, seen = [], set()
    for text, lang in _all_inputs():
        if (text, lang) in seen:
            continue
        seen.add((text, lang))
        cases.append({"text": text, "language": lang, "output": normalize_text(text, lang)})
    versions = {name: metadata.version(name) for name in ("WeTextProcessing", "pynini", "num2words",
                                                          "omnivoice")}
    return {
        "about": "Reference (omnivoice 0.2.1) normalize_text outputs for tests/test_normalize.py; "
                 "written by tools/reference/dump_normalize.py - do not edit by hand.",
        "versions": versions,
        "cases": cases,
        "pipeline": pipeline_cases(),
    }


def dump(ckpt_dir: Path, out_dir: Path) -> list[Path]:
    del ckpt_dir  # text only
    return write_cases(out_dir, "normalize_cases.json", build())


if __name__ == "__main__":
    main(dump)
