"""Record the reference's text front-end behaviour as table cases for tests/test_text.py.

    $OMNICORE_REF_VENV/bin/python tools/reference/dump_text.py [out_dir]

Writes ``text_cases.json`` (default out_dir: tests/fixtures/reference). Every expected value
comes from running the reference package's own code: language and instruct resolution, target
lengths and chunking go through ``omnivoice.OmniVoice._preprocess_all`` and ``omnivoice.OmniVoice._generate_chunked``
bound to a stand-in object whose ``_generate_iterative`` only records each pass (so no weights
are needed; ``ckpt_dir`` is unused). Inputs are hand-picked edge cases plus strings drawn with a
fixed seed, so the file is identical on every run.
"""

from __future__ import annotations

import json
import logging
import random
import re
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
SEED = 20260501

# ---------------------------------------------------------------------------
# Texts
# ---------------------------------------------------------------------------

EN_SENTENCES = [
    "The kettle clicked off just as the rain began to drum on the window.",
    "Dr. Okafor said the results would be ready by Mon. at the latest.",
    "Please leave the parcel with Mrs. Lindqvist at No. 12 if nobody answers.",
    "We bought apples, pears, plums, and e.g. a few figs for the tart.",
    "Is it going to snow tomorrow, or will the roads stay clear?",
    "She laughed, put down her pencil; the answer had been obvious all along!",
    "The meeting moved to St. Anne's Hall on Oak Ave. near the old mill.",
    "Prof. Hale, i.e. the new chair, approved the plan vs. the old one.",
    "It cost $5.99 on 3.14.2026, about 42% less than last year.",
    '"Are you coming?" he asked. "Only if it stops raining," she said.',
    "Mr. and Mrs. Chen arrived at 7 p.m. with two bottles of wine.",
    "Twenty-three students signed up in 2024: only nine finished the course.",
    "Wait... what did you just say?",
    "The U.S.A. and the U.K. signed the agreement in Jan. last year.",
    "Our train was delayed by forty minutes (a signal fault), so we waited.",
    "Read fig. 3 first, then the appendix, etc. before the exam.",
]

ZH_SENTENCES = [
    "今天天气很好，我们一起去公园散步吧。",
    "他说：“明天早上八点在车站见面。”",
    "这本书我已经看了三遍了，每次都有新的收获！",
    "你吃饭了吗？我刚做了一碗面条。",
    "会议推迟到下周三；请大家互相转告。",
    "小猫在窗台上睡了一下午，太阳晒得它暖洋洋的。",
    "我们买了苹果、香蕉、葡萄和西瓜。",
    "《红楼梦》是中国古典小说的巅峰之作。",
    "请问，去火车站怎么走？",
    "他笑着说（其实心里很紧张）：没关系。",
    "这个项目需要三个月才能完成，大家加油！",
    "雨下得很大，路上的行人都撑着伞匆匆走过。",
]

OTHER_TEXTS = [
    "Вчера вечером мы долго гуляли по набережной и говорили о книгах.",
    "ذهبت إلى السوق في الصباح واشتريت خبزاً طازجاً وبعض الفاكهة.",
    "مَرْحَبًا بِالْعَالَم",
    "مـــرحـــبا",
    "मैं हर सुबह चाय पीता हूँ और अख़बार पढ़ता हूँ।",
    "नमस्ते दुनिया",
    "ฉันชอบกินข้าวผัดกับไข่ดาวตอนเช้า",
    "ຂອບໃຈຫຼາຍໆ",
    "すみません、この電車は東京駅に止まりますか？",
    "カタカナとひらがな",
    "오늘 저녁에 친구들과 함께 식당에서 밥을 먹기로 했어요.",
    "Η θάλασσα ήταν ήρεμη και το νερό πολύ καθαρό σήμερα.",
    "Ἐν ἀρχῇ ἦν ὁ λόγος",
    "שלום עולם, מה שלומך?",
    "Բարև ձեզ, ինչպե՞ս եք։",
    "გამარჯობა, როგორ ხარ?",
    "ሰላም ነው? እንዴት ነህ።",
    "ꆈꌠꁱꂷ",
    "សួស្តី​ពិភពលោក",
    "မင်္ဂလာပါ",
    "Tôi thường đọc sách trước khi đi ngủ mỗi tối.",
    "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ！",
    "Hello 🌍! This is fun 🎉",
    "👍👍👍",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000",
    "١٢٣ ٤٥٦",
    "Ⅻ ½ ²",
    "...!?;:",
    "—–-",
    "   ",
    "",
    "\t\n\r",
    "a\u0301e\u0301",
    "𠀀𠀁𪚥",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "\u200b\u200d\ufeff",
    "[laughter] Oh, that was funny! [sigh] Well.",
    "ㄅㄆㄇㄈ",
    "ᠮᠣᠩᠭᠣᠯ",
    "ᏣᎳᎩ",
]

