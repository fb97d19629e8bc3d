#!/usr/bin/env python3
"""Prints the server-flags table of docs/server.md, generated from `softmax-server --help`.

Usage: scripts/flags_table.py BUILD/bin/softmax-server [--check docs/server.md]

The help text is the one description of each flag; docs/server.md carries
this table between the markers <!-- flags:begin --> and <!-- flags:end -->.
With --check, exits 1 (printing the difference) when the document's table is not
what the binary's help text gives: regenerate it with
    scripts/flags_table.py build/bin/softmax-server --write docs/server.md
"""
import argparse
import difflib
import re
import subprocess
import sys

BEGIN = "<!-- flags:begin -->"
END = "<!-- flags:end -->"


def flags_from_help(binary):
    text = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    # Entries look like "--name (help, wrapped over lines); default: value;"
    text = " ".join(text.split())
    return [(name, help_text, default)
            for name, help_text, default in re.findall(r" --(\w+) \((.*?)\); default: (.*?);", text)]


def table(flags):
    lines = ["| flag | default | meaning |", "|---|---|---|"]
    for name, help_text, default in flags:
        help_text = help_text.replace("|", "\\|")
        lines.append(f"| `--{name}` | `{default}` | {help_text} |")
    return "\n".join(lines)


def readme_table(readme):
    text = open(readme).read()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text, start, end, text[start:end].strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("--check", metavar="DOC")
    parser.add_argument("--write", metavar="DOC")
    args = parser.parse_args()
    flags = flags_from_help(args.binary)
    if not flags:
        sys.exit(f"no flags found in {args.binary} --help")
    generated = table(flags)
    if args.write:
        text, start, end, _ = readme_table(args.write)
        with open(args.write, "w") as out:
            out.write(text[:start] + "\n" + generated + "\n" + text[end:])
        return
    if args.check:
        current = readme_table(args.check)[3]
        if current != generated:
            sys.stdout.writelines(difflib.unified_diff(
                current.splitlines(True), generated.splitlines(True), args.check, "--help"))
            sys.exit(1)
        return
    print(generated)


if __name__ == "__main__":
    main()
