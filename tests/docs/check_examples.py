#!/usr/bin/env python3
"""Compiles every C++ example of the documentation against the public headers.

Each ```cpp block of the given Markdown files becomes a translation unit, compiled and linked
against libtessera with only include/ on the include path (so an example can use nothing but
the public API). The line before a block may hold a marker (an HTML comment, invisible when
the Markdown is rendered):

  (no marker)                  a whole program: compiled as it is (it defines main)
  <!-- compile: fragment -->   statements: the body of a function, after
                               #include <tessera/tessera.h> and namespace ts = tessera;
  <!-- compile: no (why) -->   not compiled (pseudo-code, shell transcripts)

Files given with --optional are checked when they exist (../shared/DESIGN.md, which lives
beside the repository, not in it); --syntax-only files (examples/) are compiled without
linking (the build links them). Exits non-zero when any example fails, printing the compiler's
messages with the Markdown file and line of the block.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

MARKER = re.compile(r"<!--\s*compile:\s*(fragment|no)\b.*-->")
PRELUDE = "#include <tessera/tessera.h>\nnamespace ts = tessera;\n"


def blocks(path):
    """(line, kind, code) for each ```cpp block; kind is 'program', 'fragment' or 'no'."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() in ("```cpp", "```c++"):
            start = i + 1
            m = MARKER.search(lines[i - 1]) if i > 0 else None
            kind = m.group(1) if m else "program"
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                raise SystemExit(f"{path}:{i + 1}: unterminated ```cpp block")
            out.append((start, kind, "\n".join(lines[start:j]) + "\n"))
            i = j
        i += 1
    return out


def translation_unit(path, line, kind, code):
    where = f'#line {line} "{path}"\n'
    if kind == "fragment":
        return PRELUDE + "void documentation_example() {\n" + where + code + "}\nint main() {}\n"
    return where + code


def compile_one(args, job):
    name, source, link = job
    cpp = os.path.join(args.out, name + ".cpp")
    with open(cpp, "w", encoding="utf-8") as f:
        f.write(source)
    cmd = [args.cxx, "-std=c++20", "-Wall", "-Wextra", "-Wno-unused-parameter", "-I", args.include, cpp]
    if link:
        lib = os.path.dirname(os.path.abspath(args.lib))
        cmd += ["-o", os.path.join(args.out, name), "-L", lib, "-Wl,-rpath," + lib, "-ltessera"] + args.link_flag
    else:
        cmd += ["-fsyntax-only"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return name, r.returncode, r.stdout + r.stderr


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cxx", required=True)
    p.add_argument("--include", required=True, help="the public headers' directory (include/)")
    p.add_argument("--lib", required=True, help="libtessera.so")
    p.add_argument("--link-flag", action="append", default=[],
                   help="a flag for linking (a sanitized library: clang links its runtime into the program only)")
    p.add_argument("--out", required=True, help="a scratch directory for the generated sources")
    p.add_argument("--root", default=".", help="the directory the globs are relative to")
    p.add_argument("--optional", action="append", default=[], help="a Markdown file checked when it exists")
    p.add_argument("--syntax-only", action="append", default=[], help="C++ files (globs) compiled without linking")
    p.add_argument("docs", nargs="*", help="Markdown files (globs)")
    args = p.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)  # a scratch directory: no stale examples
    os.makedirs(args.out)

    def expand(patterns):
        files = []
        for pat in patterns:
            found = sorted(glob.glob(os.path.join(args.root, pat), recursive=True))
            if not found:
                raise SystemExit(f"check_examples: nothing matches {pat}")
            files += found
        return files

    docs = expand(args.docs)
    for opt in args.optional:
        if os.path.exists(opt):
            docs.append(opt)
        else:
            print(f"check_examples: {opt} not found, not checked")
    jobs, skipped = [], 0
    for doc in docs:
        stem = re.sub(r"[^A-Za-z0-9]+", "_", os.path.relpath(doc, args.root)).strip("_")
        for line, kind, code in blocks(doc):
            if kind == "no":
                skipped += 1
                continue
            jobs.append((f"{stem}_{line}", translation_unit(os.path.abspath(doc), line, kind, code), True))
    for src in expand(args.syntax_only):
        stem = re.sub(r"[^A-Za-z0-9]+", "_", os.path.relpath(src, args.root)).strip("_")
        jobs.append((stem, f'#line 1 "{os.path.abspath(src)}"\n' + open(src, encoding="utf-8").read(), False))

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(lambda j: compile_one(args, j), jobs))
    failed = [r for r in results if r[1] != 0]
    for name, _, log in failed:
        print(f"---- {name}: does not compile ----\n{log}")
    for name, rc, _ in results:
        print(f"{'ok  ' if rc == 0 else 'FAIL'} {name}")
    print(f"check_examples: {len(results) - len(failed)} compiled, {len(failed)} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
