#!/usr/bin/env python3
"""Writes tests/golden/tokenizer_corpus.txt: the texts the tokenizer golden test compares, one per line.

Deterministic (fixed seed, no dependencies): re-running it reproduces the committed file byte for byte.
Lines never contain '\\n' (the golden test adds multi-line texts itself) but may contain '\\r', tabs, NUL and
other control characters, so read the file as UTF-8 and split on '\\n' only (not str.splitlines()).

    python3 tests/golden/make_corpus.py [--out PATH] [--lines N]
"""
import argparse
import pathlib
import random

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged that a single man in possession of a good fortune must be in want of a wife.",
    "We'll see; they've said they'd come, but I'm not sure they're right.",
    "She said, \"Don't worry about it,\" and walked away.",
    "Tokenizers split text into pieces; models only ever see the ids.",
    "In 1969, Apollo 11 landed on the Moon at 20:17 UTC on July 20.",
    "The server handled 12,345 requests/s at p99 = 48.7 ms (batch size 32).",
    "E-mail me at first.last+tag@example.co.uk or call +1 (555) 010-9999.",
    "https://github.com/ggml-org/llama.cpp/blob/master/src/llama-vocab.cpp#L1234",
    "HELLO WORLD! THIS IS SHOUTING. Hello World. hello world.",
    "CamelCaseIdentifiersAndsnake_case_names_and-kebab-case-too",
    "Mr. O'Neil's dog's bone isn't the cat's toy; the kids' toys aren't either.",
    "I'LL SAY IT'S FINE, YOU'RE RIGHT, WE'VE DONE IT, HE'D KNOW, I'M SURE.",
    "Prices: $5, $10.99, 3.50 EUR, 1e-5, 0x1F, 0b1010, 1_000_000, 3/4, 50%.",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "Well... that was unexpected!!! Wasn't it??? Yes!?!",
    "(parentheses) [brackets] {braces} <angles> 'single' \"double\" `backticks`",
    "The year 2024 had 366 days; 2023 had 365.",
    "Version 3.10.12 fixed bug #4521 reported on 2023-11-05T14:30:00Z.",
    "A long time ago in a galaxy far, far away....",
    "To be, or not to be, that is the question.",
    "Ask not what your country can do for you — ask what you can do for your country.",
    "The mitochondria is the powerhouse of the cell.",
    "rock'n'roll, ma'am, o'clock, y'all, 'tis, '90s, goin'",
]

EUROPEAN = [
    "Größere Übungen für Äpfel und Öl: Straße, Fußgänger, Maß.",
    "Ça va très bien, merci ! L'été à Noël, où est la crème brûlée ?",
    "¿Dónde está la biblioteca? ¡Mañana será otro día! Niño, acción, pingüino.",
    "Ærøskøbing og Smørrebrød på Østerbro; Åland.",
    "Zażółć gęślą jaźń. Źdźbło, łódź, świerszcz.",
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Árvíztűrő tükörfúrógép; İstanbul'da ığdır şehri; Ğğ Şş.",
    "Português: coração, ação, pão, avô, você.",
    "Ἐν ἀρχῇ ἦν ὁ λόγος (polytonic Greek), ΑΒΓΔ αβγδ ς σ Σ.",
    "Ελληνικά: Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "Русский: Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Українська: Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!",
    "Български: Жълтата дюля беше щастлива.",
    "Decomposed: e\u0301 a\u0300 o\u0308 n\u0303 (NFD) vs é à ö ñ (NFC).",
    "Ligatures ﬁ ﬂ ﬀ, long s ſ, Kelvin K, Ångström Å, micro µ vs μ.",
]

ASIAN_AND_OTHERS = [
    "العربية: مرحبا بالعالم! كيف حالك اليوم؟ ١٢٣٤٥٦٧٨٩٠",
    "עברית: שלום עולם, מה שלומך?",
    "हिन्दी: नमस्ते दुनिया! आप कैसे हैं? १२३४५",
    "বাংলা: আমার সোনার বাংলা, আমি তোমায় ভালোবাসি।",
    "தமிழ்: வணக்கம் உலகம்",
    "ไทย: สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "中文：你好，世界！今天天气很好。我们去公园散步吧。",
    "繁體中文：歡迎來到臺灣，請多指教。",
    "日本語：こんにちは世界。カタカナとひらがな、漢字が混ざっています。",
    "ｶﾀｶﾅ半角 と 全角ＡＢＣ１２３ の 混在。",
    "한국어: 안녕하세요 세계! 오늘 날씨가 좋네요.",
    "Tiếng Việt: Xin chào thế giới, tôi yêu tiếng Việt.",
    "ქართული: გამარჯობა მსოფლიო",
    "Հայերեն: Բարեւ աշխարհ",
    "አማርኛ: ሰላም ለዓለም",
    "Mixed: English中文日本語한국어العربيةРусский",
]

