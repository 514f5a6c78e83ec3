#!/usr/bin/env python3
"""Reference data for the C++ tokenizer's differential test (tests/data/test_tokenizer.cpp).

    python3 tests/data/tokenizer_reference.py OUT_DIR [--repo REPO_ROOT]

Needs Python's `tokenizers` (pip install tokenizers==0.23.3) and Debian's `fortunes`
(/usr/share/games/fortunes, ~2.5 MB of text written by people). Writes:

  OUT_DIR/<name>/tokenizer.json, tokenizer_config.json   tokenizers trained here on the fortunes
  OUT_DIR/docs.bin        the test documents: per document u8 category, u32 length, raw bytes
  OUT_DIR/<name>/ids.bin  per document: u32 count, u32 ids, from tokenizers'
                          encode(doc.decode("utf-8", "replace"), add_special_tokens=False)
  OUT_DIR/summary.json    document and byte counts per category

With --list-inputs it prints the files it would read and exits.

Tokenizers (all byte-level BPE, as GPT-2, Llama 3 and Qwen2 ship):
  gpt2         ByteLevel pre-tokenizer with GPT-2's regex, merges as ["a", "b"] pairs,
               special <|endoftext|>, added (non-special, normalized) "<|sep|>" and " Fortune"
  gpt2_prefix  the same with add_prefix_space=true and merges as "a b" strings
  gpt2_unk     gpt2 without the byte tokens 0x80..0x9f (and every token and merge holding one),
               with unk_token <unk> and fuse_unk: those bytes become <unk>, runs of them one
  gpt2_shuffled  gpt2 with its merges in a random order (ranks unlike any trainer's), which
               tells `tokenizers`' merge loop from GPT-2's "merge every best pair" loop
  llama3       Sequence[Split(Llama 3's regex, Isolated), ByteLevel(use_regex=false)],
               ignore_merges=true, specials <|begin_of_text|>, <|end_of_text|>, <|reserved_0|>,
               <|reserved_01|> (a longer token sharing a prefix), added "<|res"
  qwen2        Qwen2's: normalizer NFC, Sequence[Split(Qwen2's regex: single digits), ByteLevel],
               special <|endoftext|>, <|im_start|>; added "cafe\u0301" (normalized: matched as
               its NFC form "café") and "n\u0303o" (not normalized: matched only decomposed)

Invalid UTF-8: documents are raw bytes; C++ encodes the bytes, `tokenizers` the same bytes
decoded with errors="replace" (the rule our encode() applies itself), so the invalid-UTF-8
category tests that rule and the tokenizer together.
"""
import argparse
import glob
import json
import os
import random
import struct
import unicodedata
import sys

try:
    import tokenizers
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, trainers)
except ImportError:
    sys.exit(f"{sys.executable}: cannot import tokenizers; install it with "
             f"`{sys.executable} -m pip install tokenizers==0.23.3`")

FORTUNES = "/usr/share/games/fortunes"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CATEGORIES = ["fortunes", "code", "digits", "whitespace", "emoji", "cjk", "scripts",
              "contractions", "special", "invalid_utf8", "random_unicode", "mixed", "unnormalized"]


def fortune_files():
    files = sorted(f for f in glob.glob(os.path.join(FORTUNES, "*"))
                   if not f.endswith((".dat", ".u8")) and os.path.isfile(f))
    if not files:
        sys.exit(f"no fortunes in {FORTUNES}; install them with `apt-get install fortunes`")
    return files


def fortune_texts():
    return [open(f, "rb").read() for f in fortune_files()]


def code_files(repo):
    code = []
    for pattern in ("src/**/*.cpp", "src/**/*.h", "include/**/*.h", "tools/**/*.cpp", "tests/**/*.py",
                    "scripts/*.sh", "bench/*.sh", "models/**/*.cpp"):
        code += glob.glob(os.path.join(repo, pattern), recursive=True)
    return sorted(set(code))