# ---------------------------------------------------------------------------
# Reference harness
# ---------------------------------------------------------------------------


def _reference():
    import torch
    from omnivoice.models import omnivoice as ov
    from omnivoice.utils import text as ref_text
    from omnivoice.utils import voice_design
    from omnivoice.utils.duration import RuleDurationEstimator
    from omnivoice.utils.lang_map import LANG_NAME_TO_ID

    class Glue:
        """Borrows the reference's glue methods; records passes instead of running the model."""

        _preprocess_all = ov.OmniVoice._preprocess_all
        _generate_chunked = ov.OmniVoice._generate_chunked
        _estimate_target_tokens = ov.OmniVoice._estimate_target_tokens
        _ensure_list = ov.OmniVoice._ensure_list

        def __init__(self):
            self.duration_estimator = RuleDurationEstimator()
            self.audio_tokenizer = SimpleNamespace(config=SimpleNamespace(frame_rate=25))
            self.passes = []

        def _generate_iterative(self, task, gen_config):
            self.passes.append(task)
            return [torch.zeros(8, n, dtype=torch.long) for n in task.target_lens]

    return SimpleNamespace(
        torch=torch, ov=ov, text=ref_text, vd=voice_design, Glue=Glue,
        estimator=RuleDurationEstimator(), names=LANG_NAME_TO_ID,
    )


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


def _prompt(R, ref_text, frames):
    tokens = R.torch.zeros(8, frames, dtype=R.torch.long)
    return R.ov.VoiceClonePrompt(ref_audio_tokens=tokens, ref_text=ref_text, ref_rms=0.05)


# ---------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------


def language_cases(R, rng):
    names = sorted(R.names)
    ids = sorted(set(R.names.values()))
    inputs = [
        None, "en", "zh", "ja", "de", "yue", "EN", "Zh", "english", "English", "ENGLISH",
        "eNgLiSh", "Chinese", "chinese", "none", "None", "NONE", "", " ", " en", "english ",
        "eng", "en-US", "zh-CN", "zh_cn", "Mandarin", "中文", "klingon", "Englsh", "cen", "luo",
        "vai", "Vai", "Võro", "VÕRO", "ÖMIE", "Ömie", "Aja (Benin)", "fe'fe'", "FE'FE'",
        "Santiago del Estero Quichua", "santiago del estero quichua", "Ghomálá'",
    ]
    inputs += rng.sample(ids, 8)
    inputs += [n.upper() for n in rng.sample(names, 4)] + [n.title() for n in rng.sample(names, 4)]
    inputs += [n.swapcase() for n in rng.sample(names, 2)]
    handler = _Warnings()
    logging.getLogger(R.ov.__name__).addHandler(handler)
    glue = R.Glue()
    cases = []
    for lang in inputs:
        handler.records.clear()
        direct = R.ov._resolve_language(lang)
        warned = bool(handler.records)
        via_generate = glue._preprocess_all(text="Hello.", language=lang).langs[0]
        assert via_generate == direct
        cases.append({"input": lang, "output": direct, "warned": warned})
    logging.getLogger(R.ov.__name__).removeHandler(handler)
    return cases


