#!/usr/bin/env python3
"""Deterministic multilingual corpus for tokenizer conformance tests and benchmarks.

Nothing is downloaded: the corpus is assembled from the seed snippets below (written for this
project) and from seeded random recombination and mutation of them, plus random draws from
Unicode script ranges. Same seed -> same corpus, byte for byte.

  python3 tools/tokenizer_corpus.py --lines 20000 --seed 1234 --out corpus.jsonl
writes one JSON string per line (texts may contain "\\r", tabs, and - for chunks - "\\n").
"""
import argparse
import json
import random
import unicodedata

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged that tokenizers are harder than they look.",
    "We'll see; they're sure you've done what I'd have done, and she'll agree.",
    "DON'T SHOUT: IT'S NOT THAT'S WHAT YOU'VE SAID, WE'LL KNOW I'M RIGHT.",
    "Mr. O'Neil paid $1,234.56 on 2024-03-15 at 09:30 (UTC+01:00) for 3.5kg of apples.",
    "Call +1 (555) 010-9999 or e-mail jane.doe+test@example.co.uk before 5 p.m.",
    "See https://example.org/path/to/page?query=a%20b&x=1#section-2 for details.",
    "Hello, world! How are you doing today?? Fine... thanks!!!",
    "   leading spaces, trailing spaces   ",
    "Tabs\tseparate\tcolumns\tin\tTSV\tfiles",
    "Windows line ending\r",
    "A sentence with multiple   internal    spaces and\ttabs\t\tmixed  in.",
    "The year 1999 ended; the year 2000 began with 123456789 reasons to celebrate.",
    "Pi is approximately 3.14159265358979323846264338327950288419716939937510.",
    "UPPERCASE lowercase MiXeD cAsE camelCase snake_case kebab-case PascalCase",
    "Quotes: \"double\", 'single', `backtick`, \u201ccurly\u201d, \u2018curly single\u2019.",
    "Dashes \u2013 en, \u2014 em, and the ellipsis\u2026 plus bullet \u2022 points.",
    "Math: x\u00b2 + y\u00b2 = z\u00b2, \u221a2 \u2248 1.414, \u2211 i = n(n+1)/2, \u03c0r\u00b2, 5 \u00d7 3 \u00f7 2 \u2264 10 \u2260 11.",
    "Currency: \u20ac100, \u00a350, \u00a51000, \u20b9500, \u20a9, \u20bf0.001",
    "I'm 'quoted' and he said 'yes' and 's alone and 're and 'LL",
]