def train(texts, name):
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=(name == "gpt2"))
    if name == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = bl
        specials = ["<|endoftext|>"]
        vocab = 6000
    elif name == "qwen2":
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False), bl])
        specials = ["<|endoftext|>", "<|im_start|>"]
        vocab = 7000
    else:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False), bl])
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_0|>", "<|reserved_01|>"]
        vocab = 8000
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([t.decode("utf-8", "replace") for t in texts], trainer=trainer)
    if name == "gpt2":
        tok.add_tokens([AddedToken("<|sep|>", normalized=True), AddedToken(" Fortune", normalized=True)])
    elif name == "qwen2":
        tok.add_tokens([AddedToken("cafe\u0301", normalized=True),
                        AddedToken("n\u0303o", normalized=False)])
    else:
        tok.add_tokens([AddedToken("<|res", normalized=True)])
    return tok


def write_tokenizer(out_dir, name, tok_json, config):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok_json, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


def byte_chars():
    """GPT-2's bytes_to_unicode: byte -> the character that stands for it."""
    table, n = {}, 0
    for b in range(256):
        if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


def rand_unicode(rng, n, ranges):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(ranges)
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0xFFFD
        out.append(chr(cp))
    return "".join(out)


def synthetic(rng):
    """Yields (category, bytes) documents that stress the regex and BPE corners."""
    ws = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   \n", " \t ", "\u00a0", "\u3000", "\u2003",
          "\u2028", "\u0085", "\u200b", "\u180e", "\u1680", "\u202f", "\u205f", "\ufeff", "\x0b",
          "\x0c", "\r", "\u2029", "\u2000", "\u200a"]
    words = ["the", "The", "THE", "fortune", "cookie", "naïve", "café", "Straße", "über", "x",
             "don't", "I'm", "we've", "they'll", "she'd", "it's", "O'Neil", "rock'n'roll"]
    emoji = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇯🇵", "🤖", "☃", "✨", "🧑🏿‍💻", "🫠", "#️⃣"]
    cjk_ranges = [(0x4E00, 0x9FFF), (0x3040, 0x30FF), (0xAC00, 0xD7A3), (0x3400, 0x4DBF),
                  (0xFF01, 0xFF5E), (0x3000, 0x303F), (0x20000, 0x2A6DF)]
    script_ranges = [(0x0600, 0x06FF), (0x0590, 0x05FF), (0x0900, 0x097F), (0x0400, 0x04FF),
                     (0x0370, 0x03FF), (0x0E00, 0x0E7F), (0x0300, 0x036F), (0x1E00, 0x1EFF),
                     (0x10A0, 0x10FF), (0x0530, 0x058F), (0x1D400, 0x1D7FF)]
    all_ranges = [(0x20, 0x7E), (0xA0, 0x2FF), (0x300, 0x1FFF), (0x2000, 0x2BFF),
                  (0x2C00, 0xFFFD), (0x10000, 0x1FFFF), (0x20000, 0x3FFFF), (0xE0000, 0x10FFFF)]
    for i in range(400):
        parts = []
        for _ in range(rng.randint(20, 200)):
            r = rng.random()
            if r < 0.3:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 25))))
            elif r < 0.5:
                parts.append(f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 9)}f}")
            elif r < 0.6:
                parts.append(f"{rng.randint(0, 9999999):,}")
            elif r < 0.7:
                parts.append("٣٤٥١٢" if rng.random() < 0.5 else "１２３４５６")  # non-ASCII digits
            else:
                parts.append(rng.choice([" ", "", "-", "+", "x", "e", ".", ",", "\n", "v"]))
        yield "digits", "".join(parts).encode()
    for i in range(400):
        parts = []
        for _ in range(rng.randint(10, 120)):
            parts.append(rng.choice(ws) * rng.randint(1, 12) if rng.random() < 0.5 else rng.choice(words))
        yield "whitespace", "".join(parts).encode()
    yield "whitespace", (" " * 5000 + "x" + "\t" * 3000 + "\n" * 2000 + "  y  ").encode()
    for i in range(300):
        parts = [rng.choice(emoji + words + [" ", "  ", "\n", "!", "?!"]) for _ in range(rng.randint(10, 100))]
        yield "emoji", "".join(parts).encode()
    for i in range(300):
        parts = [rand_unicode(rng, rng.randint(1, 30), cjk_ranges) + rng.choice(["", " ", "。", "、", "\n", "ABC", "123"])
                 for _ in range(rng.randint(5, 40))]
        yield "cjk", "".join(parts).encode()
    for i in range(300):
        parts = [rand_unicode(rng, rng.randint(1, 15), script_ranges) + rng.choice(ws + ["", "", "."])
                 for _ in range(rng.randint(5, 40))]
        yield "scripts", "".join(parts).encode()
    contractions = ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'rE", "'ve", "'VE", "'m", "'M", "'ll",
                    "'LL", "'lL", "'d", "'D", "'ſ", "'K", "'K", "’s", "'x", "''", "'", "'re'", "'lls"]
    for i in range(300):
        parts = []
        for _ in range(rng.randint(10, 80)):
            parts.append(rng.choice(words + ["", " ", "I", "WE", "1", "ß"]) + rng.choice(contractions)
                         + rng.choice(["", " ", "s", "\n", "5", "é"]))
        yield "contractions", "".join(parts).encode()
    specials = ["<|endoftext|>", "<|sep|>", " Fortune", "Fortune", "<|begin_of_text|>",
                "<|end_of_text|>", "<|reserved_0|>", "<|reserved_01|>", "<|res", "<|reserved_0",
                "<|endoftext", "<|", "|>", "<", ">"]
    for i in range(300):
        parts = [rng.choice(specials + words + [" ", "\n", "  ", "x"]) for _ in range(rng.randint(5, 60))]
        yield "special", "".join(parts).encode()
    bad = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xed\xa0\x80",
           b"\xed\xbf\xbf", b"\xf0\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf0\x9f\x98",
           b"\xf0\x9f", b"\xe2\x82", b"\xc3", b"\xe2\x28\xa1", b"\xf8\x88\x80\x80\x80", b"\x00", b"\x01\x7f"]
    for i in range(400):
        parts = []
        for _ in range(rng.randint(5, 60)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(bad))
            elif r < 0.6:
                parts.append(bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 8))))
            else:
                parts.append(rng.choice(words + emoji + [" ", "\n", "é"]).encode())
        doc = b"".join(parts)
        if rng.random() < 0.3:
            doc = doc[:-1]  # cut a trailing multi-byte character
        yield "invalid_utf8", doc
    for i in range(300):
        yield "random_unicode", rand_unicode(rng, rng.randint(10, 400), all_ranges).encode()
    yield from unnormalized(rng, words)