def _parse_instruct_error(msg):
    if msg.startswith("Unsupported instruct items"):
        items = []
        for line in msg.split("\n"):
            m = re.fullmatch(r"  '(.*)' -> '(.*)' \(unsupported(?:; did you mean '(.*)'\?)?\)", line)
            if m:
                items.append([m.group(1), m.group(3)])
        assert items, msg
        return {"kind": "unknown", "unknown": items}
    if msg.startswith("Cannot mix Chinese dialect"):
        return {"kind": "dialect_with_accent"}
    if msg.startswith("Conflicting instruct items"):
        body = msg.split(": ", 1)[1].split(". Each category", 1)[0]
        groups = [[x.strip("'") for x in g.split(" vs ")] for g in body.split("; ")]
        return {"kind": "conflict", "conflicts": groups}
    raise AssertionError(msg)


def instruct_cases(R, rng):
    vd = R.vd
    en_zh = list(vd._INSTRUCT_EN_TO_ZH.items())
    accents = sorted(vd._INSTRUCT_MUTUALLY_EXCLUSIVE[-2])
    dialects = sorted(vd._INSTRUCT_MUTUALLY_EXCLUSIVE[-1])
    en_text, zh_text = "Hello there, how are you?", "你好，今天天气不错。"
    hand = [
        ("male", en_text), ("female", zh_text), ("Male, British Accent", en_text),
        ("male, british accent", zh_text), ("female, low pitch", zh_text),
        ("女，低音调", en_text), ("女, 低音调", zh_text), ("male，young adult", en_text),
        ("  male ,  elderly  ", en_text), (",male,", en_text), ("，女，", zh_text),
        ("male,,female", en_text), ("male, female", en_text), ("男，male", zh_text),
        ("male, 男", en_text), ("child, 老年", zh_text), ("whisper, 耳语", en_text),
        ("very low pitch, high pitch", en_text), ("四川话", en_text), ("男，四川话", en_text),
        ("male, 四川话", en_text), ("四川话, british accent", en_text),
        ("四川话，东北话", zh_text), ("american accent, indian accent", en_text),
        ("female, whisper, teenager, very high pitch, japanese accent", zh_text),
        ("Female, Whisper, Teenager", zh_text), ("WHISPER", en_text), ("mal", en_text),
        ("femal, britsh accent", en_text), ("robot voice", en_text), ("male; female", en_text),
        ("male female", en_text), ("young  adult", en_text), ("middle aged", en_text),
        ("四川", zh_text), ("川话", zh_text), ("男性", zh_text), ("低音", zh_text),
        ("male, low pich, 四川话", en_text), ("", en_text), ("   ", en_text), (",", en_text),
        (", ,", en_text), ("，", zh_text), ("male", ""), ("male", "中"),
        ("male", "\u4dff"), ("female", "漢字 text"), ("female, 中音调", "Mixed 中文 text"),
        (None, en_text), ("British accent", "中文"), ("male, very low pitch, elderly", zh_text),
    ]
    drawn = []
    for _ in range(24):
        parts = []
        for group in (en_zh[:2], en_zh[2:7], en_zh[7:12], en_zh[12:13]):
            if rng.random() < 0.6:
                en, zh = rng.choice(group)
                form = zh if rng.random() < 0.4 else en
                parts.append(form.upper() if rng.random() < 0.2 else form)
        r = rng.random()
        if r < 0.2:
            parts.append(rng.choice(accents))
        elif r < 0.4:
            parts.append(rng.choice(dialects))
        if rng.random() < 0.15 and parts:
            parts.append(rng.choice(parts))  # a duplicate -> clash
        rng.shuffle(parts)
        sep = rng.choice([", ", ",", "，", " , ", "， "])
        drawn.append((sep.join(parts), rng.choice([en_text, zh_text])))
    glue = R.Glue()
    cases = []
    for instruct, text in hand + drawn:
        case = {"instruct": instruct, "text": text}
        try:
            case["output"] = glue._preprocess_all(text=[text], instruct=instruct).instructs[0]
        except ValueError as e:
            case["error"] = str(e)
            case.update(_parse_instruct_error(str(e)))
        cases.append(case)
    vocab = {
        "valid_en": sorted(vd._INSTRUCT_VALID_EN),
        "valid_zh": sorted(vd._INSTRUCT_VALID_ZH),
        "exclusive_groups": [sorted(g) for g in vd._INSTRUCT_MUTUALLY_EXCLUSIVE],
    }
    return cases, vocab