CHINESE = [
    "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002",
    "\u4eba\u5de5\u667a\u80fd\u6b63\u5728\u6539\u53d8\u6211\u4eec\u7684\u751f\u6d3b\u548c\u5de5\u4f5c\u65b9\u5f0f\u3002",
    "\u5317\u4eac\u662f\u4e2d\u534e\u4eba\u6c11\u5171\u548c\u56fd\u7684\u9996\u90fd\uff0c\u4e5f\u662f\u5168\u56fd\u7684\u653f\u6cbb\u3001\u6587\u5316\u4e2d\u5fc3\u3002",
    "\u8fd9\u4e2a\u6a21\u578b\u6709\u4e00\u5343\u4e8c\u767e\u4ebf\u4e2a\u53c2\u6570\uff0c\u63a8\u7406\u901f\u5ea6\u5f88\u5feb\uff01",
    "\u4eba\u529b\u8d44\u6e90\u548c\u793e\u4f1a\u4fdd\u969c\u90e8\u53d1\u5e03\u4e86\u65b0\u7684\u653f\u7b56\u3002",
    "\u4ed6\u8bf4\uff1a\u201c\u6211\u4eec\u660e\u5929\u89c1\u3002\u201d\u7136\u540e\u5c31\u8d70\u4e86\u3002",
    "\u4ff1\u4e50\u90e8\u7684\u6210\u5458\u5168\u5fc3\u5168\u610f\u4e3a\u4eba\u6c11\u670d\u52a1\u3002",
    "\u7e41\u9ad4\u4e2d\u6587\u8207\u7b80\u4f53\u4e2d\u6587\u90fd\u5f88\u91cd\u8981\u3002",
]
JAPANESE = [
    "\u3053\u3093\u306b\u3061\u306f\u3001\u4e16\u754c\uff01\u4eca\u65e5\u306f\u3044\u3044\u5929\u6c17\u3067\u3059\u306d\u3002",
    "\u6771\u4eac\u90fd\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3042\u308b\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3002",
    "\u30c8\u30fc\u30af\u30ca\u30a4\u30b6\u30fc\u306e\u30c6\u30b9\u30c8\u3092\u66f8\u304d\u307e\u3057\u305f\u3002\uff8a\uff9d\uff76\uff78\uff76\uff80\uff76\uff85\u3082\u3002",
    "\u304c\u304e\u3050\u3052\u3054\u3000\u3071\u3074\u3077\u307a\u307d",
]
KOREAN = [
    "\uc548\ub155\ud558\uc138\uc694, \uc138\uacc4! \uc624\ub298 \ub0a0\uc528\uac00 \uc815\ub9d0 \uc88b\ub124\uc694.",
    "\ub300\ud55c\ubbfc\uad6d\uc758 \uc218\ub3c4\ub294 \uc11c\uc6b8\uc785\ub2c8\ub2e4.",
    "\ud55c\uae00\uc740 \uc138\uc885\ub300\uc655\uc774 \ub9cc\ub4e4\uc5c8\uc2b5\ub2c8\ub2e4.",
]
THAI = [
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e27\u0e31\u0e19\u0e19\u0e35\u0e49\u0e2d\u0e32\u0e01\u0e32\u0e28\u0e14\u0e35\u0e21\u0e32\u0e01",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e44\u0e21\u0e48\u0e21\u0e35\u0e0a\u0e48\u0e2d\u0e07\u0e27\u0e48\u0e32\u0e07\u0e23\u0e30\u0e2b\u0e27\u0e48\u0e32\u0e07\u0e04\u0e33",
    "\u0e01\u0e23\u0e38\u0e07\u0e40\u0e17\u0e1e\u0e21\u0e2b\u0e32\u0e19\u0e04\u0e23 \u0e2d\u0e21\u0e23\u0e23\u0e31\u0e15\u0e19\u0e42\u0e01\u0e2a\u0e34\u0e19\u0e17\u0e23\u0e4c",
]
HINDI = [
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e! \u0906\u091c \u092e\u094c\u0938\u092e \u092c\u0939\u0941\u0924 \u0905\u091a\u094d\u091b\u093e \u0939\u0948\u0964",
    "\u092d\u093e\u0930\u0924 \u0915\u0940 \u0930\u093e\u091c\u0927\u093e\u0928\u0940 \u0928\u0908 \u0926\u093f\u0932\u094d\u0932\u0940 \u0939\u0948\u0964 \u0967\u0968\u0969\u096a",
    "\u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f \u0936\u094d\u0930\u0940 \u0926\u094d\u0935\u093e\u0930 \u0939\u093f\u0928\u094d\u0926\u0940",
]
ARABIC = [
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645! \u0627\u0644\u0637\u0642\u0633 \u062c\u0645\u064a\u0644 \u0627\u0644\u064a\u0648\u0645.",
    "\u0627\u0644\u0644\u064f\u0651\u063a\u064e\u0629\u064f \u0627\u0644\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u064e\u0651\u0629\u064f \u062c\u064e\u0645\u0650\u064a\u0644\u064e\u0629\u064c \u0661\u0662\u0663\u0664",
    "\u0643\u062a\u0628 \u0627\u0644\u0637\u0627\u0644\u0628 \u0627\u0644\u062f\u0631\u0633\u060c \u062b\u0645 \u0630\u0647\u0628 \u0625\u0644\u0649 \u0627\u0644\u0645\u062f\u0631\u0633\u0629\u061f",
]
HEBREW = [
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd! \u05de\u05d6\u05d2 \u05d4\u05d0\u05d5\u05d5\u05d9\u05e8 \u05d9\u05e4\u05d4 \u05d4\u05d9\u05d5\u05dd.",
    "\u05d1\u05bc\u05b0\u05e8\u05b5\u05d0\u05e9\u05b4\u05c1\u05d9\u05ea \u05d1\u05bc\u05b8\u05e8\u05b8\u05d0 \u05d0\u05b1\u05dc\u05b9\u05d4\u05b4\u05d9\u05dd",
]
OTHER = [
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430? \u0401\u043b\u043a\u0430 \u0438 \u0439\u043e\u0433\u0443\u0440\u0442.",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u03ba\u03cc\u03c3\u03bc\u03b5! \u0391\u03b8\u03ae\u03bd\u03b1 \u03ba\u03b1\u03b9 \u0398\u03b5\u03c3\u03c3\u03b1\u03bb\u03bf\u03bd\u03af\u03ba\u03b7.",
    "Ti\u1ebfng Vi\u1ec7t c\u00f3 r\u1ea5t nhi\u1ec1u d\u1ea5u: \u0111\u01b0\u1eddng ph\u1ed1 H\u00e0 N\u1ed9i.",
    "Stra\u00dfe, \u00e4\u00f6\u00fc \u00c4\u00d6\u00dc, na\u00efve caf\u00e9 fa\u00e7ade r\u00e9sum\u00e9 co\u00f6perate",
    "\u0531\u0562\u0563\u0564 \u10d0\u10d1\u10d2\u10d3 \u1200\u1208\u1210 \u0d05\u0d06\u0d07 \u0b85\u0b86\u0b87 \u0c05\u0c06\u0c07 \u0985\u0986\u0987",
]
EMOJI = [
    "\U0001f600\U0001f603\U0001f604\U0001f601 \U0001f44d\U0001f3fb\U0001f44d\U0001f3fc\U0001f44d\U0001f3fd\U0001f44d\U0001f3fe\U0001f44d\U0001f3ff",
    "Family: \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 couple: \U0001f469\u200d\u2764\ufe0f\u200d\U0001f468",
    "\U0001f9d1\U0001f3fd\u200d\U0001f4bb coder, \U0001f469\U0001f3fe\u200d\U0001f52c scientist, \U0001f3f3\ufe0f\u200d\U0001f308 flag",
    "Flags: \U0001f1fa\U0001f1f8 \U0001f1ef\U0001f1f5 \U0001f1e9\U0001f1ea \U0001f1e8\U0001f1f3 keycap 1\ufe0f\u20e3 #\ufe0f\u20e3",
    "\u2764\ufe0f \u2728 \U0001f525\U0001f525\U0001f525 \U0001f680 to the moon \U0001f315",
    "\U0001f44b\U0001f3ff\U0001f9d1\u200d\U0001f91d\u200d\U0001f9d1 \U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
]
COMBINING = [
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030a ng\u0303",          # decomposed: NFC composes
    "e\u0301\u0301\u0301 a\u0323\u0302 o\u031b\u0301 x\u0301 q\u0307\u0323",  # stacked / uncomposable
    "Vie\u0323\u0302t Nam, Tie\u0302\u0301ng Vie\u0323\u0302t",
    "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af",             # conjoining jamo -> Hangul
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    "\u212b \u2126 \u212a \u0958 \u2000 \uf900 \u0344",                   # NFC singletons
    "1\u20e3 \u0301leading mark, mark after space \u0301, digit 5\u0301",
    "\u0915\u093f \u0915\u0940 \u0e01\u0e34\u0e4a \u05d1\u05bc \u064b\u064c",
]
CODE = [
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product",
    "std::vector<std::unique_ptr<Node>> nodes; auto it = std::find_if(nodes.begin(), nodes.end(), pred);",
    "const x = async () => { await fetch(`/api/v1/items?id=${id}`); };",
    "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!(\"{:?}\", v); }",
    "func (s *Server) Handle(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }",
    "SELECT id, name FROM users WHERE age >= 18 AND email LIKE '%@example.com' ORDER BY id DESC;",
    "{\"name\": \"sparkserve\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"serving\"], \"ok\": true, \"n\": null}",
    "<div class=\"container\"><p id='x'>Hello &amp; welcome</p><br/></div>",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done | sort -u > out.log 2>&1",
    "    if (x != nullptr && *x == '\\0') { return -1; } else if (y >>= 2) { y ^= 0xFF; }",
    "import numpy as np\narr = np.zeros((3, 4), dtype=np.float32)  # shape [3, 4]",
    "public static void main(String[] args) { System.out.println(\"Hello, World!\"); }",
    "x = [i**2 for i in range(100) if i % 3 == 0]; y = {k: v for k, v in d.items()}",
    "matrix[i][j] += alpha * A[i][k] * B[k][j];\t\t/* inner loop */",
    "<?php echo htmlspecialchars($_GET['q'] ?? ''); ?>",
]
SPECIALS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<|object_ref_start|>", "<|box_end|>", "<|audio_start|>", "<tts_pad>", "<|audio_pad|>",
]
NEAR_MISSES = [
    "<|im_start", "im_start|>", "<|IM_START|>", "<| im_start |>", "<|im_start||>", "<<|im_start|>>",
    "<think >", "< think>", "<Think>", "<THINK>", "</ think>", "<think", "think>", "<thinking>", "</thinker>",
    "<tool_call", "<tool call>", "<tool_calls>", "</tool_call >", "<|endoftext", "<|endoftext|",
    "<|im_end|", "|im_end|>", "<|im_end|>>", "<||>", "<|>", "<|", "|>", "<>", "</>",
]
WHITESPACE = [" ", "  ", "    ", "\t", "\t\t", " \t ", "\r", "\r\r", "\u00a0", "\u3000", "\u2002", "\u2003",
              "\u2009", "\u200b", "\u2028", "\u2029", "\u0085", "\u180e", "\u000b", "\u000c", "\u202f",
              "\u205f", "\ufeff", "\u1680"]
