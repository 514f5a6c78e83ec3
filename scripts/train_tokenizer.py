#!/usr/bin/env python3
"""Trains a byte-level BPE tokenizer with Hugging Face `tokenizers`, as Llama 3 builds its own.

usage: train_tokenizer.py --vocab-size N --output DIR INPUT...

Writes DIR/tokenizer.json (Split on Llama 3's regex, then ByteLevel; merges over bytes, so
any text encodes) and DIR/tokenizer_config.json naming <|begin_of_text|> and <|end_of_text|> as
BOS and EOS. Inputs are read as UTF-8 text (invalid bytes replaced); a directory is read file
by file, skipping fortune's .dat index files.
"""
import argparse
import json
import os
import sys

try:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError:
    sys.exit(f"{sys.executable}: cannot import tokenizers; install it with "
             f"`{sys.executable} -m pip install tokenizers==0.23.3`")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def input_files(paths):
    for path in paths:
        if os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                full = os.path.join(path, name)
                if os.path.isfile(full) and not name.endswith((".dat", ".u8")):
                    yield full
        elif os.path.isfile(path):
            yield path
        else:
            sys.exit(f"train_tokenizer.py: no such file or directory: {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--output", required=True)
    p.add_argument("inputs", nargs="+")
    args = p.parse_args()
    if args.vocab_size < 256 + 2:
        p.error(f"--vocab-size {args.vocab_size} is below the 256 bytes plus BOS and EOS")
    texts = [open(f, "rb").read().decode("utf-8", "replace") for f in input_files(args.inputs)]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, special_tokens=[BOS, EOS],
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    os.makedirs(args.output, exist_ok=True)
    tok.save(os.path.join(args.output, "tokenizer.json"))
    with open(os.path.join(args.output, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "add_bos_token": True,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=1)
    print(f"train_tokenizer.py: {tok.get_vocab_size()} tokens from {len(texts)} files "
          f"({sum(map(len, texts)) / 1e6:.2f} M characters) -> {args.output}")


if __name__ == "__main__":
    main()