def unnormalized(rng, words):
    """Text that NFC changes: decomposed accents and Hangul, combining marks out of canonical
    order, singletons (the Angstrom and Ohm signs), composition exclusions, mixed with the same
    text already composed and with the qwen2 file's added tokens in both forms."""
    accented = ["café", "naïve", "Ångström", "São Paulo", "Việt Nam", "Nguyễn", "Straße", "über",
                "façade", "résumé", "Ελληνικά", "ἀρχή", "Привет", "йод", "한국어", "가나다", "ﬁne",
                "\u212b", "\u2126", "\u0958", "\u2adc", "\u1e9b\u0323", "cafe\u0301", "n\u0303o",
                "ño", "no"]
    marks = ["\u0300", "\u0301", "\u0302", "\u0303", "\u0308", "\u0323", "\u0327", "\u031b",
             "\u0345", "\u05b4", "\u0e49", "\u3099", "\u1161", "\u11a8"]
    bases = ["a", "e", "o", "u", "A", "O", "\u03b1", "\u0438", "\u304b", "\u1100", "\uac00", " ", "1"]
    for i in range(300):
        parts = []
        for _ in range(rng.randint(10, 80)):
            r = rng.random()
            if r < 0.4:
                w = rng.choice(accented)
                parts.append(unicodedata.normalize(rng.choice(["NFD", "NFC", "NFKD"]), w)
                             if rng.random() < 0.7 else w)
            elif r < 0.7:
                parts.append(rng.choice(bases) + "".join(rng.choice(marks)
                                                         for _ in range(rng.randint(1, 4))))
            else:
                parts.append(rng.choice(words + [" ", "\n", ", ", "'s "]))
        yield "unnormalized", "".join(parts).encode()