NUMBERS = ["0", "7", "42", "1000", "65536", "3.14", "-273.15", "1e-9", "6.022e23", "0xDEADBEEF",
           "1,000,000", "12345678901234567890", "\uff11\uff12\uff13", "\u0661\u0662\u0663",
           "\u0967\u0968\u0969", "\u2460\u2461\u2462", "\u00bd \u00be \u2153", "\u2167 \u216b", "\u00b2\u00b3\u00b9"]
ALL_TEXT = [ENGLISH, CHINESE, JAPANESE, KOREAN, THAI, HINDI, ARABIC, HEBREW, OTHER, EMOJI, COMBINING, CODE]

# Script ranges for random "soup" text (letters, marks, digits of many scripts).
RANGES = [
    (0x0020, 0x007E), (0x00A0, 0x024F), (0x0300, 0x036F), (0x0370, 0x03FF), (0x0400, 0x04FF),
    (0x0590, 0x05FF), (0x0600, 0x06FF), (0x0900, 0x097F), (0x0E00, 0x0E7F), (0x1100, 0x11FF),
    (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x20A0, 0x20CF), (0x2100, 0x214F), (0x2190, 0x22FF),
    (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1F6FF),
    (0x1F900, 0x1F9FF), (0x10000, 0x1007F), (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF),
]


