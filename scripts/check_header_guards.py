#!/usr/bin/env python3
"""Checks that every header's include guard is named after its path:
server/rpc/auth.h -> SOFTMAX_SERVER_RPC_AUTH_H_, kernels/cuda/flat.cuh ->
SOFTMAX_KERNELS_CUDA_FLAT_CUH_ (#ifndef, #define and the closing #endif's
comment). --fix renames the guards that do not match. Exit 1 when any does
not (ctest: lint.header_guards).

Usage: scripts/check_header_guards.py [--fix] [ROOT]
"""
import pathlib
import re
import sys

FOLDERS = ("client", "common", "kernels", "server")
GUARD = re.compile(r"^#ifndef (\w+)\n#define \1\n", re.M)


def expected(relative):
    stem, suffix = relative.rsplit(".", 1)
    return "SOFTMAX_" + re.sub(r"[^A-Z0-9]", "_", stem.upper()) + "_" + suffix.upper() + "_"


def main(argv):
    fix = "--fix" in argv
    args = [a for a in argv if a != "--fix"]
    root = pathlib.Path(args[0] if args else pathlib.Path(__file__).resolve().parent.parent)
    wrong = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".h", ".cuh") or "build" in path.relative_to(root).parts[:1]:
                continue
            relative = path.relative_to(root).as_posix()
            text = path.read_text()
            match = GUARD.search(text)
            want = expected(relative)
            if match is None:
                wrong.append(f"{relative}: no include guard (want {want})")
                continue
            have = match.group(1)
            if have == want and f"#endif  // {want}" in text:
                continue
            wrong.append(f"{relative}: guard {have}, want {want}")
            if fix:
                text = text.replace(have, want)
                if f"#endif  // {want}" not in text:
                    text = re.sub(r"#endif[^\n]*\n*\Z", f"#endif  // {want}\n", text)
                path.write_text(text)
    for line in wrong:
        print(line)
    if wrong and not fix:
        print(f"{len(wrong)} header(s) with a guard not named after the path; "
              "scripts/check_header_guards.py --fix renames them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