EMOJI = [
    "😀😃😄😁😆😅😂🤣",
    "👍👍🏻👍🏼👍🏽👍🏾👍🏿",
    "👨‍👩‍👧‍👦 family, 👩‍💻 technologist, 🏳️‍🌈 rainbow flag, 🏴‍☠️ pirate",
    "Flags: 🇺🇸🇬🇧🇩🇪🇫🇷🇯🇵🇨🇳🇮🇳🇧🇷",
    "Keycaps: 1️⃣ 2️⃣ #️⃣ *️⃣ and ❤️ vs ❤ (VS16)",
    "I ❤️ NY 🗽, pizza 🍕 & 🍺! 🚀🌕✨",
    "🧑🏽‍🤝‍🧑🏻 people holding hands, 👁️‍🗨️ eye in speech bubble",
    "Tag sequence flag: 🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland",
    "Math: ∑ᵢ xᵢ² ≤ ∞, ∀x∈ℝ: x≠0 ⇒ x²>0, √2 ≈ 1.414, π ≈ 3.14159",
    "Arrows and boxes: → ← ↑ ↓ ⇐ ⇒ ┌─┐ │ │ └─┘ ░▒▓█",
    "Currency: € £ ¥ ₹ ₽ ₩ ₿ ¢ $ 💰",
    "Punctuation: “curly quotes” ‘single’ – en dash — em dash … ellipsis «guillemets» ‹›",
    "More: ¡¿ 、。「」『』【】 ‽ ※ † ‡ • · ¶ § © ® ™ ° ± × ÷",
]

CODE = [
    "def fib(n: int) -> int:\treturn n if n < 2 else fib(n - 1) + fib(n - 2)",
    "    for i, x in enumerate(xs):  # four leading spaces",
    "        if x is None: continue  # eight leading spaces",
    "import numpy as np; a = np.zeros((3, 4), dtype=np.float32); print(a.shape)",
    "template <typename T> T max(T a, T b) { return a > b ? a : b; }",
    "std::vector<std::string> v{\"a\", \"b\"}; for (auto& s : v) std::cout << s << '\\n';",
    "int main(int argc, char** argv) { return argc > 1 ? atoi(argv[1]) : 0; }",
    "{\"name\": \"stoke\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"server\"], \"ok\": true, \"n\": null}",
    "[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello\"}]",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC LIMIT 10;",
    "git commit -m \"fix: off-by-one in BlockAllocator::Free()\" && git push origin HEAD:refs/for/main",
    "<div class=\"box\"><a href=\"/x?y=1&amp;z=2\">link</a></div>",
    "x+=1;y-=2;z*=3;w/=4;a%=5;b<<=1;c>>=2;d&=e|f^g;",
    "$ echo $HOME && ls -la ~/.cache | grep -v '^total' > /tmp/out.txt 2>&1",
    "regex: ^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@[a-z]+\\.[a-z]{2,}$",
    "path\\to\\windows\\file.txt and C:\\Program Files (x86)\\App",
]

SPECIAL_LOOKALIKES = [
    "<|im_start|>user\\nhello<|im_end|>",
    "<|im_start|>system You are helpful.<|im_end|><|im_start|>assistant",
    "<|endoftext|>",
    "text before<|endoftext|>text after",
    "[CLS] sentence one [SEP] sentence two [SEP]",
    "[MASK] is [PAD] and [UNK]",
    "<s> [INST] hello [/INST] </s>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>",
    "<|eot_id|><|eom_id|><|python_tag|>",
    "<repo_name>stoke<file_sep>main.cc<filename>x.py<gh_stars>100",
    "<issue_start><issue_comment><issue_closed><jupyter_start><jupyter_text><jupyter_code><jupyter_output>",
    "<|im_sta <|im_end <im_start> < |im_start| > <||> <|> |>",
    "[cls] [Sep] [ CLS ] [[CLS]] [CLS][SEP][MASK]",
    "<|im_start|><|im_start|><|im_end|><|im_end|>",
    "  <|im_start|>  spaced  <|im_end|>  ",
]

WHITESPACE = [
    "  two leading spaces",
    "   three leading spaces and three trailing   ",
    "\tleading tab",
    "tabs\tin\tthe\tmiddle\t\tand\t\t\tmore",
    "trailing tab\t",
    "carriage\rreturn",
    "windows\r line\r\r ending",
    "\r",
    " ",
    "    ",
    "\t \t \t",
    "multiple     spaces      between       words",
    "non\u00a0breaking\u00a0space and thin\u2009space and ideographic\u3000space",
    "zero\u200bwidth\u200cjoiners\u200dand\ufeffBOM and soft\u00adhyphen",
    "em\u2003space en\u2002space figure\u2007space narrow\u202fnbsp",
    "line\u2028separator and paragraph\u2029separator and NEL\u0085here",
    "controls: \x01\x02\x03 bell\x07 backspace\x08 vt\x0b ff\x0c esc\x1b del\x7f",
    "nul\x00byte",
    "",
]