def soup(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(RANGES)
        c = rng.randint(lo, hi)
        if 0xD800 <= c <= 0xDFFF or c in (0x0A,):
            c = 0x20
        out.append(chr(c))
    return "".join(out)


def mutate(rng, s):
    """Small random edits that create unusual but valid text."""
    k = rng.random()
    if k < 0.15:
        return s.upper()
    if k < 0.25:
        return s.lower()
    if k < 0.35:  # decompose (NFD): NFC must recompose
        return unicodedata.normalize("NFD", s)
    if k < 0.45:  # insert whitespace runs
        pos = rng.randint(0, len(s))
        return s[:pos] + rng.choice(WHITESPACE) * rng.randint(1, 4) + s[pos:]
    if k < 0.55:  # cut at a random code point
        a, b = sorted((rng.randint(0, len(s)), rng.randint(0, len(s))))
        return s[a:b] or s
    if k < 0.65:
        return s.replace(" ", rng.choice(["  ", "\t", "\u00a0", " \r", ""]))
    return s


def make_line(rng):
    kind = rng.random()
    if kind < 0.45:
        group = rng.choice(ALL_TEXT)
        parts = [mutate(rng, rng.choice(group)) for _ in range(rng.randint(1, 3))]
        return rng.choice([" ", "", "  ", "\t", " \u3000"]).join(parts)
    if kind < 0.55:  # mixed languages
        return " ".join(rng.choice(rng.choice(ALL_TEXT)) for _ in range(rng.randint(2, 5)))
    if kind < 0.63:  # special tokens and near misses inside text
        bits = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.35:
                bits.append(rng.choice(SPECIALS))
            elif r < 0.65:
                bits.append(rng.choice(NEAR_MISSES))
            else:
                bits.append(mutate(rng, rng.choice(rng.choice(ALL_TEXT))))
        return rng.choice(["", " ", "\t", "  "]).join(bits)
    if kind < 0.70:  # numbers
        return " ".join(rng.choice(NUMBERS) + rng.choice(["", " ", ",", ".", "%"]) for _ in range(rng.randint(1, 8)))
    if kind < 0.75:  # whitespace-heavy
        return "".join(rng.choice(WHITESPACE + ["a", "b", "\u4e2d", ".", "x1"]) for _ in range(rng.randint(1, 40)))
    if kind < 0.85:  # random soup
        return soup(rng, rng.randint(1, 60))
    if kind < 0.88:  # very long words
        r = rng.random()
        n = rng.randint(200, 4000)
        if r < 0.25:
            return rng.choice("abcxyz") * n
        if r < 0.5:
            return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
        if r < 0.7:
            return "".join(rng.choice("0123456789") for _ in range(n))
        if r < 0.85:
            return rng.choice(["\u4e2d", "\u0e01", "\U0001f600", "\u0301", "!"]) * (n // 4)
        return "https://example.com/" + "/".join("seg%d" % i for i in range(n // 10))
    if kind < 0.92:  # code with tabs / CRLF-like
        return rng.choice(CODE).replace("\n", rng.choice(["\r", " ", "\t"]))
    if kind < 0.96:  # contractions / apostrophes
        return " ".join(rng.choice(["'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'", "''",
                                    "it's", "IT'S", "we'd", "y'all", "rock'n'roll", "\u2019s", "'\u017f"])
                        for _ in range(rng.randint(1, 10)))
    return mutate(rng, rng.choice(SPECIALS + NEAR_MISSES) + rng.choice(WHITESPACE) + rng.choice(ENGLISH))


def make_corpus(n_lines, seed):
    rng = random.Random(seed)
    lines = []
    # Every seed snippet verbatim, once, then random lines.
    for group in ALL_TEXT:
        lines.extend(s.replace("\n", " ") for s in group)
    lines.extend(SPECIALS + NEAR_MISSES + WHITESPACE + NUMBERS)
    while len(lines) < n_lines:
        lines.append(make_line(rng).replace("\n", " "))
    return lines


def make_chunks(lines, n_chunks, seed):
    """Multi-line texts: paragraphs of corpus lines joined by newline variants."""
    rng = random.Random(seed + 1)
    chunks = []
    for _ in range(n_chunks):
        k = rng.randint(2, 20)
        sep = rng.choice(["\n", "\r\n", "\n\n", " \n", "\n\t", "\n\n\n"])
        chunks.append(sep.join(rng.choice(lines) for _ in range(k)) + rng.choice(["", "\n", "\r\n"]))
    # Whole seed code snippets keep their real newlines.
    chunks.extend(CODE)
    return chunks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=20000)
    ap.add_argument("--chunks", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", required=True)
    ap.add_argument("--plain", action="store_true", help="write raw text lines instead of JSON strings")
    a = ap.parse_args()
    lines = make_corpus(a.lines, a.seed)
    items = lines + make_chunks(lines, a.chunks, a.seed)
    with open(a.out, "w", encoding="utf-8", newline="") as f:
        for s in items:
            f.write((s if a.plain else json.dumps(s)) + "\n")


if __name__ == "__main__":
    main()