def build_docs(repo, rng):
    docs = []
    for text in fortune_texts():
        for piece in text.split(b"\n%\n"):
            docs.append(("fortunes", piece))
    for path in code_files(repo):
        docs.append(("code", open(path, "rb").read()))
    docs += list(synthetic(rng))
    # Mixed: concatenations of random slices of everything above.
    pool = [d for _, d in docs]
    for i in range(300):
        docs.append(("mixed", b"".join(rng.choice(pool)[:rng.randint(0, 300)] for _ in range(rng.randint(2, 8)))))
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--list-inputs", action="store_true",
                    help="print every file this run reads (the fortunes, the repo's code), one a "
                         "line, and exit: the test's result cache keys the run by their bytes")
    args = ap.parse_args()
    if args.list_inputs:
        print("\n".join(fortune_files() + code_files(args.repo)))
        return
    os.makedirs(args.out_dir, exist_ok=True)
    rng = random.Random(20240520)
    texts = fortune_texts()

    gpt2 = train(texts, "gpt2")
    g = json.loads(gpt2.to_str())
    tok = {"gpt2": write_tokenizer(args.out_dir, "gpt2", g, {"bos_token": "<|endoftext|>",
                                                              "eos_token": "<|endoftext|>"})}
    gp = json.loads(gpt2.to_str())
    gp["pre_tokenizer"]["add_prefix_space"] = True
    gp["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in gp["model"]["merges"]]
    tok["gpt2_prefix"] = write_tokenizer(args.out_dir, "gpt2_prefix", gp, {"eos_token": "<|endoftext|>"})
    table = byte_chars()
    dropped = {table[b] for b in range(0x80, 0xA0)}
    gu = json.loads(gpt2.to_str())
    gu["model"]["vocab"] = {k: v for k, v in gu["model"]["vocab"].items() if not set(k) & dropped}
    gu["model"]["merges"] = [m for m in gu["model"]["merges"] if not set(m[0] + m[1]) & dropped]
    # Dense ids again (tokenizers numbers added tokens from the vocabulary's size on).
    kept = sorted(gu["model"]["vocab"].items(), key=lambda kv: kv[1])
    gu["model"]["vocab"] = {k: i for i, (k, _) in enumerate(kept)}
    gu["model"]["vocab"]["<unk>"] = len(kept)
    next_id = len(kept) + 1
    for a in gu["added_tokens"]:
        if a["content"] in gu["model"]["vocab"]:
            a["id"] = gu["model"]["vocab"][a["content"]]
        else:
            a["id"], next_id = next_id, next_id + 1
    gu["model"]["unk_token"] = "<unk>"
    gu["model"]["fuse_unk"] = True
    tok["gpt2_unk"] = write_tokenizer(args.out_dir, "gpt2_unk", gu, {"eos_token": "<|endoftext|>"})
    gs = json.loads(gpt2.to_str())
    random.Random(7).shuffle(gs["model"]["merges"])
    tok["gpt2_shuffled"] = write_tokenizer(args.out_dir, "gpt2_shuffled", gs, {"eos_token": "<|endoftext|>"})
    llama = train(texts, "llama3")
    tok["llama3"] = write_tokenizer(args.out_dir, "llama3", json.loads(llama.to_str()),
                                    {"bos_token": {"content": "<|begin_of_text|>"},
                                     "eos_token": "<|end_of_text|>"})

    qwen = train(texts, "qwen2")
    tok["qwen2"] = write_tokenizer(args.out_dir, "qwen2", json.loads(qwen.to_str()),
                                   {"eos_token": "<|endoftext|>"})

    docs = build_docs(args.repo, rng)
    with open(os.path.join(args.out_dir, "docs.bin"), "wb") as f:
        for cat, d in docs:
            f.write(struct.pack("<BI", CATEGORIES.index(cat), len(d)))
            f.write(d)
    strings = [d.decode("utf-8", "replace") for _, d in docs]
    for name, t in tok.items():
        encs = t.encode_batch(strings, add_special_tokens=False)
        with open(os.path.join(args.out_dir, name, "ids.bin"), "wb") as f:
            for e in encs:
                f.write(struct.pack("<I", len(e.ids)))
                f.write(struct.pack(f"<{len(e.ids)}I", *e.ids))
    summary = {"tokenizers_version": tokenizers.__version__, "documents": len(docs),
               "bytes": sum(len(d) for _, d in docs), "categories": {}}
    for cat, d in docs:
        c = summary["categories"].setdefault(cat, {"documents": 0, "bytes": 0})
        c["documents"] += 1
        c["bytes"] += len(d)
    with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