NUMBERS = [
    "1234567890",
    "12345678901234567890123456789012345678901234567890",
    "3.14159265358979323846264338327950288419716939937510",
    "0000000000001",
    "1,000,000 and 1.000.000 and 1 000 000 and 1'000'000",
    "Phone: 555-0199, ZIP 90210-1234, ISBN 978-3-16-148410-0",
    "Unicode digits: ٠١٢٣٤٥٦٧٨٩ ۰۱۲۳ ०१२३४५६७८९ ০১২৩ ๐๑๒๓ １２３４５",
    "Other numbers: ² ³ ¹ ¼ ½ ¾ ⅓ ⅔ ⅛ Ⅰ Ⅱ Ⅲ Ⅳ Ⅻ ⅰ ⅱ ① ② ⑳ ⓵ 〇 〡 〢",
    "x1y2z3 abc123def 1a2b3c 99bottles 4x4 A1B2",
    "2024-12-31 23:59:59.999 +01:00",
    "-42 +42 ±42 42° 42% 42‰ #42 42nd 1st 2nd 3rd 4th",
    "1e10 1E-10 6.022e23 0.0001 .5 5. 0x7FFFFFFF",
]

# Where Unicode tables and case rules differ between implementations.
EDGE = [
    "new emoji 🥲 🫠 🫨 🩷 🪿 🫎 hi🫨there",
    "unassigned \U0001FAFF \U000E0080 x, private use \ue000\U000F0000, last plane \U0010FFFD",
    "Kelvin \u212a 'ſ 'S 'K, titlecase ǅ ǈ ᾈ, sharp s ẞß, dotted İ, dotless ı, final sigma ΟΔΟΣ",
    "combining x\u0345y e\u0301\u0301\u0301 a\u20dd q\u0327 Hangul jamo \u1100\u1161\u11a8 한",
    "fullwidth ＨＥＬＬＯ　ｗｏｒｌｄ！ circled ⓐⓑⓒ Ⓐ math 𝐀𝐁𝐂 𝟙𝟚𝟛 superscripts ᵃᵇᶜ",
]

SEPARATORS = [" ", " ", " ", "", "  ", "\t", " \t ", "   ", "\r", " - ", ", ", "; ", " | ", "\u3000", "\u00a0"]

POOLS = [ENGLISH, EUROPEAN, ASIAN_AND_OTHERS, EMOJI, CODE, SPECIAL_LOOKALIKES, WHITESPACE, NUMBERS, EDGE]


def words(rng: random.Random, pool: list[str]) -> str:
    """A random contiguous slice of words of one fragment (keeps scripts realistic)."""
    w = rng.choice(pool).split(" ")
    i = rng.randrange(len(w))
    j = min(len(w), i + rng.randint(1, 8))
    return " ".join(w[i:j])


def mutate(rng: random.Random, s: str) -> str:
    r = rng.random()
    if r < 0.08:
        return s.upper()
    if r < 0.16:
        return s.lower()
    if r < 0.22:
        return " " + s
    if r < 0.28:
        return s + " "
    if r < 0.32:
        return s.replace(" ", "  ")
    if r < 0.35:
        return s.replace(" ", "\t")
    return s


def make(lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for pool in POOLS:  # every fragment once, unchanged
        out.extend(pool)
    while len(out) < lines - 10:
        k = rng.choice([1, 1, 2, 2, 3, 4])
        parts = []
        for _ in range(k):
            pool = rng.choice(POOLS)
            parts.append(mutate(rng, words(rng, pool) if rng.random() < 0.6 else rng.choice(pool)))
        text = parts[0]
        for p in parts[1:]:
            text += rng.choice(SEPARATORS) + p
        out.append(text)
    # A few long lines (merges over long words, caches, long whitespace runs).
    for i in range(10):
        pool = POOLS[i % len(POOLS)]
        out.append(" ".join(rng.choice(pool) for _ in range(30 + 10 * i)))
    out[-1] = "x" * 300 + " " * 200 + "y" * 150 + "9" * 120
    for s in out:
        assert "\n" not in s, repr(s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).with_name("tokenizer_corpus.txt")))
    ap.add_argument("--lines", type=int, default=2400)
    ap.add_argument("--seed", type=int, default=20240613)
    a = ap.parse_args()
    lines = make(a.lines, a.seed)
    pathlib.Path(a.out).write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    print(f"wrote {len(lines)} lines to {a.out}")


if __name__ == "__main__":
    main()
