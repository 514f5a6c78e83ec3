#!/usr/bin/env python3
"""Checks that every relative link in README.md and docs/*.md resolves.

    python3 scripts/check_links.py [ROOT]

A link resolves when its file or folder exists and, for a #anchor into a Markdown file (or
into the page itself), a heading of that file has the anchor as its slug under GitHub's rules:
the heading's text without its markup, lower-cased, every character that is not a letter,
digit, space, '-' or '_' dropped, spaces turned into '-', and the second and later headings
with the same slug suffixed -1, -2, ... Links to web addresses are not fetched: CI has no
network, and what they point at is not ours to keep. Links inside code spans and fenced
blocks are text, not links.

The guide moved out of one long README into docs/ pages that link to each other and into
bench/ and the source tree; a renamed heading or a moved file breaks such links silently,
which is what this catches, in seconds, as a CI stage beside format and layers.
"""
import pathlib
import re
import sys
import unicodedata

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); the target ends at whitespace (a title may follow) or ')'.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def heading_text(raw):
    """A heading's rendered text: code spans keep their content, links their text, and
    emphasis and inline HTML tags go."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"(\*\*|__|\*|~~)", "", text)


def slug(text):
    text = heading_text(text).strip().lower()
    kept = "".join(c for c in text
                   if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, result = {}, set()
        for _, line in prose_lines(path.read_text(encoding="utf-8")):
            m = HEADING.match(line)
            if not m:
                continue
            s = slug(m.group(2))
            k = seen.get(s, 0)
            seen[s] = k + 1
            result.add(s if k == 0 else f"{s}-{k}")
        # Explicit anchors: <a name="x"> or id="x".
        for m in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text(encoding="utf-8")):
            result.add(m.group(1))
        cache[path] = result
    return cache[path]


def check_page(root, page):
    errors = []
    for n, line in prose_lines(page.read_text(encoding="utf-8")):
        for m in LINK.finditer(CODE_SPAN.sub(lambda s: " " * len(s.group(0)), line)):
            target = m.group(1)
            if EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            where = f"{page.relative_to(root)}:{n}: {target}"
            dest = page if not file_part else (page.parent / file_part).resolve()
            if not dest.exists():
                errors.append(f"{where}: {file_part} does not exist")
                continue
            if root not in dest.parents and dest != root:
                errors.append(f"{where}: points outside the repository")
                continue
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                errors.append(f"{where}: {dest.relative_to(root)} has no heading with the slug "
                              f"'{anchor}'")
    return errors


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    pages = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    errors = [e for page in pages if page.exists() for e in check_page(root, page)]
    for e in errors:
        print(f"check_links: {e}", file=sys.stderr)
    if errors:
        return 1
    print(f"check_links: every relative link in {len(pages)} pages resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