def punctuation_cases(R):
    inputs = [
        "Hello", "Hello.", "Hello!", "Hello?", "  Hello  ", "", "   ", "你好", "你好。",
        "你好！", "Hello 你好", "Привет", "مرحبا", "こんにちは", "안녕하세요", "Wait…",
        "Wait...", "(aside)", "[laughter]", "{x}", '"quoted"', "'single'", "“curly”",
        "‘curly’", "end;", "end:", "end,", "清单、", "（注释）", "【标题】", "结束；", "结束：",
        "结束，", "Done\n", "tab\t", "数字123", "emoji 🎉", "ends with dash -", "\u4dff",
        "\u9fff", "mixed 中", "a\u3002", "Hello…\u2026",
    ]
    return [{"input": t, "output": R.text.add_punctuation(t)} for t in inputs]


def _random_text(rng, n):
    pools = [
        "abcdefghijklmnopqrstuvwxyz      ABCXYZ", "的一是不了人我在有他这为之大来以个中上们",
        "абвгдежзийклмнопрстуфхцчшщыэюя ", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي ",
        "कखगघचछजझटठडढणतथदधनपफबभमयरलवशसह ािीुूेैोौं्", "กขคงจฉชซฌญฎฏฐฑฒณดตถทธนบปผฝพฟภมยรลวศษสหฬอฮ",
        "0123456789", ".,;:!?。，；：！？\"'()", "🎉🌍👍😀🚀", "あいうえおかきくけこアイウエオ",
        "가나다라마바사아자차카타파하", "\u0300\u0301\u0302\u064b\u0640",
    ]
    chars = []
    for _ in range(n):
        chars.append(rng.choice(rng.choice(pools)))
    return "".join(chars)


def duration_cases(R, rng):
    texts = EN_SENTENCES[:10] + ZH_SENTENCES[:8] + OTHER_TEXTS
    texts += [_random_text(rng, rng.randint(1, 120)) for _ in range(24)]
    texts += ["x" * 300, "你" * 200, "a", "Hi."]
    refs = [(None, None), ("Nice to meet you.", 25), ("This is the reference voice.", 60),
            ("参考音频的文本。", 48), ("", 40), ("Short", 0), ("\u0301\u0301", 30)]
    speeds = [1.0, 0.8, 1.25, 2.0, 0.5, 1.1]
    glue = R.Glue()
    cases = []
    for i, text in enumerate(texts):
        ref_text, frames = refs[i % len(refs)] if i % 3 else (None, None)
        speed = speeds[(i // 2) % len(speeds)]
        got = glue._estimate_target_tokens(text, ref_text, frames, speed=speed)
        cases.append({
            "text": text, "ref_text": ref_text, "num_ref_frames": frames, "speed": speed,
            "frames": got,
        })
        if i % 4 == 0:  # the same text with the defaults as well
            cases.append({
                "text": text, "ref_text": None, "num_ref_frames": None, "speed": 1.0,
                "frames": glue._estimate_target_tokens(text, None, None),
            })
    weights = [{"text": t, "weight": R.estimator.calculate_total_weight(t)} for t in texts]
    return cases, weights


def _long_texts(rng):
    en = EN_SENTENCES[:]
    zh = ZH_SENTENCES[:]
    texts = []
    rng.shuffle(en)
    texts.append(" ".join(en * 3))
    rng.shuffle(zh)
    texts.append("".join(zh * 4))
    texts.append(" ".join(rng.choice(en + zh) for _ in range(40)))
    words = "the quick brown fox jumps over a lazy dog while rain falls softly".split()
    texts.append(" ".join(rng.choice(words) for _ in range(400)))  # no punctuation at all
    texts.append("This one sentence keeps going " + ", and ".join(
        " ".join(rng.choice(words) for _ in range(6)) for _ in range(60)) + ".")
    texts.append(" ".join(rng.choice(words) for _ in range(300)) + ".")  # one very long sentence
    texts.append("\n".join(en * 2))
    texts.append(" ".join(f"Dr. {w.title()} met Mr. {v.title()} e.g. at No. {n}." for w, v, n in
                          zip(words, reversed(words), range(40))) * 2)
    texts.append("".join(rng.choice(zh) for _ in range(30)) + "".join(
        rng.choice("的一是不了人我在有他这为之大来以个中上们") for _ in range(300)))
    texts.append("Wait... " * 120)
    texts.append("「你好」他说。" * 60 + "“Quoted,” she said. " * 30)
    texts.append(" ".join(rng.choice(en) for _ in range(12)) + " 1 2 3 4 5 6 7 8 9 0" * 20)
    texts.append("a. " * 400)
    texts.append(",,,!!! " * 100 + "Okay then.")
    texts.append(" ".join(rng.choice(OTHER_TEXTS[:12]) for _ in range(30)))
    return texts


def chunk_cases(R, rng, long_texts):
    cases = []
    for i, text in enumerate(long_texts):
        for chunk_len, min_len in [(40, None), (150, 3), (rng.randint(1, 400), rng.choice([None, 3, 10]))]:
            cases.append({
                "text": text, "chunk_len": chunk_len, "min_chunk_len": min_len,
                "chunks": R.text.chunk_text_punctuation(text, chunk_len, min_chunk_len=min_len),
            })
    extra = ["", "   ", ".", ". . .", "Dr. Who? No.", "e.g. this", "i.e.", "Mr.Smith. Hi",
             "你好。。。好的！", "“Hi.” ‘Yo.’ 》ok」", "a,b,c,d,e,f", "x" * 50,
             "A. Then a longer sentence follows.", "你。好的好的好的。", "Ok. No. Yes. Fine."]
    for text in extra:
        for chunk_len, min_len in [(0, None), (5, 3), (20, 3)]:
            cases.append({
                "text": text, "chunk_len": chunk_len, "min_chunk_len": min_len,
                "chunks": R.text.chunk_text_punctuation(text, chunk_len, min_chunk_len=min_len),
            })
    return cases


def _run_plan(R, text, prompt, speed, duration, gen_kw):
    glue = R.Glue()
    cfg = R.ov.OmniVoiceGenerationConfig.from_dict(gen_kw)
    task = glue._preprocess_all(text=text, voice_clone_prompt=prompt, speed=speed,
                                duration=duration)
    short_idx, long_idx = task.get_indices(cfg, 25)
    item = {"frames": task.target_lens[0], "speed": task.speed[0] if task.speed else 1.0}
    if short_idx:
        item["chunked"] = False
        ref_frames = None if prompt is None else int(prompt.ref_audio_tokens.shape[-1])
        item["chunks"] = [{"text": text, "frames": task.target_lens[0],
                           "ref_text": task.ref_texts[0], "ref_frames": ref_frames}]
        return item
    glue._generate_chunked(task.slice_task(long_idx), cfg)
    item["chunked"] = True
    item["chunks"] = []
    for p in glue.passes:
        assert p.batch_size == 1
        ref = p.ref_audio_tokens[0]
        item["chunks"].append({
            "text": p.texts[0], "frames": p.target_lens[0], "ref_text": p.ref_texts[0],
            "ref_frames": None if ref is None else int(ref.shape[-1]),
        })
    return item


def plan_cases(R, rng, long_texts):
    cases = []
    modes = [
        (None, None, None, {}), (None, 1.25, None, {}), (("This is the reference voice.", 60), None, None, {}),
        (None, None, 75.0, {}), (("参考音频的文本。", 48), 0.8, None, {}),
        (None, None, None, {"audio_chunk_duration": 8.0, "audio_chunk_threshold": 12.0}),
    ]
    for i, text in enumerate(long_texts):
        for j in (i % len(modes), (i + 3) % len(modes)):
            ref, speed, duration, gen_kw = modes[j]
            prompt = None if ref is None else _prompt(R, *ref)
            cases.append({
                "text": text, "ref_text": None if ref is None else ref[0],
                "num_ref_frames": None if ref is None else ref[1], "speed": speed,
                "duration": duration, **{k: v for k, v in gen_kw.items()},
                "plan": _run_plan(R, text, prompt, speed, duration, gen_kw),
            })
    short = [("Hello.", None, None, None), ("Hello.", None, 2.0, None), ("Hello.", None, None, 0.5),
             ("Hello.", ("Ref text here.", 30), None, 3.0), ("Hello.", None, None, 40.0),
             ("A short sentence for speed.", None, 0.7, None), ("你好，世界！", None, None, 0.02),
             ("Hello.", ("Ref text here.", 30), 1.5, 2.5), ("x", ("", 30), None, None),
             ("Hello there.", None, None, 1.39), ("Hello there.", None, None, 33.39)]
    for text, ref, speed, duration in short:
        prompt = None if ref is None else _prompt(R, *ref)
        cases.append({
            "text": text, "ref_text": None if ref is None else ref[0],
            "num_ref_frames": None if ref is None else ref[1], "speed": speed,
            "duration": duration, "plan": _run_plan(R, text, prompt, speed, duration, {}),
        })
    # Batch semantics: per-item speed/duration lists with gaps give the same per-item values.
    glue = R.Glue()
    texts = ["Hello there.", "A somewhat longer sentence to estimate.", "你好。"]
    task = glue._preprocess_all(text=texts, speed=[1.5, None, 0.9], duration=[None, 4.0, None])
    batch = {"texts": texts, "speed": [1.5, None, 0.9], "duration": [None, 4.0, None],
             "frames": task.target_lens, "speeds": task.speed}
    return cases, batch


def build(rng=None):
    R = _reference()
    rng = random.Random(SEED)
    long_texts = _long_texts(rng)
    instruct, vocab = instruct_cases(R, rng)
    duration, weights = duration_cases(R, rng)
    plans, batch = plan_cases(R, rng, long_texts)
    return {
        "about": "Reference (omnivoice 0.2.1) outputs for tests/test_text.py; written by "
                 "tools/reference/dump_text.py - do not edit by hand.",
        "languages": sorted([lang_id, name] for name, lang_id in R.names.items()),
        "language": language_cases(R, rng),
        "instruct_vocabulary": vocab,
        "instruct": instruct,
        "punctuation": punctuation_cases(R),
        "weight": weights,
        "duration": duration,
        "pack_sentences": chunk_cases(R, rng, long_texts),
        "plan": plans,
        "batch": batch,
    }


def write_cases(out_dir: Path, name: str, cases: dict) -> list[Path]:
    """`cases` as out_dir/name (JSON, UTF-8 as is): the text fixtures' one file format."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    path.write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return [path]


def main(dump) -> None:
    """Command line of the weight-free dumps: [out_dir], default tests/fixtures/reference."""
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "fixtures" / "reference"
    for p in dump(ROOT / "weights" / "tiny-random", out):
        print(f"wrote {p} ({p.stat().st_size:,} bytes)")


def dump(ckpt_dir: Path, out_dir: Path) -> list[Path]:
    del ckpt_dir  # the text front-end needs no weights
    return write_cases(out_dir, "text_cases.json", build())


if __name__ == "__main__":
    main(dump)
